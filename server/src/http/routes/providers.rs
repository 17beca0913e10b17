//! Providers' worker tokens (admin): `POST /admin/providers` makes a
//! provider account in the ledger with a worker token (or a new token for
//! an existing provider), `GET /admin/providers/tokens` lists tokens (with
//! their quarantine), `DELETE /admin/providers/tokens/{id}` revokes one
//! (its live workers are closed at once) and `DELETE
//! /admin/providers/tokens/{id}/quarantine` clears a quarantine. A token's
//! secret is in the creating answer only; workers present it at the
//! gateway.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::market::billing;
use crate::http::api::bodies::{List, Revoked};
use crate::http::api::json::ApiJson;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use money::ledger::accounts::AccountKind;
use money::store::StoreError;
use money::store::workers::WorkerToken;

pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/providers", post(create))
        .route("/admin/providers/tokens", get(list))
        .route("/admin/providers/tokens/{id}", delete(revoke))
        .route(
            "/admin/providers/tokens/{id}/quarantine",
            delete(clear_quarantine),
        )
}

/// A token whose quarantine was lifted.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Cleared {
    pub id: String,
    pub quarantined: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateProvider {
    /// The provider's name (a new account), or the token's name when
    /// `account_id` names an existing provider.
    name: String,
    /// An existing provider account to add a token to (default: a new
    /// provider account).
    #[serde(default)]
    account_id: Option<String>,
}

/// A worker token with its secret (shown once).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedWorkerToken {
    #[serde(flatten)]
    pub record: WorkerToken,
    /// The secret: `synor worker --token <token>`.
    pub token: String,
}

fn storage(e: StoreError) -> ApiError {
    match e {
        StoreError::UnknownAccount(a) => {
            ApiError::invalid("account_id", format!("no provider account `{a}`"))
        }
        e @ (StoreError::UnsupportedUrl(_)
        | StoreError::Folder { .. }
        | StoreError::Sql(_)
        | StoreError::Migrate(_)) => ApiError::Storage(e.to_string()),
    }
}

/// Creates a provider account and a worker token (or a token for an
/// existing provider); the token's secret is in the answer, once.
#[utoipa::path(post, path = "/admin/providers", tag = "admin", request_body = CreateProvider,
    responses((status = 201, description = "Created, with `token`", body = CreatedWorkerToken), (status = 400, description = "Bad name or account", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CreateProvider>,
) -> Result<Response, ApiError> {
    if req.name.trim().is_empty() || req.name.len() > 128 {
        return Err(ApiError::invalid("name", "a name is 1-128 characters"));
    }
    let ledger = &billing(&state)?.ledger;
    let account = match req.account_id {
        Some(a) => a,
        None => {
            ledger
                .create_account(AccountKind::Provider, &req.name, 0)
                .await?
                .id
        }
    };
    let (record, token) = ledger
        .db
        .create_worker_token(&account, &req.name)
        .await
        .map_err(storage)?;
    let body = CreatedWorkerToken { record, token };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Every worker token (never their secrets), oldest first.
#[utoipa::path(get, path = "/admin/providers/tokens", tag = "admin",
    responses((status = 200, description = "Every token", body = List<WorkerToken>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn list(
    State(state): State<AppState>,
) -> Result<Json<List<WorkerToken>>, ApiError> {
    let tokens = billing(&state)?
        .ledger
        .db
        .list_worker_tokens()
        .await
        .map_err(storage)?;
    Ok(Json(List::of(tokens)))
}

/// Revokes a worker token: its live workers are closed at once (on every
/// replica within seconds) and refused from then on.
#[utoipa::path(delete, path = "/admin/providers/tokens/{id}", tag = "admin",
    params(("id" = String, Path, description = "The token's id")),
    responses((status = 200, description = "Revoked", body = Revoked), (status = 404, description = "No such active token", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn revoke(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Revoked>, ApiError> {
    let done = billing(&state)?
        .ledger
        .db
        .revoke_worker_token(&id)
        .await
        .map_err(storage)?;
    if !done {
        return Err(ApiError::NotFound {
            what: "worker token",
            id,
        });
    }
    crate::services::sanctions::revoked(&state.fleet, &id).await;
    Ok(Json(Revoked { id, revoked: true }))
}

/// Lifts a worker token's quarantine: its workers may connect again (and
/// are calibrated afresh).
#[utoipa::path(delete, path = "/admin/providers/tokens/{id}/quarantine", tag = "admin",
    params(("id" = String, Path, description = "The token's id")),
    responses((status = 200, description = "Cleared", body = Cleared), (status = 404, description = "No such quarantined token", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn clear_quarantine(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Cleared>, ApiError> {
    let db = &billing(&state)?.ledger.db;
    let done = crate::services::sanctions::clear(db, &state.fleet, &id)
        .await
        .map_err(storage)?;
    if !done {
        return Err(ApiError::NotFound {
            what: "quarantined worker token",
            id,
        });
    }
    Ok(Json(Cleared {
        id,
        quarantined: false,
    }))
}
