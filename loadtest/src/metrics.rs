//! Aggregates over a run, with vLLM's definitions: request and token
//! throughput over the benchmark's duration, peak concurrency, and for
//! TTFT, TPOT, ITL and E2E latency the mean, median, standard deviation
//! and chosen percentiles (numpy's linear interpolation), over successful
//! requests only; goodput counts the requests that meet every SLO. The
//! answered requests (successful or cancelled) are also counted by their
//! `x-synor-cache` header: cache hits (by kind), misses, bypasses and
//! responses without the header, with the hit rate.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::client::{Outcome, RequestResult};

/// Summary of one metric, in milliseconds (or seconds for Retry-After).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    /// `"p50"` → value.
    pub percentiles: BTreeMap<String, f64>,
}

/// Service-level objectives for goodput, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl Slo {
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2el_ms.is_some()
    }

    fn met_by(&self, r: &RequestResult) -> bool {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        self.ttft_ms.is_none_or(|s| ms(r.ttft) <= s)
            && self
                .tpot_ms
                .is_none_or(|s| r.tpot().is_none_or(|t| ms(t) <= s))
            && self.e2el_ms.is_none_or(|s| ms(r.e2e) <= s)
    }
}

/// One request's outcome and when it was sent (from the start of the run).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub sent_at: Duration,
    pub outcome: Outcome,
}

/// Answered requests by their `x-synor-cache` header.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Responses the server's cache answered.
    pub hits: usize,
    /// Hits by the header's value (Synor sends `exact` or `semantic`).
    pub hits_by_tier: BTreeMap<String, usize>,
    pub misses: usize,
    /// Responses the cache was skipped for (`bypass`).
    pub bypassed: usize,
    /// Responses without the header (a server with no response cache).
    pub absent: usize,
    /// Hits over the responses that carried the header; `None` if none did.
    pub hit_rate: Option<f64>,
}

impl CacheStats {
    /// Counts header values (`None`: no header): `miss`, `bypass`, and
    /// anything else is a hit of that kind.
    pub fn count<'a>(values: impl IntoIterator<Item = Option<&'a str>>) -> Self {
        let mut s = Self::default();
        for v in values {
            let v = v.map(|v| v.trim().to_ascii_lowercase()).unwrap_or_default();
            match v.as_str() {
                "" => s.absent += 1,
                "miss" => s.misses += 1,
                "bypass" => s.bypassed += 1,
                _ => {
                    s.hits += 1;
                    *s.hits_by_tier.entry(v).or_default() += 1;
                }
            }
        }
        let reported = s.hits + s.misses + s.bypassed;
        s.hit_rate = (reported > 0).then(|| s.hits as f64 / reported as f64);
        s
    }

    /// Responses counted (with or without the header).
    pub fn responses(&self) -> usize {
        self.hits + self.misses + self.bypassed + self.absent
    }
}

/// The cache outcomes of the answered (successful or cancelled) requests.
fn cache_stats(records: &[Record]) -> CacheStats {
    CacheStats::count(records.iter().filter_map(|r| match &r.outcome {
        Outcome::Success(x) | Outcome::Cancelled(x) => Some(x.cache.as_deref()),
        Outcome::Rejected { .. } | Outcome::Failed(_) => None,
    }))
}

/// Everything the summary block and the JSON result report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aggregates {
    pub completed: usize,
    pub failed: usize,
    /// 429/503 answers (load shed), not failures.
    pub rejected: usize,
    pub cancelled: usize,
    pub duration_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub cached_input_tokens: u64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    /// Most output tokens in any one-second window.
    pub peak_output_throughput: f64,
    pub peak_concurrency: usize,
    pub goodput: Option<f64>,
    pub ttft_ms: Option<Summary>,
    pub tpot_ms: Option<Summary>,
    pub itl_ms: Option<Summary>,
    pub e2el_ms: Option<Summary>,
    pub retry_after_s: Option<Summary>,
    /// Absent from result files written before it was counted.
    #[serde(default)]
    pub cache: CacheStats,
    /// The first few distinct failure messages.
    pub errors: Vec<String>,
}

/// Aggregates `records` over a run of `duration`.
pub fn aggregate(
    records: &[Record],
    duration: Duration,
    peak_concurrency: usize,
    percentiles: &[f64],
    slo: Slo,
) -> Aggregates {
    let ok: Vec<&RequestResult> = records
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Success(x) => Some(x),
            Outcome::Rejected { .. } | Outcome::Failed(_) | Outcome::Cancelled(_) => None,
        })
        .collect();
    let count = |f: fn(&Outcome) -> bool| records.iter().filter(|r| f(&r.outcome)).count();
    let secs = duration.as_secs_f64().max(1e-9);
    let input: u64 = ok.iter().map(|r| r.prompt_tokens).sum();
    let output: u64 = ok.iter().map(|r| r.output_tokens).sum();
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let ttft: Vec<f64> = ok.iter().map(|r| ms(&r.ttft)).collect();
    let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot()).map(|d| ms(&d)).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().map(ms)).collect();
    let e2el: Vec<f64> = ok.iter().map(|r| ms(&r.e2e)).collect();
    let retry: Vec<f64> = records
        .iter()
        .filter_map(|r| match r.outcome {
            Outcome::Rejected { retry_after, .. } => retry_after,
            Outcome::Success(_) | Outcome::Failed(_) | Outcome::Cancelled(_) => None,
        })
        .collect();
    let mut errors: Vec<String> = Vec::new();
    for r in records {
        if let Outcome::Failed(e) = &r.outcome
            && errors.len() < 5
            && !errors.contains(e)
        {
            errors.push(e.clone());
        }
    }
    Aggregates {
        completed: ok.len(),
        failed: count(|o| matches!(o, Outcome::Failed(_))),
        rejected: count(|o| matches!(o, Outcome::Rejected { .. })),
        cancelled: count(|o| matches!(o, Outcome::Cancelled(_))),
        duration_s: secs,
        total_input_tokens: input,
        total_output_tokens: output,
        cached_input_tokens: ok.iter().map(|r| r.cached_tokens).sum(),
        request_throughput: ok.len() as f64 / secs,
        output_throughput: output as f64 / secs,
        total_token_throughput: (input + output) as f64 / secs,
        peak_output_throughput: peak_per_second(records),
        peak_concurrency,
        goodput: slo
            .is_set()
            .then(|| ok.iter().filter(|r| slo.met_by(r)).count() as f64 / secs),
        ttft_ms: summarize(&ttft, percentiles),
        tpot_ms: summarize(&tpot, percentiles),
        itl_ms: summarize(&itl, percentiles),
        e2el_ms: summarize(&e2el, percentiles),
        retry_after_s: summarize(&retry, percentiles),
        cache: cache_stats(records),
        errors,
    }
}

/// Output tokens per one-second bucket of the run (each content chunk
/// carries its request's share of the tokens).
pub fn tokens_per_second(records: &[Record]) -> Vec<f64> {
    let mut buckets: Vec<f64> = Vec::new();
    for r in records {
        let Outcome::Success(x) = &r.outcome else {
            continue;
        };
        if x.chunk_times.is_empty() {
            continue;
        }
        let per_chunk = x.output_tokens as f64 / x.chunk_times.len() as f64;
        for t in &x.chunk_times {
            let b = (r.sent_at + *t).as_secs() as usize;
            if buckets.len() <= b {
                buckets.resize(b + 1, 0.0);
            }
            buckets[b] += per_chunk;
        }
    }
    buckets
}

fn peak_per_second(records: &[Record]) -> f64 {
    tokens_per_second(records).into_iter().fold(0.0, f64::max)
}

/// Mean, median, std and percentiles of `xs`; `None` when empty.
pub fn summarize(xs: &[f64], percentiles: &[f64]) -> Option<Summary> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    Some(Summary {
        mean,
        median: percentile(&v, 50.0),
        std,
        percentiles: percentiles
            .iter()
            .map(|&p| (format!("p{p}"), percentile(&v, p)))
            .collect(),
    })
}

/// The `p`th percentile of sorted `xs`, interpolating linearly (numpy).
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0).clamp(0.0, 1.0) * (xs.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    xs[lo] + (xs[hi] - xs[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ttft_ms: u64, e2e_ms: u64, tokens: u64, sent_ms: u64) -> Record {
        let d = Duration::from_millis;
        Record {
            sent_at: d(sent_ms),
            outcome: Outcome::Success(RequestResult {
                ttft: d(ttft_ms),
                e2e: d(e2e_ms),
                itl: vec![d(10); tokens.saturating_sub(1) as usize],
                chunk_times: (0..tokens).map(|i| d(ttft_ms + 10 * i)).collect(),
                output_tokens: tokens,
                prompt_tokens: 100,
                usage_reported: true,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&xs, 50.0), 2.5);
        assert_eq!(percentile(&xs, 0.0), 1.0);
        assert_eq!(percentile(&xs, 100.0), 4.0);
        assert!((percentile(&xs, 90.0) - 3.7).abs() < 1e-12);
        let s = summarize(&[10.0, 30.0], &[99.0]).expect("non-empty");
        assert_eq!((s.mean, s.std), (20.0, 10.0));
        assert!(summarize(&[], &[50.0]).is_none());
    }

    #[test]
    fn aggregates_count_outcomes_apart_and_use_successes_only() {
        let records = vec![
            ok(100, 1100, 11, 0),
            ok(300, 800, 6, 0),
            Record {
                sent_at: Duration::ZERO,
                outcome: Outcome::Rejected {
                    status: 429,
                    retry_after: Some(2.0),
                },
            },
            Record {
                sent_at: Duration::ZERO,
                outcome: Outcome::Failed("boom".into()),
            },
            Record {
                sent_at: Duration::ZERO,
                outcome: Outcome::Cancelled(RequestResult::default()),
            },
        ];
        let slo = Slo {
            ttft_ms: Some(200.0),
            ..Default::default()
        };
        let a = aggregate(&records, Duration::from_secs(2), 4, &[50.0, 99.0], slo);
        assert_eq!(
            (a.completed, a.rejected, a.failed, a.cancelled),
            (2, 1, 1, 1)
        );
        assert_eq!(a.total_output_tokens, 17);
        assert_eq!(a.total_input_tokens, 200);
        assert!((a.output_throughput - 8.5).abs() < 1e-9);
        assert!((a.request_throughput - 1.0).abs() < 1e-9);
        assert_eq!(a.goodput, Some(0.5));
        // TPOT: (1100 - 100) / 10 = 100 ms and (800 - 300) / 5 = 100 ms.
        let tpot = a.tpot_ms.expect("tpot");
        assert!((tpot.mean - 100.0).abs() < 1e-6);
        assert_eq!(a.ttft_ms.expect("ttft").median, 200.0);
        assert_eq!(a.retry_after_s.expect("retry").mean, 2.0);
        assert_eq!(a.errors, vec!["boom".to_string()]);
        assert_eq!(a.peak_concurrency, 4);
    }

    fn answered(cache: Option<&str>, cancelled: bool) -> Record {
        let x = RequestResult {
            cache: cache.map(str::to_string),
            ..Default::default()
        };
        Record {
            sent_at: Duration::ZERO,
            outcome: if cancelled {
                Outcome::Cancelled(x)
            } else {
                Outcome::Success(x)
            },
        }
    }

    #[test]
    fn cache_hits_are_counted_by_tier_and_rated_over_reported_responses() {
        let records = vec![
            answered(Some("l2"), false),
            answered(Some("exact"), false),
            answered(Some("L2"), true),
            answered(Some("miss"), false),
            answered(Some("bypass"), false),
            answered(None, false),
            Record {
                sent_at: Duration::ZERO,
                outcome: Outcome::Failed("boom".into()),
            },
        ];
        let c = aggregate(&records, Duration::from_secs(1), 1, &[50.0], Slo::default()).cache;
        assert_eq!((c.hits, c.misses, c.bypassed, c.absent), (3, 1, 1, 1));
        let tiers: Vec<(&str, usize)> = c
            .hits_by_tier
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(tiers, vec![("exact", 1), ("l2", 2)]);
        // Three hits of five responses that carried the header.
        assert_eq!(c.hit_rate, Some(0.6));
        assert_eq!(c.responses(), 6);
    }

    #[test]
    fn the_hit_rate_is_unknown_without_any_cache_header() {
        let c = CacheStats::count([None, None]);
        assert_eq!((c.absent, c.hit_rate), (2, None));
        assert_eq!(CacheStats::count([Some("bypass")]).hit_rate, Some(0.0));
        assert_eq!(CacheStats::count([]).hit_rate, None);
    }

    #[test]
    fn throughput_over_time_buckets_chunks_by_second() {
        let records = vec![ok(900, 1000, 11, 0), ok(100, 200, 1, 1500)];
        let b = tokens_per_second(&records);
        // First request: chunks every 10 ms from 0.90 s to 1.00 s (ten in
        // second 0, one in second 1); second request: one chunk at 1.6 s.
        assert_eq!(b, vec![10.0, 2.0]);
    }
}
