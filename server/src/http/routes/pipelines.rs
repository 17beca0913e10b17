//! `GET /admin/pipelines`: the models served as pipelines of workers, each
//! with the chain it runs on now (every stage's worker, provider and
//! layers, and what the server measured of its steps) and the workers
//! that offer parts of it.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::api::bodies::List;
use crate::http::state::AppState;
use crate::services::pipelines::remote::StageMeasure;

pub fn admin_router() -> Router<AppState> {
    Router::new().route("/admin/pipelines", get(list))
}

/// A model served as a pipeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineView {
    pub model: String,
    /// Its layers.
    pub layers: usize,
    /// Changes whenever the chain does (a stage replaced).
    pub epoch: u64,
    /// The chain it runs on now, in order (empty: none can be formed now;
    /// its requests wait, then fail).
    pub stages: Vec<StageView>,
    /// Workers of this server offering to hold part of it.
    pub offered_by: Vec<String>,
}

/// One stage of a chain.
#[derive(Debug, Serialize, ToSchema)]
pub struct StageView {
    pub worker: String,
    pub provider_id: String,
    pub first: u32,
    pub end: u32,
    pub measured: StageMeasure,
}

/// The pipeline models and their chains.
#[utoipa::path(get, path = "/admin/pipelines", tag = "admin",
    responses((status = 200, description = "Every model served as a pipeline of workers", body = List<PipelineView>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn list(State(state): State<AppState>) -> Json<List<PipelineView>> {
    let workers = state.fleet.list();
    let views = state
        .dispatch
        .pipelines()
        .into_iter()
        .map(|(model, cell)| {
            let chain = cell.get();
            let stages = chain
                .as_ref()
                .map(|c| {
                    c.stages
                        .iter()
                        .map(|s| StageView {
                            worker: s.worker.clone(),
                            provider_id: s.provider.clone(),
                            first: s.layers.start,
                            end: s.layers.end,
                            measured: cell.measure(&s.worker),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let layers = state.models.text(&model).map_or(0, |h| h.info().layers);
            PipelineView {
                offered_by: workers
                    .iter()
                    .filter(|w| w.parts.iter().any(|p| p.model == model))
                    .map(|w| w.id.clone())
                    .collect(),
                epoch: chain.map_or(0, |c| c.epoch),
                stages,
                layers,
                model,
            }
        })
        .collect();
    Json(List::of(views))
}
