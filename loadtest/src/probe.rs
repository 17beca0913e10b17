//! The server's own view of the work still in flight, for the
//! cancellation storm's pass/fail line: `/metrics` (Prometheus, the
//! `num_requests_running`/`num_requests_waiting` gauges that Synor and vLLM
//! export) when the server has it, else Synor's `/health` statistics.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Requests the server still reports as running or waiting.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    pub running: f64,
    pub waiting: f64,
}

/// The pass/fail line of a cancellation storm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancellationCheck {
    pub passed: bool,
    pub running: f64,
    pub waiting: f64,
    pub source: String,
    pub waited_ms: u64,
}

/// Sums the running/waiting gauges of a Prometheus text page.
pub fn parse_metrics(text: &str) -> Option<InFlight> {
    let mut found = false;
    let mut out = InFlight {
        running: 0.0,
        waiting: 0.0,
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let base = name.split('{').next().unwrap_or(name);
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        if base.ends_with(":num_requests_running") {
            out.running += v;
            found = true;
        } else if base.ends_with(":num_requests_waiting") {
            out.waiting += v;
            found = true;
        }
    }
    found.then_some(out)
}

/// Sums `running`/`waiting` over the models of Synor's `/health` JSON.
pub fn parse_health(v: &Value) -> Option<InFlight> {
    let models = v["models"].as_array()?;
    let sum = |k: &str| models.iter().filter_map(|m| m[k].as_f64()).sum();
    Some(InFlight {
        running: sum("running"),
        waiting: sum("waiting"),
    })
}

async fn in_flight(client: &reqwest::Client, base: &str) -> Option<(InFlight, &'static str)> {
    let base = base.trim_end_matches('/');
    if let Ok(r) = client.get(format!("{base}/metrics")).send().await
        && r.status().is_success()
        && let Some(f) = parse_metrics(&r.text().await.unwrap_or_default())
    {
        return Some((f, "/metrics"));
    }
    let r = client.get(format!("{base}/health")).send().await.ok()?;
    let v: Value = r.json().await.ok()?;
    parse_health(&v).map(|f| (f, "/health"))
}

/// Polls until the server reports nothing running or waiting, for at most
/// `grace`. `None` when the server exposes neither source.
pub async fn check_drained(base: &str, grace: Duration) -> Option<CancellationCheck> {
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        let (f, source) = in_flight(&client, base).await?;
        let drained = f.running == 0.0 && f.waiting == 0.0;
        if drained || start.elapsed() >= grace {
            return Some(CancellationCheck {
                passed: drained,
                running: f.running,
                waiting: f.waiting,
                source: source.into(),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_summed_over_models() {
        let text = "# HELP synor:num_requests_running running\n\
                    synor:num_requests_running{model_name=\"a\"} 2\n\
                    synor:num_requests_running{model_name=\"b\"} 1\n\
                    vllm:num_requests_waiting{model_name=\"a\"} 4\n\
                    other_metric 9\n";
        assert_eq!(
            parse_metrics(text),
            Some(InFlight {
                running: 3.0,
                waiting: 4.0
            })
        );
        assert_eq!(parse_metrics("up 1\n"), None);
        let health =
            serde_json::json!({"models": [{"running": 1, "waiting": 0}, {"kind": "embedding"}]});
        assert_eq!(
            parse_health(&health),
            Some(InFlight {
                running: 1.0,
                waiting: 0.0
            })
        );
    }
}
