//! Console sessions: the admin console signs in once with the admin token
//! and then holds a session cookie (`synor_console`: `HttpOnly`, so page
//! scripts cannot read it; `SameSite=Strict`, so other sites cannot send
//! it; expiring after `TTL`). The token itself is never put in a URL or
//! kept by the page. A session authenticates admin routes like the token
//! does; for every mutating request it also needs the session's CSRF token
//! in `x-csrf-token` (answered at sign-in, or to `GET /console/session`
//! from the page of a live session; the page keeps it in its tab's
//! `sessionStorage`), which a cross-site form cannot know. Behind a proxy
//! that says `X-Forwarded-Proto: https` the cookie is also `Secure`.
//! Sessions live in this process: a restart signs everyone out, and
//! replicas behind one address need sticky sessions for the console.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method};

/// The session cookie's name.
pub const COOKIE: &str = "synor_console";
/// The header that carries the CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a session lasts.
pub const TTL: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at most (the oldest go first past it).
const MAX_SESSIONS: usize = 1024;

#[derive(Debug, Clone)]
struct Session {
    csrf: String,
    expires: Instant,
}

/// The console's signed-in sessions.
#[derive(Debug, Default)]
pub struct Sessions(Mutex<HashMap<String, Session>>);

/// A random 256-bit value, hex.
fn secret() -> String {
    (0..4)
        .map(|_| format!("{:016x}", rand::random::<u64>()))
        .collect()
}

/// How a request was authenticated by a console session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCheck {
    /// No session cookie, or an unknown or expired one.
    None,
    /// A live session, and the request may proceed.
    Ok,
    /// A live session, but a mutating request without its CSRF token.
    MissingCsrf,
}

impl Sessions {
    /// Opens a session: its id (the cookie's value) and CSRF token.
    pub fn open(&self) -> (String, String) {
        self.open_at(Instant::now())
    }

    fn open_at(&self, now: Instant) -> (String, String) {
        let (id, csrf) = (secret(), secret());
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, s| s.expires > now);
        if m.len() >= MAX_SESSIONS
            && let Some(oldest) = m
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
        {
            m.remove(&oldest);
        }
        let session = Session {
            csrf: csrf.clone(),
            expires: now + TTL,
        };
        m.insert(id.clone(), session);
        (id, csrf)
    }

    /// Closes the session `id` (sign-out).
    pub fn close(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// The CSRF token and the time left of the request's live session.
    pub fn current(&self, headers: &HeaderMap) -> Option<(String, Duration)> {
        let id = cookie(headers, COOKIE)?;
        let now = Instant::now();
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(id)
            .filter(|s| s.expires > now)
            .map(|s| (s.csrf.clone(), s.expires - now))
    }

    /// Checks a request's session cookie (and, when it mutates, its CSRF
    /// header).
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> SessionCheck {
        self.check_at(method, headers, Instant::now())
    }

    fn check_at(&self, method: &Method, headers: &HeaderMap, now: Instant) -> SessionCheck {
        let Some(id) = cookie(headers, COOKIE) else {
            return SessionCheck::None;
        };
        let csrf = {
            let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(id) {
                Some(s) if s.expires > now => s.csrf.clone(),
                _ => return SessionCheck::None,
            }
        };
        let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let given = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if safe || given.is_some_and(|g| super::admin::token_matches(&csrf, g)) {
            SessionCheck::Ok
        } else {
            SessionCheck::MissingCsrf
        }
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// Whether the request reached us over HTTPS (a proxy in front says so):
/// then the cookie is `Secure`, never sent over plain HTTP.
pub fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The `Set-Cookie` value that holds session `id` (`None`: clears it).
pub fn set_cookie(id: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match id {
        Some(id) => format!(
            "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            TTL.as_secs()
        ),
        None => format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(cookie: Option<&str>, csrf: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(c) = cookie {
            h.insert(
                "cookie",
                format!("a=b; {COOKIE}={c}; x=y").parse().expect("header"),
            );
        }
        if let Some(t) = csrf {
            h.insert(CSRF_HEADER, t.parse().expect("header"));
        }
        h
    }

    #[test]
    fn a_session_reads_freely_and_mutates_only_with_its_csrf_token() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let (id, csrf) = s.open_at(t0);
        assert_eq!((id.len(), csrf.len()), (64, 64));
        let check = |h: &HeaderMap, m: &Method| s.check_at(m, h, t0);
        assert_eq!(
            check(&headers(Some(&id), None), &Method::GET),
            SessionCheck::Ok
        );
        assert_eq!(
            check(&headers(Some(&id), None), &Method::POST),
            SessionCheck::MissingCsrf
        );
        assert_eq!(
            check(&headers(Some(&id), Some("nope")), &Method::DELETE),
            SessionCheck::MissingCsrf
        );
        assert_eq!(
            check(&headers(Some(&id), Some(&csrf)), &Method::POST),
            SessionCheck::Ok
        );
        // Another session's CSRF token is not this one's.
        let (_, other) = s.open_at(t0);
        assert_eq!(
            check(&headers(Some(&id), Some(&other)), &Method::PATCH),
            SessionCheck::MissingCsrf
        );
        // Unknown, expired or closed sessions are none at all.
        assert_eq!(
            check(&headers(Some("forged"), None), &Method::GET),
            SessionCheck::None
        );
        assert_eq!(
            check(&headers(None, Some(&csrf)), &Method::POST),
            SessionCheck::None
        );
        assert_eq!(
            s.check_at(&Method::GET, &headers(Some(&id), None), t0 + TTL),
            SessionCheck::None
        );
        s.close(&id);
        assert_eq!(
            check(&headers(Some(&id), None), &Method::GET),
            SessionCheck::None
        );
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_expires() {
        let c = set_cookie(Some("abc"), false);
        for part in [
            "synor_console=abc",
            "HttpOnly",
            "SameSite=Strict",
            "Path=/",
            "Max-Age=28800",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(set_cookie(None, false).contains("Max-Age=0"));
        assert!(!c.contains("Secure"));
        assert!(set_cookie(Some("abc"), true).ends_with("; Secure"));
        let mut https = HeaderMap::new();
        https.insert("x-forwarded-proto", "HTTPS".parse().expect("header"));
        assert!(over_https(&https) && !over_https(&HeaderMap::new()));
        let mut h = HeaderMap::new();
        h.insert("cookie", "synor_console=; other=1".parse().expect("header"));
        assert_eq!(cookie(&h, COOKIE), None, "an empty cookie is none");
    }
}
