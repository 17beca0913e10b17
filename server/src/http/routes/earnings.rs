//! A provider's own money, over one of its worker tokens: what it earned
//! (`GET /v1/providers/earnings`: balance, pending and payable funds,
//! today's earnings, jobs and spot checks, connected workers; and over
//! time, `GET /v1/providers/earnings/history`) and its payouts (`POST /v1/providers/payouts` moves payable funds out of the
//! ledger as a journal transaction; `GET` lists them). Amounts are units.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::fleet::worker_token;
use super::market::billing;
use crate::http::api::bodies::{List, Moved};
use crate::http::api::json::ApiJson;
use crate::http::api::workers::WorkerView;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use money::ledger::accounts::{EarnedBucket, KindTotal};
use money::ledger::audit::Transaction;
use money::store::now;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/providers/earnings", get(earnings))
        .route("/v1/providers/earnings/history", get(history))
        .route("/v1/providers/payouts", get(payouts).post(payout))
}

/// A provider's spot checks, over its workers' records.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct ChecksSeen {
    pub checked: u64,
    pub passed: u64,
    pub failed: u64,
}

/// A provider's money and work, as its worker token sees them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Earnings {
    pub provider_id: String,
    /// The provider account's name.
    pub name: String,
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "1.25")]
    pub balance: i64,
    /// Of the balance, what it earned within the earnings window
    /// (`--earnings-window`): not final yet (a failed spot check can
    /// claw it back).
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.10")]
    pub pending: i64,
    /// What a payout may take now: the balance less what is pending.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "1.15")]
    pub payable: i64,
    /// Earned for work since midnight UTC.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.02")]
    pub earned_today: i64,
    /// Its entries by journal kind (`usage`: paid for tokens its workers
    /// delivered; `trade`: market fills; `penalty`: taken back;
    /// `payout`: paid out).
    pub totals: Vec<KindTotal>,
    /// Its reputation as the fleet measured it (bps; 10,000 = 1x): it
    /// wins placement, and under 1x it cuts pay.
    pub reputation_bps: i64,
    /// Jobs its workers finished and lost, over its history.
    pub jobs_ok: u64,
    pub jobs_lost: u64,
    /// Spot checks of its workers' answers (canaries included).
    pub checks: ChecksSeen,
    /// Its workers connected to this server.
    pub workers: Vec<WorkerView>,
}

/// What a provider earned: its balance, its entries by kind, its work and
/// checks, and its connected workers (authenticated by a worker token).
#[utoipa::path(get, path = "/v1/providers/earnings", tag = "providers",
    responses((status = 200, description = "The provider's earnings", body = Earnings), (status = 401, description = "Missing, wrong or revoked worker token", body = crate::http::error::ErrorResponse)),
    security(("worker_token" = [])))]
pub(crate) async fn earnings(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Earnings>, ApiError> {
    let token = worker_token(&state, &headers).await?;
    let ledger = &billing(&state)?.ledger;
    let account = ledger.account(&token.account_id).await?;
    let pending = ledger.pending_earnings(&account.id).await?;
    let t = now();
    let earned_today = ledger.earned_since(&account.id, t - t % 86_400).await?;
    let mut checks = ChecksSeen::default();
    for r in state.dispatch.spot.checker().records() {
        if r.provider_id == account.id {
            checks.checked += r.checked;
            checks.passed += r.passed;
            checks.failed += r.failed;
        }
    }
    let workers = state
        .fleet
        .list()
        .into_iter()
        .filter(|w| w.provider_id == account.id)
        .map(WorkerView::from)
        .collect();
    let standing = state.fleet.standing.get(&account.id);
    Ok(Json(Earnings {
        reputation_bps: standing.reputation_bps(),
        jobs_ok: standing.jobs_ok,
        jobs_lost: standing.jobs_lost,
        payable: account.available().saturating_sub(pending).max(0),
        totals: ledger.totals(&account.id).await?,
        provider_id: account.id,
        name: account.name,
        balance: account.balance,
        pending,
        earned_today,
        checks,
        workers,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct HistoryQuery {
    /// Hours back from now (default 24, at most 720).
    hours: Option<i64>,
    /// Seconds per bucket (default 3600; 60 to 86,400).
    bucket: Option<i64>,
}

/// What the provider earned over time, per bucket (its console page's
/// chart).
#[utoipa::path(get, path = "/v1/providers/earnings/history", tag = "providers", params(HistoryQuery),
    responses((status = 200, description = "Earnings per bucket, oldest first", body = List<EarnedBucket>), (status = 401, description = "Missing, wrong or revoked worker token", body = crate::http::error::ErrorResponse)),
    security(("worker_token" = [])))]
pub(crate) async fn history(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<List<EarnedBucket>>, ApiError> {
    let token = worker_token(&state, &headers).await?;
    let hours = q.hours.unwrap_or(24).clamp(1, 720);
    let bucket = q.bucket.unwrap_or(3600).clamp(60, 86_400);
    let data = billing(&state)?
        .ledger
        .earned_by_time(&token.account_id, now() - hours * 3600, bucket)
        .await?;
    Ok(Json(List::of(data)))
}

/// A payout a provider asks for.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PayoutRequest {
    /// Units to pay out (at most `payable`): `"1.50"`.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "1.50")]
    amount: i64,
    /// Where it goes or why, for the record (at most 200 characters).
    #[serde(default)]
    memo: String,
}

/// Pays out part of a provider's payable funds: a journal transaction of
/// kind `payout` from its account to `payouts` (money owed to it outside
/// the ledger). Pending earnings stay until the window passes.
#[utoipa::path(post, path = "/v1/providers/payouts", tag = "providers", request_body = PayoutRequest,
    responses((status = 201, description = "Recorded", body = Moved), (status = 400, description = "Bad amount", body = crate::http::error::ErrorResponse), (status = 402, description = "More than the payable funds", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing, wrong or revoked worker token", body = crate::http::error::ErrorResponse)),
    security(("worker_token" = [])))]
pub(crate) async fn payout(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PayoutRequest>,
) -> Result<Response, ApiError> {
    let token = worker_token(&state, &headers).await?;
    if req.memo.chars().count() > 200 {
        return Err(ApiError::invalid(
            "memo",
            "a memo is at most 200 characters",
        ));
    }
    let ledger = &billing(&state)?.ledger;
    let transaction = ledger
        .payout(&token.account_id, req.amount, &req.memo)
        .await?;
    let account = ledger.account(&token.account_id).await?;
    Ok((
        StatusCode::CREATED,
        Json(Moved {
            transaction,
            account,
        }),
    )
        .into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct PayoutQuery {
    /// Rows to return (default 50, at most 1000).
    limit: Option<i64>,
}

/// A provider's payouts, newest first.
#[utoipa::path(get, path = "/v1/providers/payouts", tag = "providers", params(PayoutQuery),
    responses((status = 200, description = "Its payout transactions", body = List<Transaction>), (status = 401, description = "Missing, wrong or revoked worker token", body = crate::http::error::ErrorResponse)),
    security(("worker_token" = [])))]
pub(crate) async fn payouts(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<PayoutQuery>,
) -> Result<Json<List<Transaction>>, ApiError> {
    let token = worker_token(&state, &headers).await?;
    let limit = q.limit.unwrap_or(50).clamp(1, 1000);
    let data = billing(&state)?
        .ledger
        .journal(Some(&token.account_id), Some("payout"), limit)
        .await?;
    Ok(Json(List::of(data)))
}
