//! `GET /health`: liveness, with each model's engine queue for a quick look.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::state::{AppState, ModelKind};

pub fn router() -> Router<AppState> {
    Router::new().route("/health", get(health))
}

async fn health(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .models
        .list()
        .iter()
        .map(|m| match &m.kind {
            ModelKind::Text(h) => {
                let s = h.stats();
                json!({ "id": m.name, "kind": "text", "running": s.num_running, "waiting": s.num_waiting })
            }
            ModelKind::Embedding(_) => json!({ "id": m.name, "kind": "embedding" }),
        })
        .collect();
    Json(json!({ "status": "ok", "models": models }))
}
