//! What a provider sees of its work: a line in the worker's terminal every
//! interval (jobs, tokens a second, spot checks, earnings today in units)
//! from the server's `GET /v1/providers/earnings` (with the worker's own
//! token) and the worker's engines; and that same earnings answer for
//! `synor providers earnings`. The server's numbers are the ones that pay:
//! the worker's own counts only give the speed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;
use tokio::sync::watch;

use engine::registry::{ModelKind, ModelRegistry};

/// A provider's spot checks, as the server counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Checks {
    pub checked: u64,
    pub passed: u64,
    pub failed: u64,
}

/// The part of the server's earnings answer a provider reads (amounts
/// are decimal strings of currency units).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Earnings {
    pub provider_id: String,
    pub name: String,
    pub balance: String,
    pub pending: String,
    pub payable: String,
    pub earned_today: String,
    pub reputation_bps: i64,
    pub jobs_ok: u64,
    pub jobs_lost: u64,
    pub checks: Checks,
    /// Its workers connected to the server.
    #[serde(default)]
    pub workers: Vec<WorkerSeen>,
}

/// One connected worker of the provider.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WorkerSeen {
    pub name: String,
    pub state: String,
}

/// The server's HTTP address for a `--server` gateway address:
/// `ws://host:port[/path]` gives `http://host:port` (`wss` gives `https`).
pub fn http_base(server: &str) -> anyhow::Result<String> {
    let (scheme, rest) = if let Some(r) = server.strip_prefix("ws://") {
        ("http", r)
    } else if let Some(r) = server.strip_prefix("wss://") {
        ("https", r)
    } else if let Some(r) = server.strip_prefix("http://") {
        ("http", r)
    } else if let Some(r) = server.strip_prefix("https://") {
        ("https", r)
    } else {
        bail!("the server is a ws://, wss:// or http(s):// address (got `{server}`)");
    };
    let host = rest.split('/').next().unwrap_or(rest);
    if host.is_empty() {
        bail!("the server address `{server}` has no host");
    }
    Ok(format!("{scheme}://{host}"))
}

/// The provider's earnings, read with its worker token.
pub async fn fetch(client: &reqwest::Client, base: &str, token: &str) -> anyhow::Result<Earnings> {
    let url = format!("{base}/v1/providers/earnings");
    let r = client
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = r.status();
    let body = r.text().await.context("reading the earnings")?;
    if !status.is_success() {
        let why = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(body);
        bail!("{url} answered {status}: {why}");
    }
    serde_json::from_str(&body)
        .with_context(|| format!("{url} sent an answer this build cannot read"))
}

/// One status line: `tokens` generated over `elapsed`, with what the
/// server counts for the provider.
pub fn line(e: &Earnings, tokens: u64, elapsed: Duration) -> String {
    let rate = tokens as f64 / elapsed.as_secs_f64().max(1e-3);
    format!(
        "{} jobs done ({} lost) · {rate:.1} tok/s over the last {} s · spot checks {} passed, \
         {} failed · earned today {} · payable {} (pending {}) · reputation {:.2}x",
        e.jobs_ok,
        e.jobs_lost,
        elapsed.as_secs(),
        e.checks.passed,
        e.checks.failed,
        e.earned_today,
        e.payable,
        e.pending,
        e.reputation_bps as f64 / 10_000.0
    )
}

/// Tokens the worker's text engines generated so far.
fn generated(models: &ModelRegistry) -> u64 {
    models
        .list()
        .iter()
        .map(|m| match &m.kind {
            ModelKind::Text(h) => h.stats().generated_tokens,
            ModelKind::Embedding(_) => 0,
        })
        .sum()
}

/// Logs a status line every `every` until `stop` changes; a server that
/// cannot be asked gives a line that says so (the worker's own speed
/// still shows).
pub async fn report(
    base: String,
    token: String,
    models: std::sync::Arc<ModelRegistry>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let (mut last_at, mut last_tokens) = (Instant::now(), generated(&models));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let (now, tokens) = (Instant::now(), generated(&models));
        let (made, elapsed) = (tokens - last_tokens.min(tokens), now - last_at);
        (last_at, last_tokens) = (now, tokens);
        match fetch(&client, &base, &token).await {
            Ok(e) => tracing::info!("status: {}", line(&e, made, elapsed)),
            Err(err) => {
                let rate = made as f64 / elapsed.as_secs_f64().max(1e-3);
                tracing::info!("status: {rate:.1} tok/s; earnings unavailable: {err:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_address_comes_from_the_gateway_address() {
        let ok = |s: &str| http_base(s).expect(s);
        assert_eq!(ok("ws://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(ok("ws://h:1/v1/providers/connect"), "http://h:1");
        assert_eq!(ok("wss://example.org/"), "https://example.org");
        assert_eq!(ok("http://h:2"), "http://h:2");
        assert!(http_base("ftp://h").is_err());
        assert!(http_base("ws://").is_err());
    }

    #[test]
    fn a_status_line_says_jobs_speed_checks_and_earnings_in_units() {
        let e = Earnings {
            provider_id: "provider:x".into(),
            name: "x".into(),
            balance: "0.0042".into(),
            pending: "0.0012".into(),
            payable: "0.0030".into(),
            earned_today: "0.0012".into(),
            reputation_bps: 10_000,
            jobs_ok: 12,
            jobs_lost: 1,
            checks: Checks {
                checked: 3,
                passed: 3,
                failed: 0,
            },
            workers: Vec::new(),
        };
        let l = line(&e, 300, Duration::from_secs(30));
        for part in [
            "12 jobs done (1 lost)",
            "10.0 tok/s over the last 30 s",
            "3 passed, 0 failed",
            "earned today 0.0012",
            "payable 0.0030 (pending 0.0012)",
            "reputation 1.00x",
        ] {
            assert!(l.contains(part), "{part}: {l}");
        }
    }
}
