//! Market routes. For API keys: current prices of every served model, an
//! instrument's order book, trades and price history, and posting or
//! cancelling bids. For admins: asks on behalf of providers, the region
//! electricity table and provider profiles.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::http::api::bodies::{Cancelled, List, Placed, RegionSet, Regions};
use crate::http::api::json::ApiJson;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::services::metering::{Billing, Payer};
use engine::registry::ModelKind;
use money::ledger::units::micros;
use money::ledger::{HOUSE_PROVIDER, Prices};
use money::market::book::Side;
use money::market::pricing::{CostProfile, Occupancy, demand_bps};
use money::market::{NewOrder, PricePoint, Provider, Spot, Trade};
use money::store::keys::KeyRecord;

/// Routes that API keys reach (mounted behind the key check).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/market/prices", get(prices))
        .route("/v1/market/book", get(book))
        .route("/v1/market/trades", get(trades))
        .route("/v1/market/history", get(history))
        .route("/v1/market/orders", post(post_bid))
        .route("/v1/market/orders/{id}", delete(cancel))
        .route("/v1/market/contracts", get(contracts))
}

/// Admin market routes.
pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/market/orders", post(post_ask))
        .route("/admin/market/regions", get(regions))
        .route("/admin/market/regions/{region}", put(set_region))
        .route("/admin/market/providers", get(providers))
        .route("/admin/market/providers/{id}", put(set_provider))
}

pub(crate) fn billing(state: &AppState) -> Result<&Arc<Billing>, ApiError> {
    state
        .billing
        .as_ref()
        .ok_or_else(|| ApiError::invalid("model", "this server does not meter requests"))
}

/// The prices of one served model right now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ModelPrice {
    model: String,
    /// Ticks per million tokens, fee included.
    prices: Prices,
    /// The same on preemptible capacity (may be interrupted), at a discount.
    preemptible_prices: Prices,
    /// Demand multiplier (bps; 10000 = 1x).
    demand_bps: i64,
    /// Protocol fee (bps).
    fee_bps: i64,
    spot: Spot,
}

/// Current prices of every served model (the house provider's quote under
/// its current load) with the spot market's best bid, ask and last trade.
#[utoipa::path(get, path = "/v1/market/prices", tag = "market",
    responses((status = 200, description = "Prices per model", body = List<ModelPrice>)),
    security(("api_key" = [])))]
pub(crate) async fn prices(
    State(state): State<AppState>,
) -> Result<Json<List<ModelPrice>>, ApiError> {
    let b = billing(&state)?;
    let mut data = Vec::new();
    for m in state.models.list() {
        let load = match &m.kind {
            ModelKind::Text(e) => b.load_of(e),
            ModelKind::Embedding(_) => Occupancy::default(),
        };
        let q = b.quote(&m.name, load)?;
        let pre = b.market.quote(HOUSE_PROVIDER, &m.name, load, true)?;
        data.push(ModelPrice {
            preemptible_prices: pre.prices,
            spot: b.market.spot(&m.name, 5).await,
            model: m.name,
            prices: q.prices,
            demand_bps: demand_bps(load),
            fee_bps: q.fee_bps,
        });
    }
    Ok(Json(List::of(data)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct InstrumentQuery {
    /// A served text model's name.
    pub(crate) instrument: String,
    /// Price levels (book) or rows (trades, history, orders); default 20,
    /// at most 500.
    limit: Option<i64>,
}

impl InstrumentQuery {
    pub(crate) fn limit(&self) -> i64 {
        self.limit.unwrap_or(20).clamp(1, 500)
    }
}

/// An instrument's order book: best bid and ask, last trade, price levels.
#[utoipa::path(get, path = "/v1/market/book", tag = "market", params(InstrumentQuery),
    responses((status = 200, description = "The book", body = Spot)),
    security(("api_key" = [])))]
pub(crate) async fn book(
    State(state): State<AppState>,
    Query(q): Query<InstrumentQuery>,
) -> Result<Json<Spot>, ApiError> {
    let b = billing(&state)?;
    Ok(Json(b.market.spot(&q.instrument, q.limit() as usize).await))
}

/// An instrument's latest trades, newest first.
#[utoipa::path(get, path = "/v1/market/trades", tag = "market", params(InstrumentQuery),
    responses((status = 200, description = "Trades", body = List<Trade>)),
    security(("api_key" = [])))]
pub(crate) async fn trades(
    State(state): State<AppState>,
    Query(q): Query<InstrumentQuery>,
) -> Result<Json<List<Trade>>, ApiError> {
    let b = billing(&state)?;
    let data = b.market.trades(&q.instrument, q.limit()).await?;
    Ok(Json(List::of(data)))
}

/// The house provider's posted prices over time, newest first.
#[utoipa::path(get, path = "/v1/market/history", tag = "market", params(InstrumentQuery),
    responses((status = 200, description = "Price samples", body = List<PricePoint>)),
    security(("api_key" = [])))]
pub(crate) async fn history(
    State(state): State<AppState>,
    Query(q): Query<InstrumentQuery>,
) -> Result<Json<List<PricePoint>>, ApiError> {
    let b = billing(&state)?;
    let data = b.market.history(&q.instrument, q.limit()).await?;
    Ok(Json(List::of(data)))
}

/// An order as posted.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostOrder {
    /// A served text model's name.
    instrument: String,
    /// Limit price per million tokens, in units: `"0.40"`.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.40")]
    price: i64,
    /// Tokens per second.
    quantity: u64,
    /// Bids: among equal prices, higher first.
    #[serde(default)]
    priority: i64,
    /// Seconds the order stays valid (default 3600, at most 30 days).
    #[serde(default)]
    expires_in: Option<i64>,
    /// Asks: preemptible capacity.
    #[serde(default)]
    interruptible: bool,
    /// Admin asks only: the provider account that sells.
    #[serde(default)]
    account_id: Option<String>,
}

fn new_order(
    side: Side,
    account_id: String,
    key_id: Option<String>,
    o: PostOrder,
) -> Result<NewOrder, ApiError> {
    let ttl = o.expires_in.unwrap_or(3600);
    if !(1..=30 * 86_400).contains(&ttl) {
        return Err(ApiError::invalid(
            "expires_in",
            "expires_in is 1 s to 30 days",
        ));
    }
    Ok(NewOrder {
        side,
        instrument: o.instrument,
        account_id,
        key_id,
        price: o.price,
        quantity: o.quantity,
        priority: o.priority,
        interruptible: o.interruptible,
        expires_at: money::store::now() + ttl,
    })
}

async fn submit(state: &AppState, order: NewOrder) -> Result<Response, ApiError> {
    // Instruments are the served text models: nothing else can be traded.
    if state.models.text(&order.instrument).is_err() {
        return Err(ApiError::invalid(
            "instrument",
            format!(
                "no served text model `{}` to trade (see GET /v1/models)",
                order.instrument
            ),
        ));
    }
    let (placed, fills) = billing(state)?.market.submit(order).await?;
    let body = Placed {
        order: placed,
        fills,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Posts a bid from the caller's account; it matches resting asks at
/// their prices (price-time priority), and what is left rests. The bid's
/// worst case (quantity x price x time to expiry) is held on the account
/// (402 when it cannot cover it); each fill is billed from that hold, and
/// the rest is released when the bid is filled, cancelled or expires.
/// Each fill is a contract (`GET /v1/market/contracts`): the caller's
/// requests on the instrument then run on the seller's capacity at the
/// trade price, already paid, while it has room.
#[utoipa::path(post, path = "/v1/market/orders", tag = "market", request_body = PostOrder,
    responses((status = 201, description = "The order as placed, and its fills", body = Placed), (status = 400, description = "Invalid order", body = crate::http::error::ErrorResponse), (status = 402, description = "The account cannot cover the bid's worst case", body = crate::http::error::ErrorResponse)),
    security(("api_key" = [])))]
pub(crate) async fn post_bid(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
    ApiJson(o): ApiJson<PostOrder>,
) -> Result<Response, ApiError> {
    if o.account_id.is_some() {
        return Err(ApiError::invalid(
            "account_id",
            "a bid is posted from the key's own account",
        ));
    }
    let payer = Payer::of(key.as_deref());
    let order = new_order(Side::Bid, payer.account_id, payer.key_id, o)?;
    submit(&state, order).await
}

/// The caller's live contracts: capacity its filled bids bought (tokens
/// per second until their end, at the trade price). Its requests on the
/// instrument run on the seller's capacity, prepaid, while a contract has
/// room (`room`: tokens it can cover now; it refills at `quantity` a
/// second, up to ten seconds' worth).
#[utoipa::path(get, path = "/v1/market/contracts", tag = "market",
    responses((status = 200, description = "Live contracts", body = List<money::market::contracts::Contract>)),
    security(("api_key" = [])))]
pub(crate) async fn contracts(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
) -> Result<Json<List<money::market::contracts::Contract>>, ApiError> {
    let payer = Payer::of(key.as_deref());
    let data = billing(&state)?
        .market
        .contracts(Some(&payer.account_id))
        .await;
    Ok(Json(List::of(data)))
}

/// Cancels one of the caller's open orders.
#[utoipa::path(delete, path = "/v1/market/orders/{id}", tag = "market",
    params(("id" = String, Path, description = "The order's id")),
    responses((status = 200, description = "Cancelled", body = Cancelled), (status = 404, description = "No such open order of yours", body = crate::http::error::ErrorResponse)),
    security(("api_key" = [])))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
    Path(id): Path<String>,
) -> Result<Json<Cancelled>, ApiError> {
    let payer = Payer::of(key.as_deref());
    let o = billing(&state)?
        .market
        .cancel(&id, Some(&payer.account_id))
        .await?;
    Ok(Json(Cancelled {
        order: o,
        cancelled: true,
    }))
}

/// Admin: posts an ask for a provider account.
#[utoipa::path(post, path = "/admin/market/orders", tag = "admin", request_body = PostOrder,
    responses((status = 201, description = "The order as placed, and its fills", body = Placed), (status = 400, description = "Invalid order", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn post_ask(
    State(state): State<AppState>,
    ApiJson(o): ApiJson<PostOrder>,
) -> Result<Response, ApiError> {
    let b = billing(&state)?;
    let id = o
        .account_id
        .clone()
        .ok_or_else(|| ApiError::invalid("account_id", "an ask names its provider account"))?;
    if b.ledger.account(&id).await?.kind != "provider" {
        return Err(ApiError::invalid(
            "account_id",
            "asks come from provider accounts",
        ));
    }
    submit(&state, new_order(Side::Ask, id, None, o)?).await
}

/// Admin: electricity prices by region (micro-units per kWh).
#[utoipa::path(get, path = "/admin/market/regions", tag = "admin",
    responses((status = 200, description = "Region -> price", body = Regions), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn regions(State(state): State<AppState>) -> Result<Json<Regions>, ApiError> {
    let regions = billing(&state)?.market.regions();
    Ok(Json(Regions {
        regions: regions
            .into_iter()
            .map(|(r, m)| (r, micros::show(m)))
            .collect(),
    }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegionPrice {
    /// Electricity price per kWh, in units (at most 6 decimals): `"0.12"`.
    #[serde(with = "money::ledger::units::micros")]
    #[schema(value_type = String, example = "0.12")]
    price_per_kwh: i64,
}

/// Admin: sets (or adds) a region's electricity price.
#[utoipa::path(put, path = "/admin/market/regions/{region}", tag = "admin", request_body = RegionPrice,
    params(("region" = String, Path, description = "Region name")),
    responses((status = 200, description = "Updated", body = RegionSet), (status = 400, description = "Invalid price", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn set_region(
    State(state): State<AppState>,
    Path(region): Path<String>,
    ApiJson(p): ApiJson<RegionPrice>,
) -> Result<Json<RegionSet>, ApiError> {
    billing(&state)?
        .market
        .set_region_price(&region, p.price_per_kwh)
        .await?;
    Ok(Json(RegionSet {
        region,
        price_per_kwh: micros::show(p.price_per_kwh),
    }))
}

/// Admin: every provider's cost profile and standing.
#[utoipa::path(get, path = "/admin/market/providers", tag = "admin",
    responses((status = 200, description = "Providers", body = List<Provider>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn providers(
    State(state): State<AppState>,
) -> Result<Json<List<Provider>>, ApiError> {
    let data = billing(&state)?.market.providers();
    Ok(Json(List::of(data)))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetProvider {
    profile: CostProfile,
}

/// Admin: sets a provider account's cost profile (its reputation and
/// uptime are measured from the fleet, not set).
#[utoipa::path(put, path = "/admin/market/providers/{id}", tag = "admin", request_body = SetProvider,
    params(("id" = String, Path, description = "The provider's account id")),
    responses((status = 200, description = "Updated", body = Provider), (status = 400, description = "Invalid profile", body = crate::http::error::ErrorResponse), (status = 404, description = "No such provider account", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn set_provider(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(p): ApiJson<SetProvider>,
) -> Result<Json<Provider>, ApiError> {
    let market = &billing(&state)?.market;
    let (reputation_bps, uptime_bps) = market.standing_of(&id);
    let provider = Provider {
        account_id: id,
        profile: p.profile,
        reputation_bps,
        uptime_bps,
    };
    market.set_provider(provider.clone()).await?;
    Ok(Json(provider))
}
