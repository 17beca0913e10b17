//! `GET /health`: liveness, with each model's engine statistics (queue,
//! KV usage, prefix cache, preemptions, steps) for a quick look.
//! `GET /metrics`: Prometheus text (see `http::metrics`).
//! `GET /ready`: 200 once models are loaded and serving, else 503 (for load
//! balancers and orchestrators). Both answer 503 `draining` at shutdown.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::http::state::AppState;
use crate::services::models::ModelKind;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
}

/// Liveness, with each model's engine statistics.
#[utoipa::path(get, path = "/health", tag = "operations",
    responses((status = 200, description = "Up, with engine statistics", body = Object), (status = 503, description = "Draining: shutting down, running requests finishing", body = Object)))]
pub(crate) async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let models: Vec<Value> = state
        .models
        .list()
        .iter()
        .map(|m| match &m.kind {
            ModelKind::Text(h) => {
                let s = h.stats();
                let info = h.info();
                json!({
                    "id": m.name, "kind": "text",
                    "running": s.num_running, "waiting": s.num_waiting,
                    "kv_cache_usage": s.kv_usage(), "kv_blocks": info.kv_blocks, "block_size": info.block_size,
                    "max_model_len": info.context_length,
                    "prefix_cache_queries": s.prefix_queries, "prefix_cache_hits": s.prefix_hits,
                    "preemptions": s.preemptions,
                    "spec_draft_tokens": s.spec_proposed, "spec_accepted_tokens": s.spec_accepted, "steps": s.steps,
                    "batched_tokens": s.batched_tokens, "generated_tokens": s.generated_tokens,
                    "busy_seconds": s.busy_micros as f64 / 1e6,
                })
            }
            ModelKind::Embedding(_) => json!({ "id": m.name, "kind": "embedding" }),
        })
        .collect();
    if state.is_draining() {
        let body = json!({ "status": "draining", "models": models });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    }
    (
        StatusCode::OK,
        Json(json!({ "status": "ok", "models": models })),
    )
}

/// Readiness: 200 once models are loaded.
#[utoipa::path(get, path = "/ready", tag = "operations",
    responses((status = 200, description = "Ready", body = Object), (status = 503, description = "Not ready", body = Object)))]
pub(crate) async fn ready(State(state): State<AppState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    if state.is_draining() {
        let body = json!({ "status": "draining", "reason": "the server is shutting down" });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    let models: Vec<String> = state.models.list().into_iter().map(|m| m.name).collect();
    if models.is_empty() {
        let body = json!({ "status": "not ready", "reason": "no model is loaded" });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    Json(json!({ "status": "ready", "models": models })).into_response()
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text", body = String, content_type = "text/plain")))]
pub(crate) async fn metrics(State(state): State<AppState>) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::http::metrics::render(&state.models, state.cache.as_deref(), &state.http),
    )
}
