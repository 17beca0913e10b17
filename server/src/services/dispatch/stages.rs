//! Per-executor stage totals, as the relays observe them on this server's
//! clock: prefill (from an attempt's start to its first token, with the
//! prompt tokens it computed) and decode (from the first token to the
//! last, with the tokens after the first). Their rates are each
//! executor's prefill and decode throughput in production, recorded
//! into `/metrics` counters as each attempt ends.

use std::time::Instant;

use crate::telemetry::{
    Collector, CounterVec, IntCounterVec, MetricFamily, collect, counter_vec, int_counter_vec,
};

/// When an attempt started and delivered its first and last tokens.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    started: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Timing {
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            first: None,
            last: None,
        }
    }

    /// A token arrived now.
    pub fn token(&mut self) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// Time to the first token and the mean gap after it over `tokens`
    /// tokens, in ms (`None` before two tokens).
    pub fn ttft_tpot(&self, tokens: usize) -> Option<(f64, f64)> {
        let (first, last) = (self.first?, self.last?);
        let gaps = tokens.checked_sub(1).filter(|&g| g > 0)?;
        let ttft = first.duration_since(self.started).as_secs_f64() * 1e3;
        Some((ttft, (last - first).as_secs_f64() * 1e3 / gaps as f64))
    }
}

/// One executor's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTotals {
    pub attempts: u64,
    pub prefill_seconds: f64,
    pub prefill_tokens: u64,
    pub decode_seconds: f64,
    pub decode_tokens: u64,
}

/// Every executor's totals, by the name usage records give it (label
/// `executor`), counted as each attempt ends.
#[derive(Debug, Clone)]
pub struct Stages {
    attempts: IntCounterVec,
    prefill_seconds: CounterVec,
    prefill_tokens: IntCounterVec,
    decode_seconds: CounterVec,
    decode_tokens: IntCounterVec,
}

const EXECUTOR: &[&str] = &["executor"];

impl Default for Stages {
    fn default() -> Self {
        Self {
            attempts: int_counter_vec(
                "synor:stage_attempts_total",
                "Attempts run on the executor for this server.",
                EXECUTOR,
            ),
            prefill_seconds: counter_vec(
                "synor:stage_prefill_seconds_total",
                "Time from an attempt's start to its first token.",
                EXECUTOR,
            ),
            prefill_tokens: int_counter_vec(
                "synor:stage_prefill_tokens_total",
                "Prompt tokens the executor computed (replays included, cache hits not).",
                EXECUTOR,
            ),
            decode_seconds: counter_vec(
                "synor:stage_decode_seconds_total",
                "Time from an attempt's first token to its last.",
                EXECUTOR,
            ),
            decode_tokens: int_counter_vec(
                "synor:stage_decode_tokens_total",
                "Tokens decoded after each attempt's first.",
                EXECUTOR,
            ),
        }
    }
}

impl Stages {
    /// An attempt on `executor` computed `prompt` tokens and delivered
    /// `tokens` with `timing` (an attempt with no token adds no time).
    pub fn record(&self, executor: &str, prompt: usize, tokens: usize, timing: &Timing) {
        let e = [executor];
        let (prefill_s, prefill_n) = (
            self.prefill_seconds.with_label_values(&e),
            self.prefill_tokens.with_label_values(&e),
        );
        let (decode_s, decode_n) = (
            self.decode_seconds.with_label_values(&e),
            self.decode_tokens.with_label_values(&e),
        );
        self.attempts.with_label_values(&e).inc();
        if let (Some(first), Some(last)) = (timing.first, timing.last) {
            prefill_s.inc_by(first.duration_since(timing.started).as_secs_f64());
            prefill_n.inc_by(prompt as u64);
            decode_s.inc_by(last.duration_since(first).as_secs_f64());
            decode_n.inc_by(tokens.saturating_sub(1) as u64);
        }
    }

    /// Every executor's totals so far, by name.
    pub fn totals(&self) -> Vec<(String, StageTotals)> {
        let mut names: Vec<String> = self
            .attempts
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .flat_map(|m| m.get_label().iter().map(|l| l.value().to_string()))
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let e = [name.as_str()];
                let t = StageTotals {
                    attempts: self.attempts.with_label_values(&e).get(),
                    prefill_seconds: self.prefill_seconds.with_label_values(&e).get(),
                    prefill_tokens: self.prefill_tokens.with_label_values(&e).get(),
                    decode_seconds: self.decode_seconds.with_label_values(&e).get(),
                    decode_tokens: self.decode_tokens.with_label_values(&e).get(),
                };
                (name, t)
            })
            .collect()
    }

    /// The five families, for `/metrics`.
    pub fn families(&self) -> Vec<MetricFamily> {
        collect(&[
            &self.attempts as &dyn Collector,
            &self.prefill_seconds,
            &self.prefill_tokens,
            &self.decode_seconds,
            &self.decode_tokens,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_splits_into_its_prefill_and_its_decode() {
        let s = Stages::default();
        let mut t = Timing::start();
        std::thread::sleep(std::time::Duration::from_millis(20));
        t.token();
        std::thread::sleep(std::time::Duration::from_millis(10));
        t.token();
        t.token();
        s.record("w@p", 100, 3, &t);
        s.record("w@p", 50, 0, &Timing::start());
        let [(name, tot)] = &s.totals()[..] else {
            panic!("one executor");
        };
        assert_eq!(name, "w@p");
        assert_eq!(
            (tot.attempts, tot.prefill_tokens, tot.decode_tokens),
            (2, 100, 2)
        );
        assert!(
            tot.prefill_seconds >= 0.02 && tot.decode_seconds >= 0.01,
            "{tot:?}"
        );
        assert!(tot.prefill_seconds < tot.prefill_seconds + tot.decode_seconds);
    }
}
