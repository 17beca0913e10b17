//! Admin routes of the response cache: statistics, flushing (everything,
//! a tenant scope, a model), the semantic policy (threshold, verifier,
//! alignment, the bound on wrong answers), and marking a model's
//! cache as shared across tenants.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use crate::cache::{ResponseCache, Tier};
use crate::http::api::bodies::{
    Bounded, CacheStats, Flushed, Quartiles, Removed, SemanticSize, SharedSet, ThresholdSet,
    TierCounts, TierSize,
};
use crate::http::api::json::ApiJson;
use crate::http::error::ApiError;
use crate::http::state::AppState;

pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/cache", get(stats))
        .route("/admin/cache/flush", post(flush))
        .route("/admin/cache/threshold", put(threshold))
        .route("/admin/cache/shared/{model}", put(shared))
}

fn cache(state: &AppState) -> Result<Arc<ResponseCache>, ApiError> {
    state
        .cache
        .clone()
        .ok_or_else(|| ApiError::invalid("cache", "the response cache is off (--no-cache)"))
}

/// Admin: per-tier hits, misses, evictions, sizes and mean lookup time,
/// and the semantic threshold.
#[utoipa::path(get, path = "/admin/cache", tag = "admin",
    responses((status = 200, description = "Cache statistics", body = CacheStats), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn stats(State(state): State<AppState>) -> Result<Json<CacheStats>, ApiError> {
    let c = cache(&state)?;
    c.settle_l1().await;
    let (b1, n1, b2, n2) = c.sizes();
    let tier = |name: &str, s: &crate::cache::TierStats| TierCounts {
        tier: name.to_string(),
        hits: s.hits.get(),
        misses: s.misses.get(),
        evictions: s.evictions.get(),
        mean_lookup_us: s.mean_lookup_us(),
    };
    let mut tiers: Vec<_> = Tier::ALL
        .iter()
        .map(|t| tier(t.as_str(), &c.stats()[*t as usize]))
        .collect();
    tiers.push(tier("semantic", c.semantic_stats()));
    Ok(Json(CacheStats {
        tiers,
        l1: TierSize {
            bytes: b1,
            entries: n1,
        },
        l2: TierSize {
            bytes: b2,
            entries: n2,
        },
        semantic: {
            let (default, models) = c.policies_set();
            let rejections = crate::cache::verify::Reject::ALL
                .iter()
                .zip(&c.semantic_counts.rejections)
                .map(|(r, n)| (r.as_str().to_string(), n.get()))
                .collect();
            let bounded = c
                .semantic_counts
                .learned_all()
                .into_iter()
                .map(|(m, counts)| {
                    let (error_rate, lo, hi) = counts.error_rate();
                    let b = Bounded {
                        counts,
                        error_rate,
                        error_interval: [lo, hi],
                    };
                    (m, b)
                })
                .collect();
            SemanticSize {
                entries: c.semantic_len(),
                threshold: default.threshold,
                verify: default.verify,
                align: default.align,
                models,
                rejections,
                delta: default.delta,
                bounded,
                learned_thresholds: Quartiles::of(c.semantic_thresholds(false)),
                learned_judge_cuts: Quartiles::of(c.semantic_thresholds(true)),
            }
        },
        shared_models: c.shared_models(),
    }))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Flush {
    /// Only this tenant scope (an account id, or `shared`).
    #[serde(default)]
    scope: Option<String>,
    /// Only this model.
    #[serde(default)]
    model: Option<String>,
}

/// Admin: removes cached answers from every tier (all, or of a scope
/// and/or a model).
#[utoipa::path(post, path = "/admin/cache/flush", tag = "admin", request_body = Flush,
    responses((status = 200, description = "Entries removed per tier", body = Flushed), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn flush(
    State(state): State<AppState>,
    ApiJson(f): ApiJson<Flush>,
) -> Result<Json<Flushed>, ApiError> {
    let c = cache(&state)?;
    let [l1, l2, l3, semantic] = c.flush(f.scope.as_deref(), f.model.as_deref()).await;
    Ok(Json(Flushed {
        removed: Removed {
            l1,
            l2,
            l3,
            semantic,
        },
    }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Threshold {
    /// Cosine similarity a semantic candidate needs (0-1).
    #[serde(default)]
    threshold: Option<f32>,
    /// Whether candidates must also pass the verifier.
    #[serde(default)]
    verify: Option<bool>,
    /// Align differing topic words by their vectors at this similarity
    /// (0-1; 0 turns it off: only the same stems match).
    #[serde(default)]
    align: Option<f32>,
    /// The share of near matches that may be served a wrong answer (0-1,
    /// e.g. 0.01; 0 turns the bound off). Under a bound, near matches are
    /// served only as far as verification by the served model has learned
    /// they may be; the others are generated and compared.
    #[serde(default)]
    delta: Option<f32>,
    /// Put each near match that passes the verifier's structure to the
    /// model as a judge, serving it when its chance that both questions
    /// get the same answer is at least this (0-1; 0 turns it off). A
    /// bound, when also set, waits while a judge is on.
    #[serde(default)]
    judge: Option<f32>,
    /// Only this model (absent: the default of every model without its own).
    #[serde(default)]
    model: Option<String>,
}

/// Admin: sets the semantic policy (threshold and/or verifier), the
/// default or one model's.
#[utoipa::path(put, path = "/admin/cache/threshold", tag = "admin", request_body = Threshold,
    responses((status = 200, description = "Updated", body = ThresholdSet), (status = 400, description = "Out of range or empty", body = crate::http::error::ErrorResponse), (status = 404, description = "No such model", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn threshold(
    State(state): State<AppState>,
    ApiJson(t): ApiJson<Threshold>,
) -> Result<Json<ThresholdSet>, ApiError> {
    let c = cache(&state)?;
    let in_range = |x: Option<f32>| x.is_none_or(|x| (0.0..=1.0).contains(&x));
    if !in_range(t.threshold) {
        return Err(ApiError::invalid(
            "threshold",
            "a threshold is between 0 and 1",
        ));
    }
    if !in_range(t.align) {
        return Err(ApiError::invalid(
            "align",
            "an alignment is between 0 and 1",
        ));
    }
    if !t.delta.is_none_or(|d| (0.0..1.0).contains(&d)) {
        return Err(ApiError::invalid(
            "delta",
            "a bound on wrong answers is at least 0 and under 1",
        ));
    }
    if !in_range(t.judge) {
        return Err(ApiError::invalid(
            "judge",
            "a judge's cut is between 0 and 1",
        ));
    }
    let fields = [t.threshold, t.align, t.delta, t.judge];
    if t.verify.is_none() && fields.iter().all(Option::is_none) {
        return Err(ApiError::invalid(
            "threshold",
            "set `threshold`, `verify`, `align`, `delta` or `judge`",
        ));
    }
    if let Some(m) = &t.model {
        state.models.get(m)?;
    }
    let change = crate::cache::PolicyChange {
        threshold: t.threshold,
        verify: t.verify,
        align: t.align,
        delta: t.delta,
        judge: t.judge,
    };
    let p = c.set_policy(t.model.as_deref(), change);
    Ok(Json(ThresholdSet {
        model: t.model,
        threshold: p.threshold,
        verify: p.verify,
        align: p.align,
        delta: p.delta,
        judge: p.judge,
    }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Shared {
    shared: bool,
}

/// Admin: makes a model's cache shared by every tenant (or per tenant
/// again). Answers cached before stay in their old scope.
#[utoipa::path(put, path = "/admin/cache/shared/{model}", tag = "admin", request_body = Shared,
    params(("model" = String, Path, description = "Model name")),
    responses((status = 200, description = "Updated", body = SharedSet), (status = 404, description = "No such model", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn shared(
    State(state): State<AppState>,
    Path(model): Path<String>,
    ApiJson(s): ApiJson<Shared>,
) -> Result<Json<SharedSet>, ApiError> {
    let c = cache(&state)?;
    state.models.get(&model)?;
    c.set_shared(&model, s.shared);
    Ok(Json(SharedSet {
        model,
        shared: s.shared,
    }))
}
