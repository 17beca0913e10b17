//! Per-executor stage totals, as the relays observe them on this server's
//! clock: prefill (from an attempt's start to its first token, with the
//! prompt tokens it computed) and decode (from the first token to the
//! last, with the tokens after the first). Their rates are each
//! executor's prefill and decode throughput in production, for
//! `/metrics`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

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

/// Every executor's totals, by the name usage records give it.
#[derive(Debug, Default)]
pub struct Stages(Mutex<BTreeMap<String, StageTotals>>);

impl Stages {
    /// An attempt on `executor` computed `prompt` tokens and delivered
    /// `tokens` with `timing` (an attempt with no token adds no time).
    pub fn record(&self, executor: &str, prompt: usize, tokens: usize, timing: &Timing) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let t = m.entry(executor.to_string()).or_default();
        t.attempts += 1;
        if let (Some(first), Some(last)) = (timing.first, timing.last) {
            t.prefill_seconds += first.duration_since(timing.started).as_secs_f64();
            t.prefill_tokens += prompt as u64;
            t.decode_seconds += last.duration_since(first).as_secs_f64();
            t.decode_tokens += tokens.saturating_sub(1) as u64;
        }
    }

    pub fn totals(&self) -> Vec<(String, StageTotals)> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(k, v)| (k.clone(), *v)).collect()
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
