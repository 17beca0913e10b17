//! `GET /health`: liveness, with each model's engine statistics (queue,
//! KV usage, prefix cache, preemptions, steps) for a quick look.
//! `GET /metrics`: Prometheus text (see `http::metrics`).
//! `GET /ready`: 200 once models are loaded and serving, else 503 (for load
//! balancers and orchestrators). Both answer 503 `draining` at shutdown.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};

use crate::http::api::bodies::{EngineHealth, Health, ModelHealth, Readiness};
use crate::http::state::AppState;
use engine::registry::{ModelKind, RegisteredModel};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
}

/// Liveness, with each model's engine statistics.
#[utoipa::path(get, path = "/health", tag = "operations",
    responses((status = 200, description = "Up, with engine statistics", body = Health), (status = 503, description = "Draining: shutting down, running requests finishing", body = Health)))]
pub(crate) async fn health(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let models = state.models.list().iter().map(model_health).collect();
    if state.is_draining() {
        let body = Health {
            status: "draining",
            models,
        };
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    }
    let body = Health {
        status: "ok",
        models,
    };
    (StatusCode::OK, Json(body))
}

fn model_health(m: &RegisteredModel) -> ModelHealth {
    let ModelKind::Text(h) = &m.kind else {
        return ModelHealth {
            id: m.name.clone(),
            kind: "embedding",
            engine: None,
        };
    };
    let s = h.stats();
    let info = h.info();
    let engine = EngineHealth {
        running: s.num_running,
        waiting: s.num_waiting,
        kv_cache_usage: s.kv_usage(),
        kv_blocks: info.kv_blocks,
        block_size: info.block_size,
        max_model_len: info.context_length,
        prefix_cache_queries: s.prefix_queries,
        prefix_cache_hits: s.prefix_hits,
        preemptions: s.preemptions,
        spec_draft_tokens: s.spec_proposed,
        spec_accepted_tokens: s.spec_accepted,
        steps: s.steps,
        batched_tokens: s.batched_tokens,
        generated_tokens: s.generated_tokens,
        busy_seconds: s.busy_micros as f64 / 1e6,
    };
    ModelHealth {
        id: m.name.clone(),
        kind: "text",
        engine: Some(engine),
    }
}

/// Readiness: 200 once models are loaded.
#[utoipa::path(get, path = "/ready", tag = "operations",
    responses((status = 200, description = "Ready", body = Readiness), (status = 503, description = "Not ready", body = Readiness)))]
pub(crate) async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let not = |reason: &str| {
        let body = Readiness {
            status: if state.is_draining() {
                "draining"
            } else {
                "not ready"
            },
            reason: Some(reason.to_string()),
            models: None,
        };
        (StatusCode::SERVICE_UNAVAILABLE, Json(body))
    };
    if state.is_draining() {
        return not("the server is shutting down");
    }
    let models: Vec<String> = state.models.list().into_iter().map(|m| m.name).collect();
    if models.is_empty() {
        return not("no model is loaded");
    }
    let body = Readiness {
        status: "ready",
        reason: None,
        models: Some(models),
    };
    (StatusCode::OK, Json(body))
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
        crate::http::metrics::render(
            &state.models,
            state.cache.as_deref(),
            &state.http,
            &state.fleet,
            &state.dispatch,
            &state.served,
            state.billing.as_ref().and_then(|b| b.ledger.last_audit()),
        ),
    )
}
