//! How busy each executor is, measured by this server: an executor is busy
//! while at least one choice of this server runs on it (from its
//! placement to its end), idle otherwise, and transferring while a KV
//! transfer it sends or receives is open. Time is accumulated and
//! sampled every `SAMPLE`, so the share of time busy over the last
//! minute and five minutes, and its trend (the last minute against the
//! one before), come from differences of samples: the seeds' "zero idle
//! processors" view, for `/metrics` and `GET /admin/fleet/utilization`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How often busy time is sampled.
pub const SAMPLE: Duration = Duration::from_secs(5);
/// Samples kept: five minutes and one more sample.
const KEEP: usize = 61;

#[derive(Debug)]
struct Clock {
    /// Choices running on it now.
    running: u32,
    /// Busy time up to `since` (or now, when idle).
    busy: Duration,
    since: Instant,
    /// (when, busy time then), oldest first.
    samples: VecDeque<(Instant, Duration)>,
}

impl Clock {
    fn new(at: Instant) -> Self {
        Self {
            running: 0,
            busy: Duration::ZERO,
            since: at,
            samples: VecDeque::from([(at, Duration::ZERO)]),
        }
    }

    /// Busy time up to `at`.
    fn busy_at(&self, at: Instant) -> Duration {
        if self.running > 0 {
            self.busy + at.saturating_duration_since(self.since)
        } else {
            self.busy
        }
    }

    fn set_running(&mut self, running: u32, at: Instant) {
        self.busy = self.busy_at(at);
        self.since = at;
        self.running = running;
    }

    /// The share of `window` before `at` it was busy (over what was
    /// measured, when it is younger than the window).
    fn share(&self, at: Instant, window: Duration) -> f64 {
        let from = at.checked_sub(window);
        let (t0, b0) = self
            .samples
            .iter()
            .find(|(t, _)| from.is_none_or(|f| *t >= f))
            .copied()
            .unwrap_or((at, self.busy_at(at)));
        let (t1, b1) = self.ending(at);
        let span = t1.saturating_duration_since(t0).as_secs_f64();
        if span <= 0.0 {
            return 0.0;
        }
        (b1.saturating_sub(b0).as_secs_f64() / span).clamp(0.0, 1.0)
    }

    /// Busy time at `at`: exact since the last change, else the last
    /// sample taken by then.
    fn ending(&self, at: Instant) -> (Instant, Duration) {
        if at >= self.since {
            return (at, self.busy_at(at));
        }
        self.samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= at)
            .copied()
            .unwrap_or((at, Duration::ZERO))
    }
}

/// One executor's figures.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ExecutorUse {
    /// The executor's key (`house`, or a worker id).
    pub executor: String,
    /// Choices running on it now.
    pub running: u32,
    /// Share of the last minute, and of the last five, it was busy.
    pub busy_1m: f64,
    pub busy_5m: f64,
    /// The last minute's share less the minute's before (positive: busier).
    pub trend: f64,
    /// Share of the last minute it was sending or receiving KV (a split's
    /// prefill or decode side).
    pub transferring: f64,
}

/// One executor's clocks: running choices, and open KV transfers.
#[derive(Debug)]
struct Clocks {
    busy: Clock,
    kv: Clock,
}

/// Every executor's clocks.
#[derive(Debug, Default)]
pub struct Utilization(Mutex<BTreeMap<String, Clocks>>);

impl Utilization {
    /// `key` now runs `running` choices of this server.
    pub fn running(&self, key: &str, running: u32) {
        self.running_at(key, running, Instant::now());
    }

    fn running_at(&self, key: &str, running: u32, at: Instant) {
        self.clocks(key, at, |c| c.busy.set_running(running, at));
    }

    /// `key` now has `open` KV transfers (sending or receiving).
    pub fn transferring(&self, key: &str, open: u32) {
        let at = Instant::now();
        self.clocks(key, at, |c| c.kv.set_running(open, at));
    }

    fn clocks(&self, key: &str, at: Instant, f: impl FnOnce(&mut Clocks)) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(m.entry(key.to_string()).or_insert_with(|| Clocks {
            busy: Clock::new(at),
            kv: Clock::new(at),
        }));
    }

    /// Takes a sample of every clock (every `SAMPLE`).
    pub fn sample(&self) {
        self.sample_at(Instant::now());
    }

    fn sample_at(&self, at: Instant) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for c in m.values_mut().flat_map(|c| [&mut c.busy, &mut c.kv]) {
            let busy = c.busy_at(at);
            c.samples.push_back((at, busy));
            while c.samples.len() > KEEP {
                c.samples.pop_front();
            }
        }
    }

    /// Every executor's figures now.
    pub fn report(&self) -> Vec<ExecutorUse> {
        self.report_at(Instant::now())
    }

    fn report_at(&self, at: Instant) -> Vec<ExecutorUse> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let minute = Duration::from_secs(60);
        m.iter()
            .map(|(k, cs)| {
                let c = &cs.busy;
                let last = c.share(at, minute);
                let before = at
                    .checked_sub(minute)
                    .map_or(last, |earlier| c.share(earlier, minute));
                ExecutorUse {
                    executor: k.clone(),
                    running: c.running,
                    busy_1m: last,
                    busy_5m: c.share(at, 5 * minute),
                    trend: last - before,
                    transferring: cs.kv.share(at, minute),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_shares_follow_the_running_choices_over_their_windows() {
        let u = Utilization::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Busy the first 30 s of each minute for two minutes, then idle,
        // sampled every 5 s as time goes.
        for s in (0..=180).step_by(5) {
            if s < 120 && s % 60 == 0 {
                u.running_at("w", 2, at(s));
            } else if s < 120 && s % 60 == 30 {
                u.running_at("w", 0, at(s));
            }
            u.sample_at(at(s));
            if s == 120 {
                let r = &u.report_at(at(120))[0];
                assert!((r.busy_1m - 0.5).abs() < 1e-9, "{r:?}");
                assert!((r.busy_5m - 0.5).abs() < 1e-9, "{r:?}");
                assert!(r.trend.abs() < 1e-9, "{r:?}");
            }
        }
        // The third minute idle: the trend turns down.
        let r = &u.report_at(at(180))[0];
        assert!(
            r.busy_1m.abs() < 1e-9 && (r.trend + 0.5).abs() < 1e-9,
            "{r:?}"
        );
        assert_eq!(r.running, 0);
        // Running now counts up to now.
        u.running_at("w", 1, at(180));
        let r = &u.report_at(at(190))[0];
        assert!(r.busy_1m > 0.0 && r.running == 1, "{r:?}");
        assert_eq!(r.transferring, 0.0);
    }

    #[test]
    fn transfers_are_timed_on_their_own_clock() {
        let u = Utilization::default();
        u.transferring("w", 1);
        std::thread::sleep(Duration::from_millis(30));
        u.transferring("w", 0);
        let r = &u.report()[0];
        assert!(r.transferring > 0.5 && r.busy_1m == 0.0, "{r:?}");
    }
}
