//! The admin token's check: one middleware in front of every admin route.
//! The token is compared as SHA-256 digests (fixed length, constant time,
//! so neither its bytes nor its length leak through timing), and failed
//! attempts are throttled per client address: a bucket of `BURST` failures
//! (or `--admin-auth-burst`)
//! refilled at `REFILL_PER_S`; an address with an empty bucket gets 429
//! (with `Retry-After`) for every admin request, right token or not, until
//! it refills. About one guess a second instead of thousands.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::Auth;
use crate::http::error::ApiError;

/// Failures an address may make in a row.
const BURST: f64 = 10.0;
/// Failures forgiven per second.
const REFILL_PER_S: f64 = 1.0;
/// Addresses tracked before full buckets are forgotten.
const MAX_TRACKED: usize = 10_000;

/// Whether `given` is the admin token `want`, in time independent of both.
pub fn token_matches(want: &str, given: &str) -> bool {
    let (a, b) = (
        Sha256::digest(want.as_bytes()),
        Sha256::digest(given.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Failed admin authentications per client address (`None`: unknown, as
/// in in-process tests).
#[derive(Debug)]
pub struct AdminThrottle {
    buckets: Mutex<HashMap<Option<IpAddr>, (f64, Instant)>>,
    /// Failures an address may make in a row.
    burst: f64,
}

impl Default for AdminThrottle {
    fn default() -> Self {
        Self::with_burst(BURST as u32)
    }
}

impl AdminThrottle {
    /// A throttle allowing `burst` failures in a row (at least one).
    pub fn with_burst(burst: u32) -> Self {
        Self {
            buckets: Mutex::default(),
            burst: f64::from(burst.max(1)),
        }
    }

    /// Seconds until `who` may try again, if its bucket is empty.
    pub(crate) fn blocked(&self, who: Option<IpAddr>, now: Instant) -> Option<u64> {
        let mut map = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, at) = map.get_mut(&who)?;
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * REFILL_PER_S).min(self.burst);
        *at = now;
        (*tokens < 1.0).then(|| ((1.0 - *tokens) / REFILL_PER_S).ceil().max(1.0) as u64)
    }

    /// Takes one failure from `who`'s bucket.
    pub(crate) fn failed(&self, who: Option<IpAddr>, now: Instant) {
        let mut map = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_TRACKED {
            map.retain(|_, (t, at)| {
                *t + now.duration_since(*at).as_secs_f64() * REFILL_PER_S < self.burst
            });
        }
        let (tokens, _) = map.entry(who).or_insert((self.burst, now));
        *tokens -= 1.0;
    }
}

/// Middleware for admin routes: throttled, then the token (or a console
/// session, with its CSRF token when the request mutates).
pub async fn require_admin(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let who = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let now = Instant::now();
    if let Some(retry_after) = auth.admin_throttle.blocked(who, now) {
        return ApiError::RateLimited {
            what: "failed admin authentications",
            retry_after,
        }
        .into_response();
    }
    if let Err(e) = auth.check_admin(req.headers()) {
        match auth.console.check(req.method(), req.headers()) {
            super::console::SessionCheck::Ok => {}
            super::console::SessionCheck::MissingCsrf => {
                return ApiError::CsrfMissing.into_response();
            }
            super::console::SessionCheck::None => {
                // A guessed token counts against its address; an expired
                // session's cookie (its tabs keep asking) does not: a
                // 256-bit id is not guessed.
                let stale = super::bearer(req.headers()).is_none()
                    && super::console::cookie(req.headers(), super::console::COOKIE).is_some();
                if !stale {
                    auth.admin_throttle.failed(who, now);
                }
                return e.into_response();
            }
        }
    }
    let mut resp = next.run(req).await;
    // Admin answers are private: no shared or browser cache keeps them.
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Cookie"));
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn tokens_match_exactly_whatever_their_lengths() {
        assert!(token_matches("secret", "secret"));
        for other in ["", "secre", "secret ", "Secret", "secretsecret"] {
            assert!(!token_matches("secret", other), "{other}");
        }
    }

    #[test]
    fn failures_past_the_burst_block_until_the_bucket_refills() {
        let t = AdminThrottle::default();
        let ip = Some(IpAddr::from([10, 0, 0, 1]));
        let t0 = Instant::now();
        for _ in 0..BURST as usize {
            assert_eq!(t.blocked(ip, t0), None);
            t.failed(ip, t0);
        }
        assert_eq!(t.blocked(ip, t0), Some(1));
        assert_eq!(
            t.blocked(Some(IpAddr::from([10, 0, 0, 2])), t0),
            None,
            "others unaffected"
        );
        assert_eq!(t.blocked(ip, t0 + Duration::from_millis(1_100)), None);
        t.failed(ip, t0 + Duration::from_millis(1_100));
        assert!(t.blocked(ip, t0 + Duration::from_millis(1_200)).is_some());
    }
}
