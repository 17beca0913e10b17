//! `synor providers earnings` and `synor providers payout`: a provider's
//! own view of its money, over the server's HTTP API with one of its
//! worker tokens (a provider has no database of its own to read). Amounts
//! are units, as the API gives them.

use anyhow::{Context, bail};

use crate::config::ProviderLink;
use worker::status::{self, Earnings};

/// Prints the provider's earnings, its work and its workers.
pub async fn earnings(link: &ProviderLink) -> anyhow::Result<()> {
    let base = status::http_base(&link.server)?;
    let e = status::fetch(&reqwest::Client::new(), &base, link.token.expose()).await?;
    print!("{}", report(&e));
    Ok(())
}

/// The earnings as a short table for a terminal.
fn report(e: &Earnings) -> String {
    let workers = if e.workers.is_empty() {
        "none connected".to_string()
    } else {
        e.workers
            .iter()
            .map(|w| format!("{} ({})", w.name, w.state))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "provider      {} ({})\n\
         balance       {}\n\
         payable       {} (synor providers payout --amount ...)\n\
         pending       {} (final once the earnings window has passed)\n\
         earned today  {}\n\
         jobs          {} done, {} lost\n\
         spot checks   {} passed, {} failed\n\
         reputation    {:.2}x\n\
         workers       {workers}\n",
        e.provider_id,
        e.name,
        e.balance,
        e.payable,
        e.pending,
        e.earned_today,
        e.jobs_ok,
        e.jobs_lost,
        e.checks.passed,
        e.checks.failed,
        e.reputation_bps as f64 / 10_000.0,
    )
}

/// Pays out `amount` units of the provider's payable funds.
pub async fn payout(link: &ProviderLink, amount: &str, memo: &str) -> anyhow::Result<()> {
    money::ledger::amount::parse_units(amount).map_err(anyhow::Error::msg)?;
    let url = format!("{}/v1/providers/payouts", status::http_base(&link.server)?);
    let r = reqwest::Client::new()
        .post(&url)
        .bearer_auth(link.token.expose())
        .json(&serde_json::json!({"amount": amount, "memo": memo}))
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = r.status();
    let body: serde_json::Value = r.json().await.context("reading the answer")?;
    if !status.is_success() {
        let why = body["error"]["message"]
            .as_str()
            .unwrap_or("no reason given");
        bail!("the payout was refused ({status}): {why}");
    }
    println!(
        "paid out {amount}: transaction {}; balance now {}",
        body["transaction"].as_str().unwrap_or("?"),
        body["account"]["balance"].as_str().unwrap_or("?")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_every_figure_in_units() {
        let e: Earnings = serde_json::from_value(serde_json::json!({
            "provider_id": "provider:p", "name": "alice", "balance": "0.0042",
            "pending": "0.0012", "payable": "0.0030", "earned_today": "0.0012",
            "reputation_bps": 9500, "jobs_ok": 7, "jobs_lost": 0,
            "checks": {"checked": 2, "passed": 2, "failed": 0},
            "workers": [{"name": "w1", "state": "active"}], "totals": []
        }))
        .expect("an earnings answer");
        let r = report(&e);
        for part in [
            "provider:p (alice)",
            "payable       0.0030",
            "earned today  0.0012",
            "7 done, 0 lost",
            "2 passed, 0 failed",
            "0.95x",
            "w1 (active)",
        ] {
            assert!(r.contains(part), "{part}: {r}");
        }
    }
}
