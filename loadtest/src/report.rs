//! The console summary block (vLLM's layout, with both names where the
//! industry disagrees, plus the response cache's hit rate and a warning
//! when cached answers are in the numbers) and the JSON result file.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::client::{CacheMode, Outcome};
use crate::metrics::{Aggregates, CacheStats, Record, Summary};
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
    /// `--cache` (absent from result files written before it existed).
    #[serde(default)]
    pub cache: Option<CacheMode>,
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
    /// The response's `x-synor-cache` header.
    #[serde(default)]
    pub cache: Option<String>,
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
                cache: res.and_then(|x| x.cache.clone()),
                error,
            }
        })
        .collect()
}

/// The counts and throughputs at the top of the summary.
fn headline(r: &BenchResult) -> String {
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
    line("Cache hits:", cache_hits(&a.cache));
    line("Cache outcomes (x-synor-cache):", cache_outcomes(&a.cache));
    s
}

/// The hit count and rate, or why there is no rate.
pub fn cache_hits(c: &CacheStats) -> String {
    match c.hit_rate {
        Some(rate) => format!("{} ({:.1}%)", c.hits, rate * 100.0),
        None if c.responses() == 0 => "n/a".into(),
        None => "n/a (no x-synor-cache header)".into(),
    }
}

/// The non-zero counts, e.g. `exact 20, semantic 4, miss 1`.
pub fn cache_outcomes(c: &CacheStats) -> String {
    let mut parts: Vec<String> = c
        .hits_by_tier
        .iter()
        .map(|(tier, n)| format!("{tier} {n}"))
        .collect();
    for (name, n) in [
        ("miss", c.misses),
        ("bypass", c.bypassed),
        ("no header", c.absent),
    ] {
        if n > 0 {
            parts.push(format!("{name} {n}"));
        }
    }
    if parts.is_empty() {
        return "none".into();
    }
    parts.join(", ")
}

/// A warning, one `WARNING:` line after another, when any response came
/// from the cache; empty otherwise.
pub fn cache_warning(c: &CacheStats, mode: Option<CacheMode>) -> String {
    if c.hits == 0 {
        return String::new();
    }
    let advice = match mode {
        Some(CacheMode::Bypass) => {
            "the server ignored `x-synor-cache: bypass`, which every request sent"
        }
        Some(CacheMode::Allow) | None => {
            "run with `--cache bypass` (the default) to measure generation"
        }
    };
    format!(
        "WARNING: {} of {} responses came from the response cache ({}):\n\
         WARNING: throughput and latencies include cached answers;\n\
         WARNING: {advice}.\n",
        c.hits,
        c.responses(),
        cache_outcomes(c),
    )
}

/// The console summary.
pub fn render(r: &BenchResult) -> String {
    let a = &r.aggregates;
    // Cached answers in the numbers: said first and last, where it is seen.
    let warning = cache_warning(&a.cache, r.run.cache);
    let mut out = format!("{:=^52}\n{warning}", " Serving Benchmark Result ");
    out.push_str(&headline(r));
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
    out.push_str(&warning);
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
    use std::time::Duration;

    use super::*;
    use crate::client::RequestResult;
    use crate::metrics::{Slo, aggregate};

    fn result(caches: &[Option<&str>], mode: Option<CacheMode>) -> BenchResult {
        let records: Vec<Record> = caches
            .iter()
            .map(|c| Record {
                sent_at: Duration::ZERO,
                outcome: Outcome::Success(RequestResult {
                    e2e: Duration::from_millis(1),
                    output_tokens: 8,
                    cache: c.map(str::to_string),
                    ..Default::default()
                }),
            })
            .collect();
        let d = Duration::from_millis(12);
        BenchResult {
            run: RunInfo {
                date: utc_from_unix(0),
                base_url: "http://127.0.0.1:8080".into(),
                model: "m".into(),
                endpoint: "chat".into(),
                dataset: "Random".into(),
                num_prompts: records.len(),
                request_rate: "inf".into(),
                burstiness: 1.0,
                max_concurrency: None,
                seed: 0,
                cache: mode,
                command: "synor-loadtest".into(),
            },
            aggregates: aggregate(&records, d, 1, &[50.0], Slo::default()),
            cancellation_check: None,
            output_tokens_per_second: Vec::new(),
            details: Some(details(&records)),
        }
    }

    #[test]
    fn the_json_result_carries_the_cache_counts_and_hit_rate() {
        let r = result(
            &[Some("l2"), Some("l2"), Some("miss"), None],
            Some(CacheMode::Allow),
        );
        let v = serde_json::to_value(&r).expect("serializable");
        let c = &v["aggregates"]["cache"];
        assert_eq!(c["hits"], 2);
        assert_eq!(c["hits_by_tier"]["l2"], 2);
        assert_eq!(
            (c["misses"].clone(), c["bypassed"].clone()),
            (1.into(), 0.into())
        );
        assert_eq!(c["absent"], 1);
        assert!((c["hit_rate"].as_f64().unwrap_or(0.0) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(v["run"]["cache"], "allow");
        assert_eq!(v["details"][0]["cache"], "l2");
        assert!(v["details"][3]["cache"].is_null());
        let back: BenchResult = serde_json::from_value(v).expect("round trip");
        assert_eq!(back, r);
    }

    #[test]
    fn result_files_from_before_the_cache_counts_still_read() {
        let mut v = serde_json::to_value(result(&[Some("miss")], None)).expect("serializable");
        for (parent, key) in [("aggregates", "cache"), ("run", "cache")] {
            v[parent].as_object_mut().map(|o| o.remove(key));
        }
        let old: BenchResult = serde_json::from_value(v).expect("an old result file");
        assert_eq!((old.aggregates.cache.hit_rate, old.run.cache), (None, None));
    }

    #[test]
    fn a_summary_with_cache_hits_warns_that_throughput_includes_them() {
        let text = render(&result(
            &[Some("exact"), Some("exact"), Some("semantic")],
            None,
        ));
        assert!(text.contains("Cache hits:"), "{text}");
        assert!(text.contains("3 (100.0%)"), "{text}");
        assert!(text.contains("exact 2, semantic 1"), "{text}");
        assert!(text.contains("WARNING: 3 of 3 responses came from the response cache"));
        assert!(text.contains("include cached answers"));
        assert!(text.contains("--cache bypass"));
        let ignored = render(&result(&[Some("exact")], Some(CacheMode::Bypass)));
        assert!(ignored.contains("the server ignored `x-synor-cache: bypass`"));
    }

    #[test]
    fn a_summary_without_cache_hits_has_a_hit_line_and_no_warning() {
        let bypassed = render(&result(
            &[Some("bypass"), Some("bypass")],
            Some(CacheMode::Bypass),
        ));
        assert!(!bypassed.contains("WARNING"), "{bypassed}");
        let line = bypassed.lines().find(|l| l.starts_with("Cache hits:"));
        assert!(line.is_some_and(|l| l.ends_with("0 (0.0%)")), "{bypassed}");
        assert!(bypassed.contains("bypass 2"));
        let other = render(&result(&[None], Some(CacheMode::Bypass)));
        assert!(other.contains("n/a (no x-synor-cache header)"), "{other}");
        assert!(!other.contains("WARNING"));
    }

    #[test]
    fn unix_seconds_format_as_utc_dates() {
        assert_eq!(utc_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_from_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_from_unix(1_795_316_108), "2026-11-22T02:55:08Z");
    }
}
