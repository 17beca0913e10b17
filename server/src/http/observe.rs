//! Per-request observability middleware: the `x-request-id` (the client's,
//! if it sent a sane one, else a new UUID) is returned on every response;
//! each request runs inside one tracing span carrying that id, its method
//! and route; its completion is logged with status and latency and counted
//! in the HTTP metrics by route, method and status. While the server
//! drains, new API and admin requests are refused here (503).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::http::state::AppState;

pub const REQUEST_ID: &str = "x-request-id";

/// A client-chosen id is kept if it is short printable ASCII.
fn client_id(req: &Request) -> Option<String> {
    let v = req.headers().get(REQUEST_ID)?.to_str().ok()?;
    (!v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| v.to_string())
}

/// While the server drains, new API and admin requests get 503 with
/// `Retry-After` (a load balancer retries them elsewhere); health,
/// readiness, metrics and documents still answer.
fn draining_refusal(state: &AppState, req: &Request) -> Option<Response> {
    let path = req.uri().path();
    let refused = state.is_draining() && (path.starts_with("/v1/") || path.starts_with("/admin/"));
    refused
        .then(|| crate::http::error::ApiError::from(engine::EngineError::Shutdown).into_response())
}

pub async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = client_id(&req).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_string();
    let method = req.method().to_string();
    let span = tracing::info_span!("request", request_id = %id, %method, %route);
    // Drain refusals happen here rather than in a layer of their own
    // (one middleware per request is measurably cheaper than two).
    let mut resp = match draining_refusal(&state, &req) {
        Some(refused) => refused,
        None => next.run(req).instrument(span.clone()).await,
    };
    let status = resp.status().as_u16();
    state.http.record(&route, &method, status);
    span.in_scope(|| {
        tracing::info!(
            status,
            latency_ms = started.elapsed().as_secs_f64() * 1e3,
            "handled"
        );
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}
