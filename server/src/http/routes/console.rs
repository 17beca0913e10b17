//! Signing in and out of the admin console (`auth::console`): the admin
//! token, sent once in a request body, opens a session held in an
//! `HttpOnly`, `SameSite=Strict` cookie; the answer carries the session's
//! CSRF token for mutating requests. Failed sign-ins are throttled like
//! any admin authentication; only the admin token signs in (a user key
//! never does).

use std::net::SocketAddr;
use std::time::Instant;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::http::auth::console::{self, SessionCheck};
use crate::http::error::ApiError;
use crate::http::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route(
        "/console/session",
        post(sign_in).delete(sign_out).get(current),
    )
}

/// Every answer about a session is private to its browser.
const PRIVATE: [(header::HeaderName, &str); 2] = [
    (header::CACHE_CONTROL, "no-store"),
    (header::VARY, "Cookie"),
];

/// The admin token, to open a console session.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    pub token: String,
}

/// An open console session: send `csrf` as `x-csrf-token` with every
/// mutating request (the session itself is the `synor_console` cookie).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Session {
    pub csrf: String,
    /// Seconds until the session expires.
    pub expires_in: u64,
}

/// Opens a console session with the admin token.
#[utoipa::path(post, path = "/console/session", tag = "admin", request_body = SignIn,
    responses((status = 200, description = "Signed in; the session cookie is set", body = Session), (status = 401, description = "Not the admin token", body = crate::http::error::ErrorResponse), (status = 429, description = "Too many failed sign-ins from this address", body = crate::http::error::ErrorResponse)))]
pub(crate) async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    body: Result<Json<SignIn>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let auth = &state.auth;
    let who = peer.map(|Extension(ConnectInfo(a))| a.ip());
    let now = Instant::now();
    if let Some(retry_after) = auth.admin_throttle.blocked(who, now) {
        return Err(ApiError::RateLimited {
            what: "failed admin authentications",
            retry_after,
        });
    }
    let Json(body) = body.map_err(|e| ApiError::invalid("token", e.body_text()))?;
    let admin = auth.admin_token.as_deref();
    if admin.is_none() {
        return Err(ApiError::AdminOff);
    }
    if !admin.is_some_and(|want| crate::http::auth::admin::token_matches(want, &body.token)) {
        auth.admin_throttle.failed(who, now);
        return Err(ApiError::AdminOnly);
    }
    let (id, csrf) = auth.console.open();
    let session = Session {
        csrf,
        expires_in: console::TTL.as_secs(),
    };
    let cookie = console::set_cookie(Some(&id), console::over_https(&headers));
    Ok(([(header::SET_COOKIE, cookie)], PRIVATE, Json(session)).into_response())
}

/// The browser's live console session: its CSRF token (for a new tab of
/// a signed-in browser), and the seconds it has left.
#[utoipa::path(get, path = "/console/session", tag = "admin",
    responses((status = 200, description = "The session", body = Session), (status = 401, description = "No live session", body = crate::http::error::ErrorResponse)))]
pub(crate) async fn current(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (csrf, left) = state
        .auth
        .console
        .current(&headers)
        .ok_or(ApiError::Unauthorized("no console session: sign in"))?;
    let session = Session {
        csrf,
        expires_in: left.as_secs(),
    };
    Ok((PRIVATE, Json(session)).into_response())
}

/// Closes the console session (its CSRF token required); the cookie is
/// cleared either way (without the CSRF token, the browser forgets the
/// session and the server lets it expire).
#[utoipa::path(delete, path = "/console/session", tag = "admin",
    responses((status = 204, description = "Signed out"), (status = 403, description = "The session's x-csrf-token is missing or wrong", body = crate::http::error::ErrorResponse)))]
pub(crate) async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let sessions = &state.auth.console;
    let cookie = [(
        header::SET_COOKIE,
        console::set_cookie(None, console::over_https(&headers)),
    )];
    match sessions.check(&axum::http::Method::DELETE, &headers) {
        SessionCheck::MissingCsrf => {
            return Ok((cookie, ApiError::CsrfMissing).into_response());
        }
        SessionCheck::Ok => {
            if let Some(id) = console::cookie(&headers, console::COOKIE) {
                sessions.close(id);
            }
        }
        SessionCheck::None => {}
    }
    Ok((StatusCode::NO_CONTENT, cookie, PRIVATE).into_response())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    fn app() -> axum::Router {
        let auth = crate::http::auth::Auth {
            admin_token: Some("admin-secret".into()),
            ..Default::default()
        };
        let state = AppState::with_auth(std::sync::Arc::default(), auth);
        crate::http::app(state, 1 << 20)
    }

    async fn call(
        app: &axum::Router,
        req: Request<Body>,
    ) -> (StatusCode, HeaderMap, serde_json::Value) {
        let resp = app.clone().oneshot(req).await.expect("response");
        let (status, headers) = (resp.status(), resp.headers().clone());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (
            status,
            headers,
            serde_json::from_slice(&body).unwrap_or_default(),
        )
    }

    fn sign_in(token: &str) -> Request<Body> {
        Request::post("/console/session")
            .header("content-type", "application/json")
            .body(Body::from(
                serde_json::json!({ "token": token }).to_string(),
            ))
            .expect("request")
    }

    fn with(method: &str, path: &str, cookie: &str, csrf: Option<&str>) -> Request<Body> {
        let mut r = Request::builder()
            .method(method)
            .uri(path)
            .header("cookie", cookie);
        if let Some(t) = csrf {
            r = r.header(console::CSRF_HEADER, t);
        }
        r.body(Body::empty()).expect("request")
    }

    /// The answer tells the browser to forget the session cookie.
    fn assert_clears_cookie(headers: &HeaderMap) {
        assert!(
            headers[header::SET_COOKIE]
                .to_str()
                .expect("cookie")
                .contains("Max-Age=0")
        );
    }

    #[tokio::test]
    async fn the_console_signs_in_with_the_admin_token_only_and_guards_every_mutation() {
        let app = app();
        // A wrong token, or a user's API key, never opens a session.
        for wrong in ["nope", "sk-synor-userkey", ""] {
            let (status, headers, body) = call(&app, sign_in(wrong)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
            assert!(headers.get(header::SET_COOKIE).is_none());
        }
        let (status, headers, body) = call(&app, sign_in("admin-secret")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let set = headers[header::SET_COOKIE]
            .to_str()
            .expect("cookie")
            .to_string();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Max-Age="),
            "{set}"
        );
        let cookie = set.split(';').next().expect("pair").to_string();
        let csrf = body["csrf"].as_str().expect("csrf").to_string();
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        // A new tab of the same browser reads its session's CSRF token.
        let (status, headers, body) =
            call(&app, with("GET", "/console/session", &cookie, None)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["csrf"], csrf.as_str());
        assert!(body["expires_in"].as_u64().expect("seconds") > 28_000);
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        let (status, _, _) = call(
            &app,
            with("GET", "/console/session", "synor_console=forged", None),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // The session reads admin routes without the token; no cache
        // keeps what it read.
        let (status, headers, _) = call(&app, with("GET", "/admin/fleet", &cookie, None)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        // A mutation needs the CSRF token: 403 without it, then through
        // authentication (404: no such worker) with it.
        let (status, _, body) = call(&app, with("DELETE", "/admin/fleet/w1", &cookie, None)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["error"]["code"], "csrf_token_missing");
        let (status, _, _) = call(
            &app,
            with("DELETE", "/admin/fleet/w1", &cookie, Some(&csrf)),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        // A forged cookie is no session.
        let (status, _, _) = call(
            &app,
            with("GET", "/admin/fleet", "synor_console=forged", None),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // Sign-out needs the CSRF token to end the session; without it
        // the browser still forgets the cookie.
        let (status, headers, _) =
            call(&app, with("DELETE", "/console/session", &cookie, None)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_clears_cookie(&headers);
        let (status, _, _) = call(&app, with("GET", "/admin/fleet", &cookie, None)).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "the server session stands until signed out or expired"
        );
        let (status, headers, _) = call(
            &app,
            with("DELETE", "/console/session", &cookie, Some(&csrf)),
        )
        .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert_clears_cookie(&headers);
        let (status, _, _) = call(&app, with("GET", "/admin/fleet", &cookie, None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
}
