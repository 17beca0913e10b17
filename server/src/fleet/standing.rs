//! Each provider's standing, measured from the fleet (never admin-set):
//! its reputation from how its workers' attempts ended (delivered, or
//! lost: disconnected, silent past the progress deadline, failed), and
//! its uptime from its connection history (the share of the time since
//! it was first seen that at least one of its workers was connected).
//! Pure bookkeeping: the registry feeds it events; `services::standing_sync`
//! persists what is pending (as increments, so replicas add up) and
//! reads back the fleet's totals; payout and placement read the
//! multipliers.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Basis points of 1x.
const BPS: i64 = 10_000;
/// Reputation ranges over 0.5-2.0.
pub const REPUTATION_MIN_BPS: i64 = 5_000;
pub const REPUTATION_MAX_BPS: i64 = 20_000;
/// The prior: a new provider counts as this many delivered and lost
/// attempts, so it starts at 1.0x (a third reliable) and earns its way
/// up with evidence: ~1.06x after 10 delivered attempts, ~1.4x after 100,
/// ~1.87x after 1,000.
const PRIOR_OK: f64 = 50.0;
const PRIOR_LOST: f64 = 100.0;
/// A lost attempt weighs this many delivered ones.
const LOST_WEIGHT: f64 = 4.0;

/// What the fleet recorded of one provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Record {
    /// Attempts its workers ran to the end.
    pub jobs_ok: u64,
    /// Attempts its workers lost.
    pub jobs_lost: u64,
    /// Seconds with at least one worker connected (closed spans).
    pub connected_s: i64,
    /// Unix seconds it was first seen (0: never).
    pub first_seen: i64,
    /// Workers connected now, and since when the current span runs.
    #[serde(skip)]
    pub open: u32,
    #[serde(skip)]
    pub open_since: i64,
}

impl Record {
    /// 0.5-2.0x, in basis points: 1.0x with no evidence, towards 2.0x as
    /// attempts are delivered, down as they are lost (each lost attempt
    /// weighs `LOST_WEIGHT` delivered ones).
    pub fn reputation_bps(&self) -> i64 {
        let ok = self.jobs_ok as f64 + PRIOR_OK;
        let bad = LOST_WEIGHT * self.jobs_lost as f64 + PRIOR_LOST;
        let reliability = ok / (ok + bad);
        // 1/3 reliability (the prior) is 1.0x; 1 is 2.0x; 0 is 0.5x.
        let x = 0.5 + 1.5 * reliability;
        ((x * BPS as f64).round() as i64).clamp(REPUTATION_MIN_BPS, REPUTATION_MAX_BPS)
    }

    /// The share of the time since first seen that it was connected, in
    /// basis points (10,000 before it was ever seen).
    pub fn uptime_bps(&self, now: i64) -> i64 {
        if self.first_seen == 0 {
            return BPS;
        }
        // A provider connected now counts the current second as up.
        let (open, now_up) = if self.open > 0 {
            ((now - self.open_since).max(0) + 1, 1)
        } else {
            (0, 0)
        };
        let span = (now - self.first_seen).max(0) + now_up;
        if span == 0 {
            return 0;
        }
        let up = (self.connected_s + open).clamp(0, span);
        (i128::from(up) * i128::from(BPS) / i128::from(span)) as i64
    }
}

/// What this process counted and has not persisted yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta {
    pub jobs_ok: u64,
    pub jobs_lost: u64,
    pub connected_s: i64,
    pub first_seen: i64,
}

#[derive(Debug, Default)]
struct Book {
    /// Totals: the fleet's as last read back, plus what is pending here.
    records: HashMap<String, Record>,
    pending: HashMap<String, Delta>,
}

/// Every provider's record.
#[derive(Debug, Default)]
pub struct Standing {
    book: Mutex<Book>,
}

impl Standing {
    fn with(&self, provider: &str, f: impl FnOnce(&mut Record, &mut Delta)) {
        let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let b = &mut *b;
        let r = b.records.entry(provider.to_string()).or_default();
        let d = b.pending.entry(provider.to_string()).or_default();
        f(r, d);
    }

    /// A worker of `provider` connected at `now`.
    pub fn connected(&self, provider: &str, now: i64) {
        self.with(provider, |r, d| {
            if r.first_seen == 0 {
                r.first_seen = now;
                d.first_seen = now;
            }
            if r.open == 0 {
                r.open_since = now;
            }
            r.open += 1;
        });
    }

    /// A worker of `provider` disconnected at `now`.
    pub fn disconnected(&self, provider: &str, now: i64) {
        self.with(provider, |r, d| {
            if r.open == 0 {
                return;
            }
            r.open -= 1;
            if r.open == 0 {
                let span = (now - r.open_since).max(0);
                r.connected_s += span;
                d.connected_s += span;
            }
        });
    }

    /// One attempt on a worker of `provider` ended (`lost` or not).
    pub fn attempt(&self, provider: &str, lost: bool) {
        self.with(provider, |r, d| {
            if lost {
                r.jobs_lost += 1;
                d.jobs_lost += 1;
            } else {
                r.jobs_ok += 1;
                d.jobs_ok += 1;
            }
        });
    }

    /// A worker of `provider` failed a spot check: it counts as `weight`
    /// lost attempts.
    pub fn cheated(&self, provider: &str, weight: u64) {
        self.with(provider, |r, d| {
            r.jobs_lost += weight;
            d.jobs_lost += weight;
        });
    }

    /// `provider`'s record (a default one if never seen).
    pub fn get(&self, provider: &str) -> Record {
        let b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        b.records.get(provider).copied().unwrap_or_default()
    }

    /// What is pending, as of `now`: open spans are counted up to `now`
    /// and restart there. The caller persists it, then `absorb`s the
    /// fleet's totals.
    pub fn take_pending(&self, now: i64) -> Vec<(String, Delta)> {
        let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let b = &mut *b;
        for (p, r) in b.records.iter_mut().filter(|(_, r)| r.open > 0) {
            let span = (now - r.open_since).max(0);
            r.connected_s += span;
            r.open_since = now;
            b.pending.entry(p.clone()).or_default().connected_s += span;
        }
        b.pending
            .drain()
            .filter(|(_, d)| *d != Delta::default())
            .collect()
    }

    /// Puts back what could not be persisted.
    pub fn restore_pending(&self, deltas: Vec<(String, Delta)>) {
        let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        for (p, d) in deltas {
            let e = b.pending.entry(p).or_default();
            e.jobs_ok += d.jobs_ok;
            e.jobs_lost += d.jobs_lost;
            e.connected_s += d.connected_s;
            if e.first_seen == 0 {
                e.first_seen = d.first_seen;
            }
        }
    }

    /// Takes the fleet's persisted totals of `provider` (every replica's
    /// counts): what is still pending here is added on top.
    pub fn absorb(&self, provider: &str, totals: &Record) {
        let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let b = &mut *b;
        let d = b.pending.get(provider).copied().unwrap_or_default();
        let r = b.records.entry(provider.to_string()).or_default();
        r.jobs_ok = totals.jobs_ok + d.jobs_ok;
        r.jobs_lost = totals.jobs_lost + d.jobs_lost;
        r.connected_s = totals.connected_s + d.connected_s;
        if totals.first_seen != 0 && (r.first_seen == 0 || totals.first_seen < r.first_seen) {
            r.first_seen = totals.first_seen;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reputation_starts_at_one_rises_with_delivery_and_pays_for_losses() {
        let s = Standing::default();
        assert_eq!(s.get("p").reputation_bps(), 10_000);
        for _ in 0..10 {
            s.attempt("p", false);
        }
        let early = s.get("p").reputation_bps();
        assert!((10_000..11_000).contains(&early), "{early}");
        for _ in 0..990 {
            s.attempt("p", false);
        }
        let good = s.get("p").reputation_bps();
        assert!(good > 18_000, "{good}");
        s.attempt("p", true);
        let after = s.get("p").reputation_bps();
        assert!(after < good, "a lost attempt costs reputation");
        for _ in 0..1000 {
            s.attempt("q", true);
        }
        assert!(s.get("q").reputation_bps() < 5_200);
    }

    #[test]
    fn uptime_is_the_connected_share_since_first_seen_across_overlapping_workers() {
        let s = Standing::default();
        assert_eq!(s.get("p").uptime_bps(100), 10_000);
        s.connected("p", 1_000);
        s.connected("p", 1_010); // a second worker: one span
        s.disconnected("p", 1_050);
        assert_eq!(s.get("p").uptime_bps(1_100), 10_000, "still one up");
        s.disconnected("p", 1_100);
        // Up 100 s of the 200 s since first seen.
        assert_eq!(s.get("p").uptime_bps(1_200), 5_000);
        // A disconnect never seen connected changes nothing.
        s.disconnected("p", 1_300);
        assert_eq!(s.get("p").connected_s, 100);
    }

    #[test]
    fn seeded_random_histories_keep_the_multipliers_in_range() {
        let mut x = 0x9e37_79b9_u64;
        let s = Standing::default();
        let mut t = 1_000;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = format!("p{}", x % 5);
            t += (x >> 8) as i64 % 3;
            match (x >> 16) % 4 {
                0 => s.connected(&p, t),
                1 => s.disconnected(&p, t),
                2 => s.attempt(&p, false),
                _ => s.attempt(&p, (x >> 20).is_multiple_of(3)),
            }
            let r = s.get(&p);
            assert!((REPUTATION_MIN_BPS..=REPUTATION_MAX_BPS).contains(&r.reputation_bps()));
            assert!((0..=BPS).contains(&r.uptime_bps(t)), "{r:?} at {t}");
        }
        // Pending counts come back once, and absorbing the persisted
        // totals (as if flushed) changes nothing.
        let before: Vec<Record> = (0..5).map(|i| s.get(&format!("p{i}"))).collect();
        let pending = s.take_pending(t);
        assert!(!pending.is_empty());
        assert!(s.take_pending(t).is_empty());
        for (i, b) in before.iter().enumerate() {
            let p = format!("p{i}");
            let r = s.get(&p);
            s.absorb(&p, &r);
            assert_eq!(s.get(&p).jobs_ok, b.jobs_ok);
        }
    }
}
