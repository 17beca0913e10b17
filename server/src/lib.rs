//! The Synor Compute server: the OpenAI-compatible HTTP API in front of the
//! engine. `app(state)` builds the router (used by `main` and by the
//! in-process tests); `startup` loads models, binds and serves.

pub mod api;
pub mod config;
pub mod error;
pub mod routes;
pub mod startup;
pub mod state;
pub mod telemetry;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use tower_http::trace::TraceLayer;

use crate::state::AppState;

/// The full application router with its middleware.
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    routes::router()
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
