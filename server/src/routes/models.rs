//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};

use crate::api::types::{ModelCard, ModelList};
use crate::error::ApiError;
use crate::state::{AppState, ServedModel};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(list))
        .route("/v1/models/{id}", get(retrieve))
}

fn card(m: &ServedModel) -> ModelCard {
    ModelCard {
        id: m.name.clone(),
        object: "model",
        created: m.created,
        owned_by: "synor",
    }
}

async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: state.models.list().iter().map(card).collect(),
    })
}

async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    Ok(Json(card(&state.models.get(&id)?)))
}
