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
    /// The chain its first lane runs on now, in order (empty: none can be
    /// formed now; its requests wait, then fail).
    pub stages: Vec<StageView>,
    /// Every lane that has a chain (the first one's is `stages`): each an
    /// engine on workers of its own; requests go to the one expected to
    /// serve them soonest.
    pub chains: Vec<ChainView>,
    /// Workers of this server offering to hold part of it.
    pub offered_by: Vec<String>,
}

/// One lane's chain.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChainView {
    pub lane: usize,
    pub epoch: u64,
    pub stages: Vec<StageView>,
    /// Sequences its engine runs and queues now.
    pub running: u64,
    pub waiting: u64,
}

/// One stage of a chain.
#[derive(Debug, Clone, Serialize, ToSchema)]
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
        .map(|(model, m)| {
            let chains: Vec<ChainView> = m
                .lanes
                .iter()
                .enumerate()
                .filter_map(|(lane, l)| {
                    let chain = l.cell.get()?;
                    let stats = l.engine.stats();
                    Some(ChainView {
                        lane,
                        epoch: chain.epoch,
                        stages: chain
                            .stages
                            .iter()
                            .map(|s| StageView {
                                worker: s.worker.clone(),
                                provider_id: s.provider.clone(),
                                first: s.layers.start,
                                end: s.layers.end,
                                measured: l.cell.measure(&s.worker),
                            })
                            .collect(),
                        running: stats.num_running,
                        waiting: stats.num_waiting,
                    })
                })
                .collect();
            let first = chains.first().filter(|c| c.lane == 0);
            PipelineView {
                offered_by: workers
                    .iter()
                    .filter(|w| w.parts.iter().any(|p| p.model == model))
                    .map(|w| w.id.clone())
                    .collect(),
                epoch: first.map_or(0, |c| c.epoch),
                stages: first.map(|c| c.stages.clone()).unwrap_or_default(),
                layers: m.sizes.n_layer,
                chains,
                model,
            }
        })
        .collect();
    Json(List::of(views))
}
