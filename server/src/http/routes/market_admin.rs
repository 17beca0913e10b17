//! The admin's view of the market (the console's market page): the same
//! prices, books, trades and price history API keys read under
//! `/v1/market`, behind the admin check instead of a key, and every
//! account's resting orders, which an admin may cancel.

use axum::extract::{Path, Query, State};
use axum::routing::{delete, get};
use axum::{Json, Router};

use super::market::{self, InstrumentQuery, ModelPrice, billing};
use crate::http::api::bodies::{Cancelled, List};
use crate::http::error::ApiError;
use crate::http::state::AppState;
use money::market::book::Order;
use money::market::{PricePoint, Spot, Trade};

pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/market/prices", get(prices))
        .route("/admin/market/book", get(book))
        .route("/admin/market/trades", get(trades))
        .route("/admin/market/history", get(history))
        .route("/admin/market/orders", get(orders))
        .route("/admin/market/orders/{id}", delete(cancel))
}

/// Admin: the prices of every served model (as `GET /v1/market/prices`).
#[utoipa::path(get, path = "/admin/market/prices", tag = "admin",
    responses((status = 200, description = "Prices per model", body = List<ModelPrice>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn prices(state: State<AppState>) -> Result<Json<List<ModelPrice>>, ApiError> {
    market::prices(state).await
}

/// Admin: an instrument's order book (as `GET /v1/market/book`).
#[utoipa::path(get, path = "/admin/market/book", tag = "admin", params(InstrumentQuery),
    responses((status = 200, description = "The book", body = Spot), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn book(
    state: State<AppState>,
    q: Query<InstrumentQuery>,
) -> Result<Json<Spot>, ApiError> {
    market::book(state, q).await
}

/// Admin: an instrument's latest trades (as `GET /v1/market/trades`).
#[utoipa::path(get, path = "/admin/market/trades", tag = "admin", params(InstrumentQuery),
    responses((status = 200, description = "Trades, newest first", body = List<Trade>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn trades(
    state: State<AppState>,
    q: Query<InstrumentQuery>,
) -> Result<Json<List<Trade>>, ApiError> {
    market::trades(state, q).await
}

/// Admin: the house provider's posted prices over time (as
/// `GET /v1/market/history`).
#[utoipa::path(get, path = "/admin/market/history", tag = "admin", params(InstrumentQuery),
    responses((status = 200, description = "Price samples, newest first", body = List<PricePoint>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn history(
    state: State<AppState>,
    q: Query<InstrumentQuery>,
) -> Result<Json<List<PricePoint>>, ApiError> {
    market::history(state, q).await
}

/// Admin: every resting order of an instrument, of any account (bids,
/// then asks, best first).
#[utoipa::path(get, path = "/admin/market/orders", tag = "admin", params(InstrumentQuery),
    responses((status = 200, description = "Resting orders", body = List<Order>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn orders(
    State(state): State<AppState>,
    Query(q): Query<InstrumentQuery>,
) -> Result<Json<List<Order>>, ApiError> {
    let mut data = billing(&state)?.market.orders(&q.instrument).await;
    data.truncate(q.limit() as usize);
    Ok(Json(List::of(data)))
}

/// Admin: cancels any account's open order (a bid's hold is released).
#[utoipa::path(delete, path = "/admin/market/orders/{id}", tag = "admin",
    params(("id" = String, Path, description = "The order's id")),
    responses((status = 200, description = "Cancelled", body = Cancelled), (status = 404, description = "No such open order", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Cancelled>, ApiError> {
    let order = billing(&state)?.market.cancel(&id, None).await?;
    Ok(Json(Cancelled {
        order,
        cancelled: true,
    }))
}
