//! Per-key limits over a sliding minute: requests per minute, tokens per
//! minute (charged when a request is admitted, at its worst case: prompt
//! plus `max_tokens` for every choice) and requests in flight. A refusal
//! says how long until the limit frees up (the `Retry-After` seconds).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::services::ServiceError;
use money::store::keys::KeyRecord;

const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Usage {
    requests: VecDeque<Instant>,
    tokens: VecDeque<(Instant, u64)>,
    in_flight: u64,
}

impl Usage {
    fn prune(&mut self, now: Instant) {
        while self.requests.front().is_some_and(|&t| now - t >= WINDOW) {
            self.requests.pop_front();
        }
        while self.tokens.front().is_some_and(|&(t, _)| now - t >= WINDOW) {
            self.tokens.pop_front();
        }
    }
}

/// Seconds until an entry made at `t` leaves the window (at least 1).
fn retry_after(t: Instant, now: Instant) -> u64 {
    WINDOW.saturating_sub(now - t).as_secs_f64().ceil().max(1.0) as u64
}

/// Usage of every key, in memory (per server process).
#[derive(Debug, Default)]
pub struct Limiter {
    keys: Mutex<HashMap<String, Usage>>,
}

/// A request in flight; dropping it frees its concurrency slot.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<Limiter>,
    key: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut keys = self.limiter.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = keys.get_mut(&self.key) {
            u.in_flight = u.in_flight.saturating_sub(1);
        }
    }
}

impl Limiter {
    /// Admits one request of `key` at `now`, or says why not.
    pub fn admit(self: &Arc<Self>, key: &KeyRecord, now: Instant) -> Result<Permit, ServiceError> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let u = keys.entry(key.id.clone()).or_default();
        u.prune(now);
        let l = key.limits;
        if l.max_concurrent
            .is_some_and(|m| u.in_flight >= m.max(0) as u64)
        {
            return Err(ServiceError::RateLimited {
                what: "concurrent requests",
                retry_after: 1,
            });
        }
        if let (Some(rpm), Some(&oldest)) = (l.rpm, u.requests.front())
            && u.requests.len() as u64 >= rpm.max(0) as u64
        {
            return Err(ServiceError::RateLimited {
                what: "requests per minute",
                retry_after: retry_after(oldest, now),
            });
        }
        if l.rpm == Some(0) {
            return Err(ServiceError::RateLimited {
                what: "requests per minute",
                retry_after: 60,
            });
        }
        if let (Some(tpm), Some(&(oldest, _))) = (l.tpm, u.tokens.front())
            && u.tokens.iter().map(|(_, n)| n).sum::<u64>() >= tpm.max(0) as u64
        {
            return Err(ServiceError::RateLimited {
                what: "tokens per minute",
                retry_after: retry_after(oldest, now),
            });
        }
        u.requests.push_back(now);
        u.in_flight += 1;
        Ok(Permit {
            limiter: self.clone(),
            key: key.id.clone(),
        })
    }

    /// Charges `tokens` to `key`; refuses (charging nothing) when that
    /// would pass its tokens-per-minute limit: for now (`RateLimited`,
    /// retry later), or for ever when `tokens` alone is more than the
    /// limit (`OverLimit`, a client error: retrying cannot help).
    pub fn charge(&self, key: &KeyRecord, tokens: u64, now: Instant) -> Result<(), ServiceError> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let u = keys.entry(key.id.clone()).or_default();
        u.prune(now);
        if let Some(tpm) = key.limits.tpm {
            // A request that could never fit waits for nothing: say so.
            if tokens > tpm.max(0) as u64 {
                return Err(ServiceError::OverLimit {
                    param: "max_tokens",
                    need: tokens,
                    limit: tpm.max(0) as u64,
                });
            }
            let used: u64 = u.tokens.iter().map(|(_, n)| n).sum();
            if used + tokens > tpm.max(0) as u64 {
                let retry = u.tokens.front().map_or(60, |&(t, _)| retry_after(t, now));
                return Err(ServiceError::RateLimited {
                    what: "tokens per minute",
                    retry_after: retry,
                });
            }
        }
        u.tokens.push_back((now, tokens));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use money::store::keys::Limits;

    fn key(limits: Limits) -> KeyRecord {
        KeyRecord {
            id: "k".into(),
            name: "t".into(),
            account_id: "user:t".into(),
            budget: None,
            spent: 0,
            prefix: "sk".into(),
            limits,
            created_at: 0,
            revoked_at: None,
        }
    }

    #[test]
    fn requests_per_minute_trip_and_recover_after_the_window() {
        let l = Arc::new(Limiter::default());
        let k = key(Limits {
            rpm: Some(2),
            ..Default::default()
        });
        let t0 = Instant::now();
        let _a = l.admit(&k, t0).expect("1st");
        let _b = l.admit(&k, t0 + Duration::from_secs(10)).expect("2nd");
        match l.admit(&k, t0 + Duration::from_secs(20)) {
            Err(ServiceError::RateLimited { retry_after, .. }) => assert_eq!(retry_after, 40),
            other => panic!("expected a limit, got {other:?}"),
        }
        assert!(
            l.admit(&k, t0 + Duration::from_secs(61)).is_ok(),
            "the first left the window"
        );
    }

    #[test]
    fn concurrency_is_freed_when_a_permit_drops() {
        let l = Arc::new(Limiter::default());
        let k = key(Limits {
            max_concurrent: Some(1),
            ..Default::default()
        });
        let now = Instant::now();
        let p = l.admit(&k, now).expect("first");
        assert!(l.admit(&k, now).is_err());
        drop(p);
        assert!(l.admit(&k, now).is_ok());
    }

    #[test]
    fn tokens_per_minute_refuse_a_charge_that_would_pass_the_limit() {
        let l = Limiter::default();
        let k = key(Limits {
            tpm: Some(100),
            ..Default::default()
        });
        let now = Instant::now();
        l.charge(&k, 60, now).expect("fits");
        assert!(l.charge(&k, 50, now + Duration::from_secs(1)).is_err());
        l.charge(&k, 40, now + Duration::from_secs(2))
            .expect("fits exactly");
        l.charge(&k, 100, now + Duration::from_secs(63))
            .expect("both charges left the window");
    }

    #[test]
    fn a_request_larger_than_the_limit_is_refused_as_infeasible_not_rate_limited() {
        let l = Arc::new(Limiter::default());
        let k = key(Limits {
            tpm: Some(100),
            ..Default::default()
        });
        match l.charge(&k, 101, Instant::now()) {
            Err(ServiceError::OverLimit { need, limit, .. }) => {
                assert_eq!((need, limit), (101, 100))
            }
            other => panic!("expected OverLimit, got {other:?}"),
        }
        l.charge(&k, 100, Instant::now())
            .expect("the whole limit fits");
    }
}
