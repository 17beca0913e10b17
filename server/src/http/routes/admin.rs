//! Admin API (needs `Authorization: Bearer <admin token>`): create, list and
//! revoke API keys (a created key's secret is returned once). Models are
//! `models_admin`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Deserialize;

use crate::http::api::bodies::{CreatedKey, List, Revoked};
use crate::http::api::json::ApiJson;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use money::ledger::amount;
use money::store::Db;
use money::store::keys::{KeyRecord, Limits, NewKey};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/keys", get(list).post(create))
        .route("/admin/keys/{id}", delete(revoke))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateKey {
    name: String,
    #[serde(default)]
    rpm_limit: Option<i64>,
    #[serde(default)]
    tpm_limit: Option<i64>,
    #[serde(default)]
    max_concurrent: Option<i64>,
    /// The user account the key spends from (default: a new account).
    #[serde(default)]
    account_id: Option<String>,
    /// Most the key may spend, in units (default: no budget).
    #[serde(default, with = "money::ledger::units::opt")]
    #[schema(value_type = Option<String>, example = "5.00")]
    budget: Option<i64>,
}

/// The key database (admin routes are behind the admin layer).
fn keys_db(state: &AppState) -> Result<&Db, ApiError> {
    state
        .auth
        .db
        .as_ref()
        .ok_or_else(|| ApiError::invalid("key", "this server runs in open mode, without API keys"))
}

fn storage(e: money::store::StoreError) -> ApiError {
    ApiError::Storage(e.to_string())
}

/// Creates an API key; its secret is in the answer, once.
#[utoipa::path(post, path = "/admin/keys", tag = "admin", request_body = CreateKey,
    responses((status = 201, description = "Created, with `key`", body = CreatedKey), (status = 400, description = "Bad name or limits", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn create(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CreateKey>,
) -> Result<Response, ApiError> {
    let db = keys_db(&state)?;
    if req.name.trim().is_empty() || req.name.len() > 128 {
        return Err(ApiError::invalid("name", "a key name is 1-128 characters"));
    }
    let limits = Limits {
        rpm: req.rpm_limit,
        tpm: req.tpm_limit,
        max_concurrent: req.max_concurrent,
    };
    for (field, v) in [
        ("rpm_limit", limits.rpm),
        ("tpm_limit", limits.tpm),
        ("max_concurrent", limits.max_concurrent),
    ] {
        if v.is_some_and(|v| v < 1) {
            return Err(ApiError::invalid(
                field,
                "limits are at least 1 (omit for unlimited)",
            ));
        }
    }
    if let Some(b) = req.budget {
        amount::check_bound("budget", b, amount::MAX_BALANCE)
            .map_err(|m| ApiError::invalid("budget", m))?;
    }
    let new = NewKey {
        name: req.name,
        limits,
        account_id: req.account_id,
        budget: req.budget,
    };
    let (rec, secret) = db.create_key(&new).await.map_err(|e| {
        if let money::store::StoreError::UnknownAccount(a) = &e {
            ApiError::invalid("account_id", format!("no user account `{a}`"))
        } else {
            storage(e)
        }
    })?;
    let body = CreatedKey {
        record: rec,
        key: secret,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Lists API keys (never their secrets).
#[utoipa::path(get, path = "/admin/keys", tag = "admin",
    responses((status = 200, description = "Every key", body = List<KeyRecord>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<List<KeyRecord>>, ApiError> {
    let db = keys_db(&state)?;
    let keys = db.list_keys().await.map_err(storage)?;
    Ok(Json(List::of(keys)))
}

/// Revokes an API key.
#[utoipa::path(delete, path = "/admin/keys/{id}", tag = "admin",
    params(("id" = String, Path, description = "The key's id")),
    responses((status = 200, description = "Revoked", body = Revoked), (status = 404, description = "No such active key", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn revoke(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Revoked>, ApiError> {
    let db = keys_db(&state)?;
    if !db.revoke_key(&id).await.map_err(storage)? {
        return Err(ApiError::KeyNotFound(id));
    }
    Ok(Json(Revoked { id, revoked: true }))
}
