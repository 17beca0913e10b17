//! Request latency distributions and request counters, recorded by the
//! engine core as requests run (time to first token, the gap between
//! token-emitting steps, end-to-end time, time queued before the first
//! step) and read by the API's metrics. Times start when a handle submits
//! the request. Lock-free: one writer (the core), any number of readers.
//! Bucket bounds follow vLLM's, so dashboards built for it carry over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::request::FinishReason;

/// Bucket upper bounds (seconds) for time to first token.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Bucket upper bounds (seconds) for inter-token latency.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Bucket upper bounds (seconds) for whole-request times.
pub const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A histogram with fixed bucket bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last one is `+Inf`.
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

/// A copy of a histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub bounds: &'static [f64],
    /// Per bucket (not cumulative), `bounds.len() + 1` of them.
    pub counts: Vec<u64>,
    pub sum_seconds: f64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.partition_point(|&b| b < s);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds,
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// The recorded latencies and counters of one engine.
#[derive(Debug)]
pub struct LatencyCell {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    /// Finished requests by reason: stop, length, abort.
    finished: [AtomicU64; 3],
}

impl Default for LatencyCell {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            finished: Default::default(),
        }
    }
}

/// A copy of an engine's latency distributions and request counters.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyStats {
    pub ttft: HistogramSnapshot,
    pub itl: HistogramSnapshot,
    pub e2e: HistogramSnapshot,
    pub queue: HistogramSnapshot,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// (finish reason, finished requests).
    pub finished: Vec<(&'static str, u64)>,
}

const REASONS: [FinishReason; 3] = [
    FinishReason::Stop,
    FinishReason::Length,
    FinishReason::Abort,
];

impl LatencyCell {
    /// A request that ended: its reason and token counts.
    pub fn record_finish(&self, reason: FinishReason, prompt: usize, generated: usize) {
        let i = REASONS.iter().position(|r| *r == reason).unwrap_or(0);
        self.finished[i].fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencyStats {
        LatencyStats {
            ttft: self.ttft.snapshot(),
            itl: self.itl.snapshot(),
            e2e: self.e2e.snapshot(),
            queue: self.queue.snapshot(),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            generation_tokens: self.generation_tokens.load(Ordering::Relaxed),
            finished: REASONS
                .iter()
                .zip(&self.finished)
                .map(|(r, c)| (r.as_openai(), c.load(Ordering::Relaxed)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::new(&[0.1, 1.0]);
        for ms in [50, 100, 101, 999, 5000] {
            h.observe(Duration::from_millis(ms));
        }
        let s = h.snapshot();
        // 0.1 s is inside the `le="0.1"` bucket, as Prometheus counts it.
        assert_eq!(s.counts, vec![2, 2, 1]);
        assert_eq!(s.count(), 5);
        assert!((s.sum_seconds - 6.25).abs() < 1e-9);
    }

    #[test]
    fn finishes_are_counted_by_reason_with_their_tokens() {
        let c = LatencyCell::default();
        c.record_finish(FinishReason::Stop, 10, 3);
        c.record_finish(FinishReason::Length, 5, 8);
        c.record_finish(FinishReason::Stop, 1, 1);
        let s = c.snapshot();
        assert_eq!(s.finished, vec![("stop", 2), ("length", 1), ("abort", 0)]);
        assert_eq!((s.prompt_tokens, s.generation_tokens), (16, 12));
    }
}
