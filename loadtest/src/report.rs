//! The console summary block (vLLM's layout, with both names where the
//! industry disagrees) and the JSON result file.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::client::Outcome;
use crate::metrics::{Aggregates, Record, Summary};
use crate::probe::CancellationCheck;

/// How the run was set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    pub base_url: String,
    pub model: String,
    pub endpoint: String,
    pub dataset: String,
    pub num_prompts: usize,
    pub request_rate: String,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub command: String,
}

/// One request's timings (with `--save-detailed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Detail {
    pub sent_at_ms: f64,
    pub status: String,
    pub ttft_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
    pub itl_ms: Vec<f64>,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub error: Option<String>,
}

/// Everything a result file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub run: RunInfo,
    pub aggregates: Aggregates,
    pub cancellation_check: Option<CancellationCheck>,
    /// Output tokens in each second of the run.
    pub output_tokens_per_second: Vec<f64>,
    pub details: Option<Vec<Detail>>,
}

impl BenchResult {
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a synor-loadtest result", path.display()))
    }
}

/// Per-request details for the result file.
pub fn details(records: &[Record]) -> Vec<Detail> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    records
        .iter()
        .map(|r| {
            let (status, res, error) = match &r.outcome {
                Outcome::Success(x) => ("ok", Some(x), None),
                Outcome::Cancelled(x) => ("cancelled", Some(x), None),
                Outcome::Rejected { status, .. } => {
                    ("rejected", None, Some(format!("HTTP {status}")))
                }
                Outcome::Failed(e) => ("failed", None, Some(e.clone())),
            };
            Detail {
                sent_at_ms: ms(r.sent_at),
                status: status.into(),
                ttft_ms: res.map(|x| ms(x.ttft)),
                e2el_ms: res.map(|x| ms(x.e2e)),
                itl_ms: res
                    .map(|x| x.itl.iter().map(|d| ms(*d)).collect())
                    .unwrap_or_default(),
                prompt_tokens: res.map_or(0, |x| x.prompt_tokens),
                output_tokens: res.map_or(0, |x| x.output_tokens),
                error,
            }
        })
        .collect()
}

/// The console summary.
pub fn render(r: &BenchResult) -> String {
    let a = &r.aggregates;
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("{k:<40}{v:>12}\n"));
    line("Successful requests:", a.completed.to_string());
    line("Failed requests:", a.failed.to_string());
    line("Rejected requests (429/503):", a.rejected.to_string());
    if a.cancelled > 0 {
        line("Cancelled by the client:", a.cancelled.to_string());
    }
    if let Some(c) = r.run.max_concurrency {
        line("Maximum request concurrency:", c.to_string());
    }
    line("Peak concurrent requests:", a.peak_concurrency.to_string());
    line("Benchmark duration (s):", format!("{:.2}", a.duration_s));
    line("Total input tokens:", a.total_input_tokens.to_string());
    line("Cached input tokens:", a.cached_input_tokens.to_string());
    line("Total generated tokens:", a.total_output_tokens.to_string());
    line(
        "Request throughput (req/s):",
        format!("{:.2}", a.request_throughput),
    );
    if let Some(g) = a.goodput {
        line("Request goodput (req/s):", format!("{g:.2}"));
    }
    line(
        "Output token throughput (tok/s):",
        format!("{:.2}", a.output_throughput),
    );
    line(
        "Peak output token throughput (tok/s):",
        format!("{:.2}", a.peak_output_throughput),
    );
    line(
        "Total token throughput (tok/s):",
        format!("{:.2}", a.total_token_throughput),
    );
    let mut out = format!("{:=^52}\n{s}", " Serving Benchmark Result ");
    let sections = [
        ("Time to First Token", "TTFT", &a.ttft_ms),
        (
            "Time per Output Token (excl. 1st token)",
            "TPOT (NVIDIA: ITL)",
            &a.tpot_ms,
        ),
        ("Inter-token Latency", "ITL (gap between chunks)", &a.itl_ms),
        ("End-to-end Latency", "E2EL", &a.e2el_ms),
    ];
    for (title, short, summary) in sections {
        out.push_str(&section(title, short, "ms", summary.as_ref()));
    }
    if a.rejected > 0 {
        out.push_str(&section(
            "Retry-After of rejected requests",
            "Retry-After",
            "s",
            a.retry_after_s.as_ref(),
        ));
    }
    for e in &a.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    if let Some(c) = &r.cancellation_check {
        let verdict = if c.passed { "PASS" } else { "FAIL" };
        out.push_str(&format!(
            "Cancellation check: {verdict} ({} running, {} waiting per {} after {} ms)\n",
            c.running, c.waiting, c.source, c.waited_ms
        ));
    }
    out.push_str(&"=".repeat(52));
    out.push('\n');
    out
}

fn section(title: &str, short: &str, unit: &str, s: Option<&Summary>) -> String {
    let mut out = format!("{:-^52}\n", format!(" {title} "));
    let Some(s) = s else {
        out.push_str(&format!("{:<40}{:>12}\n", format!("{short}:"), "n/a"));
        return out;
    };
    let mut row = |k: String, v: f64| out.push_str(&format!("{k:<40}{v:>12.2}\n"));
    row(format!("Mean {short} ({unit}):"), s.mean);
    row(format!("Median {short} ({unit}):"), s.median);
    row(format!("Std {short} ({unit}):"), s.std);
    for (p, v) in sorted_percentiles(s) {
        row(format!("P{p} {short} ({unit}):"), v);
    }
    out
}

/// Percentiles in numeric order (the map sorts "p100" before "p50").
pub fn sorted_percentiles(s: &Summary) -> Vec<(String, f64)> {
    let mut v: Vec<(f64, String, f64)> = s
        .percentiles
        .iter()
        .map(|(k, &v)| {
            (
                k.trim_start_matches('p').parse().unwrap_or(0.0),
                k.trim_start_matches('p').to_string(),
                v,
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v.into_iter().map(|(_, k, v)| (k, v)).collect()
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_from_unix(secs)
}

/// Formats Unix seconds as a UTC timestamp (civil-from-days, H. Hinnant).
pub fn utc_from_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_seconds_format_as_utc_dates() {
        assert_eq!(utc_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_from_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_from_unix(1_795_316_108), "2026-11-22T02:55:08Z");
    }
}
