//! Who may call the API. With a database of keys, every `/v1` request needs
//! `Authorization: Bearer <key>` naming an active key (401 otherwise) and
//! passes its per-key limits (429 with `Retry-After`). In open mode (one
//! user on loopback, the `make run` default) no key is needed. Admin routes
//! need the admin token.

pub mod admin;
pub mod console;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::http::error::ApiError;
use crate::services::limits::Limiter;
use money::store::Db;
use money::store::keys::KeyRecord;

/// The server's access policy.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// Key storage; `None` in open mode.
    pub db: Option<Db>,
    pub admin_token: Option<String>,
    pub limiter: Arc<Limiter>,
    /// Failed admin authentications per client address.
    pub admin_throttle: Arc<admin::AdminThrottle>,
    /// The admin console's signed-in sessions.
    pub console: Arc<console::Sessions>,
}

impl Auth {
    /// No keys needed (single user).
    pub fn open() -> Self {
        Self::default()
    }

    pub fn with_keys(db: Db, admin_token: Option<String>) -> Self {
        Self {
            db: Some(db),
            admin_token,
            limiter: Arc::default(),
            admin_throttle: Arc::default(),
            console: Arc::default(),
        }
    }

    /// Checks the admin token (compared as digests, in constant time).
    pub fn check_admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match (&self.admin_token, bearer(headers)) {
            (Some(want), Some(got)) if admin::token_matches(want, got) => Ok(()),
            (None, _) => Err(ApiError::AdminOff),
            _ => Err(ApiError::AdminOnly),
        }
    }
}

/// The credentials of `Authorization: Bearer <token>`; the scheme is
/// case-insensitive (RFC 6750 via RFC 9110).
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Middleware for `/v1` routes: authenticate, apply the key's limits, and
/// hand the key to the handler (as an extension) for token accounting. The
/// concurrency slot is held until the response body (a stream, maybe) ends.
pub async fn require_key(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    let Some(db) = &auth.db else {
        return next.run(req).await;
    };
    let key = match bearer(req.headers()) {
        None => Err(ApiError::Unauthorized(
            "no API key: send Authorization: Bearer <key>",
        )),
        Some(secret) => match db.find_key(secret).await {
            Ok(Some(k)) => Ok(k),
            Ok(None) => Err(ApiError::Unauthorized("incorrect or revoked API key")),
            Err(e) => Err(ApiError::Storage(e.to_string())),
        },
    };
    let key: KeyRecord = match key {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let permit = match auth.limiter.admit(&key, Instant::now()) {
        Ok(p) => p,
        Err(e) => return ApiError::from(e).into_response(),
    };
    req.extensions_mut().insert(key);
    let resp = next.run(req).await;
    let (parts, body) = resp.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &permit;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}
