//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};

use crate::http::api::types::{ModelCard, ModelList};
use crate::http::error::ApiError;
use crate::http::state::AppState;
use engine::registry::RegisteredModel;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(list))
        .route("/v1/models/{id}", get(retrieve))
}

fn card(m: &RegisteredModel) -> ModelCard {
    ModelCard {
        id: m.name.clone(),
        object: "model",
        created: m.created,
        owned_by: "synor",
    }
}

/// The served models.
#[utoipa::path(get, path = "/v1/models", tag = "models",
    responses((status = 200, description = "Every served model", body = ModelList)),
    security(("api_key" = [])))]
pub(crate) async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: state.models.list().iter().map(card).collect(),
    })
}

/// One served model.
#[utoipa::path(get, path = "/v1/models/{id}", tag = "models",
    params(("id" = String, Path, description = "The model's name")),
    responses((status = 200, description = "The model", body = ModelCard),
        (status = 404, description = "No such model", body = crate::http::error::ErrorResponse)),
    security(("api_key" = [])))]
pub(crate) async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    Ok(Json(card(&state.models.get(&id)?)))
}
