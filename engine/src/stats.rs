//! Engine statistics shared lock-free between the core (writer) and the
//! handles (readers): queue depths, steps, tokens and step time, and (in
//! `latency`) per-request latency distributions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::latency::LatencyCell;

/// A point-in-time copy of the engine's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub num_running: u64,
    pub num_waiting: u64,
    pub steps: u64,
    /// Tokens run through the model (prefill and decode).
    pub batched_tokens: u64,
    /// Tokens sampled.
    pub generated_tokens: u64,
    /// Total time spent in forward passes.
    pub busy_micros: u64,
    /// Of that, time spent scoring continuations (spot checks).
    pub score_micros: u64,
    /// Fraction of KV blocks in use, in parts per million.
    pub kv_usage_ppm: u64,
    /// Bytes of KV memory the executor holds (a CPU executor's blocks are
    /// allocated when first written; a GPU's all at start).
    pub kv_bytes: u64,
    /// Prompt tokens looked up in the prefix cache, and found there.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// Sequences preempted for lack of KV blocks.
    pub preemptions: u64,
    /// Speculative draft tokens proposed and accepted.
    pub spec_proposed: u64,
    pub spec_accepted: u64,
}

impl EngineStats {
    /// Fraction of KV blocks in use, 0..=1.
    pub fn kv_usage(&self) -> f64 {
        self.kv_usage_ppm as f64 / 1e6
    }
}

/// The atomics behind `EngineStats`.
#[derive(Debug, Default)]
pub struct StatsCell {
    running: AtomicU64,
    waiting: AtomicU64,
    steps: AtomicU64,
    batched_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    busy_micros: AtomicU64,
    score_micros: AtomicU64,
    kv_usage_ppm: AtomicU64,
    kv_bytes: AtomicU64,
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    preemptions: AtomicU64,
    spec_proposed: AtomicU64,
    spec_accepted: AtomicU64,
    /// Per-request latency distributions and counters.
    pub latency: LatencyCell,
}

impl StatsCell {
    pub fn set_cache(&self, usage: f64, queries: u64, hits: u64, preemptions: u64) {
        self.kv_usage_ppm
            .store((usage * 1e6) as u64, Ordering::Relaxed);
        self.prefix_queries.store(queries, Ordering::Relaxed);
        self.prefix_hits.store(hits, Ordering::Relaxed);
        self.preemptions.store(preemptions, Ordering::Relaxed);
    }

    pub fn set_kv_bytes(&self, bytes: usize) {
        self.kv_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    pub fn set_queue(&self, running: usize, waiting: usize) {
        self.running.store(running as u64, Ordering::Relaxed);
        self.waiting.store(waiting as u64, Ordering::Relaxed);
    }

    pub fn set_spec(&self, proposed: u64, accepted: u64) {
        self.spec_proposed.store(proposed, Ordering::Relaxed);
        self.spec_accepted.store(accepted, Ordering::Relaxed);
    }

    pub fn record_step(&self, batched: usize, generated: usize, took: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.batched_tokens
            .fetch_add(batched as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        self.busy_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// A scoring pass (a spot check's reference) took `took`.
    pub fn record_score(&self, took: Duration) {
        let us = took.as_micros() as u64;
        self.busy_micros.fetch_add(us, Ordering::Relaxed);
        self.score_micros.fetch_add(us, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> EngineStats {
        EngineStats {
            num_running: self.running.load(Ordering::Relaxed),
            num_waiting: self.waiting.load(Ordering::Relaxed),
            steps: self.steps.load(Ordering::Relaxed),
            batched_tokens: self.batched_tokens.load(Ordering::Relaxed),
            generated_tokens: self.generated_tokens.load(Ordering::Relaxed),
            busy_micros: self.busy_micros.load(Ordering::Relaxed),
            score_micros: self.score_micros.load(Ordering::Relaxed),
            kv_usage_ppm: self.kv_usage_ppm.load(Ordering::Relaxed),
            kv_bytes: self.kv_bytes.load(Ordering::Relaxed),
            prefix_queries: self.prefix_queries.load(Ordering::Relaxed),
            prefix_hits: self.prefix_hits.load(Ordering::Relaxed),
            preemptions: self.preemptions.load(Ordering::Relaxed),
            spec_proposed: self.spec_proposed.load(Ordering::Relaxed),
            spec_accepted: self.spec_accepted.load(Ordering::Relaxed),
        }
    }
}
