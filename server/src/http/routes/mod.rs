//! The HTTP routes: each resource module owns its `router()`; this one
//! merges them and answers unknown paths in the OpenAI error shape.

pub mod accounts;
pub mod admin;
pub mod cache;
pub mod chat;
pub mod completions;
pub mod console;
pub mod earnings;
pub mod embeddings;
pub mod fleet;
pub mod health;
pub mod home;
pub mod market;
pub mod market_admin;
pub mod model_files;
pub mod models;
pub mod models_admin;
pub mod overview;
pub mod pipelines;
pub mod provide;
pub mod providers;
pub mod web;

use axum::Router;

use crate::http::error::ApiError;
use crate::http::state::AppState;

/// Every route: the `/v1` API behind the key check, then health, metrics
/// and admin routes (the OpenAPI document's routes are `openapi::router`).
pub fn router(state: &AppState) -> Router<AppState> {
    let v1 = Router::new()
        .merge(chat::router())
        .merge(completions::router())
        .merge(embeddings::router())
        .merge(models::router())
        .merge(market::router())
        .merge(accounts::router())
        .route_layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
            crate::http::auth::require_key,
        ));
    // One layer guards every admin route (throttled token check).
    let admin = Router::new()
        .merge(admin::router())
        .merge(models_admin::admin_router())
        .merge(market::admin_router())
        .merge(market_admin::admin_router())
        .merge(overview::admin_router())
        .merge(accounts::admin_router())
        .merge(cache::admin_router())
        .merge(providers::admin_router())
        .merge(fleet::admin_router())
        .merge(pipelines::admin_router())
        .route_layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
            crate::http::auth::admin::require_admin,
        ));
    Router::new()
        .merge(v1)
        .merge(admin)
        .merge(home::router())
        .merge(health::router())
        .merge(fleet::router())
        .merge(earnings::router())
        .merge(model_files::router())
        .merge(console::router())
        .merge(web::router())
        .merge(provide::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::RouteNotFound(uri.path().to_string())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
