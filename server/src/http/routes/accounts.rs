//! Account routes. For API keys: `GET /v1/usage`, the caller's balance and
//! latest usage records. For admins: accounts (list, create, credit limit),
//! top-ups, provider penalties, journal queries and the ledger audit.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;

use super::market::billing;
use crate::http::api::bodies::{KeyUse, List, Moved, TenantUsage, UsageAnswer};
use crate::http::api::json::ApiJson;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::services::metering::Payer;
use money::ledger::accounts::{Account, AccountKind, SpendBucket, UsageRecord};
use money::ledger::audit::{Audit, Transaction};
use money::store::keys::KeyRecord;

/// Routes that API keys reach (mounted behind the key check).
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/usage", get(usage))
}

pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/accounts", get(list).post(create))
        .route("/admin/accounts/{id}", get(one).patch(update))
        .route("/admin/accounts/{id}/topup", post(top_up))
        .route("/admin/accounts/{id}/penalty", post(penalty))
        .route("/admin/journal", get(journal))
        .route("/admin/usage", get(admin_usage))
        .route("/admin/usage/spend", get(spend))
        .route("/admin/ledger/audit", get(audit))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct LimitQuery {
    /// Rows to return (default 50, at most 1000).
    limit: Option<i64>,
}

/// Rows to return.
fn rows(limit: Option<i64>) -> i64 {
    limit.unwrap_or(50).clamp(1, 1000)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct FilterQuery {
    /// Rows to return (default 50, at most 1000).
    limit: Option<i64>,
    /// Only rows of this account (journal: transactions touching it).
    account: Option<String>,
    /// Journal: only transactions of this kind (`usage`, `topup`,
    /// `penalty`, `clawback`, ...).
    kind: Option<String>,
    /// Usage: only records of this API key.
    key: Option<String>,
}

/// The caller's account (balance, held funds, credit limit, in units)
/// and its latest usage records, with the key's budget if it has one.
#[utoipa::path(get, path = "/v1/usage", tag = "billing", params(LimitQuery),
    responses((status = 200, description = "Balance and usage", body = UsageAnswer)),
    security(("api_key" = [])))]
pub(crate) async fn usage(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<UsageAnswer>, ApiError> {
    let b = billing(&state)?;
    let payer = Payer::of(key.as_deref());
    let account = b.ledger.account(&payer.account_id).await?;
    let records = b.ledger.usage(&payer.account_id, rows(q.limit)).await?;
    let key = key.map(|k| KeyUse {
        id: k.id.clone(),
        budget: k.budget,
        spent: k.spent,
    });
    Ok(Json(UsageAnswer {
        available: account.available(),
        account,
        key,
        object: "list",
        data: records.into_iter().map(TenantUsage::from).collect(),
    }))
}

/// Admin: every account.
#[utoipa::path(get, path = "/admin/accounts", tag = "admin",
    responses((status = 200, description = "Accounts", body = List<Account>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<List<Account>>, ApiError> {
    let data = billing(&state)?.ledger.accounts().await?;
    Ok(Json(List::of(data)))
}

/// Admin: one account.
#[utoipa::path(get, path = "/admin/accounts/{id}", tag = "admin",
    params(("id" = String, Path, description = "Account id")),
    responses((status = 200, description = "The account", body = Account), (status = 404, description = "No such account", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn one(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Account>, ApiError> {
    Ok(Json(billing(&state)?.ledger.account(&id).await?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateAccount {
    /// `user` (default) or `provider`.
    #[serde(default)]
    kind: Option<AccountKind>,
    name: String,
    /// How far below zero the balance may go, in units (default `"0"`).
    #[serde(default, with = "money::ledger::units")]
    #[schema(value_type = String, example = "0")]
    credit_limit: i64,
}

/// Admin: creates a user or provider account.
#[utoipa::path(post, path = "/admin/accounts", tag = "admin", request_body = CreateAccount,
    responses((status = 201, description = "Created", body = Account), (status = 400, description = "Invalid account", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CreateAccount>,
) -> Result<Response, ApiError> {
    let kind = req.kind.unwrap_or(AccountKind::User);
    if !matches!(kind, AccountKind::User | AccountKind::Provider) {
        return Err(ApiError::invalid(
            "kind",
            "accounts created here are `user` or `provider`",
        ));
    }
    if req.name.trim().is_empty() || req.name.len() > 128 {
        return Err(ApiError::invalid(
            "name",
            "an account name is 1-128 characters",
        ));
    }
    let a = billing(&state)?
        .ledger
        .create_account(kind, &req.name, req.credit_limit)
        .await?;
    Ok((StatusCode::CREATED, Json(a)).into_response())
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateAccount {
    /// How far below zero the balance may go, in units.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "10.00")]
    credit_limit: i64,
}

/// Admin: sets an account's credit limit.
#[utoipa::path(patch, path = "/admin/accounts/{id}", tag = "admin", request_body = UpdateAccount,
    params(("id" = String, Path, description = "Account id")),
    responses((status = 200, description = "Updated", body = Account), (status = 404, description = "No such account", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<UpdateAccount>,
) -> Result<Json<Account>, ApiError> {
    let ledger = &billing(&state)?.ledger;
    ledger.set_credit_limit(&id, req.credit_limit).await?;
    Ok(Json(ledger.account(&id).await?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TopUp {
    /// Units to move (> 0), as a decimal string: `"25.00"`.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "25.00")]
    amount: i64,
    #[serde(default)]
    memo: String,
}

/// Admin: credits an account (a journal transaction against `deposits`).
#[utoipa::path(post, path = "/admin/accounts/{id}/topup", tag = "admin", request_body = TopUp,
    params(("id" = String, Path, description = "Account id")),
    responses((status = 200, description = "The journal transaction and the account", body = Moved), (status = 400, description = "Invalid amount", body = crate::http::error::ErrorResponse), (status = 404, description = "No such account", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn top_up(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TopUp>,
) -> Result<Response, ApiError> {
    let ledger = &billing(&state)?.ledger;
    let tx = ledger.top_up(&id, req.amount, &req.memo).await?;
    transaction_answer(ledger, tx, &id).await
}

/// A journal transaction id with the account it moved.
async fn transaction_answer(
    ledger: &money::ledger::Ledger,
    tx: String,
    id: &str,
) -> Result<Response, ApiError> {
    let account = ledger.account(id).await?;
    Ok(Json(Moved {
        transaction: tx,
        account,
    })
    .into_response())
}

/// Admin: fines a provider (a journal transaction from the provider to the
/// treasury); refused beyond the provider's funds.
#[utoipa::path(post, path = "/admin/accounts/{id}/penalty", tag = "admin", request_body = TopUp,
    params(("id" = String, Path, description = "Provider account id")),
    responses((status = 200, description = "The journal transaction and the account", body = Moved), (status = 400, description = "Invalid amount or not a provider", body = crate::http::error::ErrorResponse), (status = 402, description = "More than the provider has", body = crate::http::error::ErrorResponse), (status = 404, description = "No such account", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn penalty(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TopUp>,
) -> Result<Response, ApiError> {
    let ledger = &billing(&state)?.ledger;
    let tx = ledger.penalize(&id, req.amount, &req.memo).await?;
    transaction_answer(ledger, tx, &id).await
}

/// Admin: the latest journal transactions with their entries.
#[utoipa::path(get, path = "/admin/journal", tag = "admin", params(FilterQuery),
    responses((status = 200, description = "Transactions, newest first", body = List<Transaction>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn journal(
    State(state): State<AppState>,
    Query(q): Query<FilterQuery>,
) -> Result<Json<List<Transaction>>, ApiError> {
    let data = billing(&state)?
        .ledger
        .journal(q.account.as_deref(), q.kind.as_deref(), rows(q.limit))
        .await?;
    Ok(Json(List::of(data)))
}

/// Admin: the latest usage records, of every account or of one account
/// and/or one key.
#[utoipa::path(get, path = "/admin/usage", tag = "admin", params(FilterQuery),
    responses((status = 200, description = "Usage records, newest first", body = List<UsageRecord>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn admin_usage(
    State(state): State<AppState>,
    Query(q): Query<FilterQuery>,
) -> Result<Json<List<UsageRecord>>, ApiError> {
    let data = billing(&state)?
        .ledger
        .usage_where(q.account.as_deref(), q.key.as_deref(), rows(q.limit))
        .await?;
    Ok(Json(List::of(data)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct SpendQuery {
    /// Only this account's requests.
    account: Option<String>,
    /// Only this key's requests.
    key: Option<String>,
    /// Hours back from now (default 24, at most 720).
    hours: Option<i64>,
    /// Seconds per bucket (default 3600; at least 60).
    bucket: Option<i64>,
}

/// Admin: what requests cost over time, per bucket (of every account, or
/// of one account and/or one key): the console's spend chart.
#[utoipa::path(get, path = "/admin/usage/spend", tag = "admin", params(SpendQuery),
    responses((status = 200, description = "Cost per bucket, oldest first", body = List<SpendBucket>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn spend(
    State(state): State<AppState>,
    Query(q): Query<SpendQuery>,
) -> Result<Json<List<SpendBucket>>, ApiError> {
    let hours = q.hours.unwrap_or(24).clamp(1, 720);
    let bucket = q.bucket.unwrap_or(3600).clamp(60, 86_400);
    let since = money::store::now() - hours * 3600;
    let data = billing(&state)?
        .ledger
        .spend(q.account.as_deref(), q.key.as_deref(), since, bucket)
        .await?;
    Ok(Json(List::of(data)))
}

/// Admin: checks every ledger invariant against the journal.
#[utoipa::path(get, path = "/admin/ledger/audit", tag = "admin",
    responses((status = 200, description = "Violations (empty when all hold)", body = Audit), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn audit(State(state): State<AppState>) -> Result<Json<Audit>, ApiError> {
    Ok(Json(billing(&state)?.ledger.audit().await?))
}
