//! The HTTP routes: each resource module owns its `router()`; this one
//! merges them and answers unknown paths in the OpenAI error shape.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod health;
pub mod models;

use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;

/// Every route of the public API.
pub fn router() -> Router<AppState> {
    Router::new()
        .merge(chat::router())
        .merge(completions::router())
        .merge(embeddings::router())
        .merge(models::router())
        .merge(health::router())
        .merge(crate::metrics::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::RouteNotFound(uri.path().to_string())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
