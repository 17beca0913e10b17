//! Typed response bodies of the admin, billing, market and cache routes,
//! so the OpenAPI document describes every field (and its drift test sees
//! them). Amounts are decimal strings of currency units (`"12.50"`), as
//! everywhere in the API (`money::ledger::units`).

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use money::ledger::accounts::{Account, UsageRecord};
use money::market::book::{Fill, Order};
use money::store::keys::KeyRecord;

/// OpenAI's list envelope: `{"object": "list", "data": [...]}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct List<T> {
    /// Always `list`.
    #[schema(value_type = String, example = "list")]
    pub object: &'static str,
    pub data: Vec<T>,
}

impl<T> List<T> {
    pub fn of(data: Vec<T>) -> Self {
        Self {
            object: "list",
            data,
        }
    }
}

/// The caller's key: its budget and what it has spent.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyUse {
    pub id: String,
    #[serde(with = "money::ledger::units::opt")]
    #[schema(value_type = Option<String>, example = "5.00")]
    pub budget: Option<i64>,
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.0004")]
    pub spent: i64,
}

/// `GET /v1/usage`: the caller's account and its latest usage records.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageAnswer {
    pub account: Account,
    /// Balance plus credit limit minus held funds.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "24.99")]
    pub available: i64,
    /// The key's budget, when the request came with a key.
    pub key: Option<KeyUse>,
    #[schema(value_type = String, example = "list")]
    pub object: &'static str,
    /// Usage records, newest first.
    pub data: Vec<TenantUsage>,
}

/// One request as its tenant sees it: tokens and cost, never how the
/// platform splits the cost (`GET /admin/usage` has that).
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantUsage {
    pub request_id: String,
    pub key_id: Option<String>,
    pub model: String,
    /// Who served it (`provider:house`, or a provider's account).
    pub provider_id: String,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    /// What the request cost, in units.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.0000123")]
    pub cost: i64,
    /// `finished`, `cut` or `failed`.
    pub outcome: String,
    pub created_at: i64,
    /// The executors (or provider workers) that ran its prefill and its
    /// decode; empty for cache hits.
    pub prefill_by: String,
    pub decode_by: String,
}

impl From<UsageRecord> for TenantUsage {
    fn from(r: UsageRecord) -> Self {
        Self {
            request_id: r.request_id,
            key_id: r.key_id,
            model: r.model,
            provider_id: r.provider_id,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens,
            completion_tokens: r.completion_tokens,
            cost: r.cost,
            outcome: r.outcome,
            created_at: r.created_at,
            prefill_by: r.prefill_by,
            decode_by: r.decode_by,
        }
    }
}

/// A journal transaction's id with the account it moved.
#[derive(Debug, Serialize, ToSchema)]
pub struct Moved {
    pub transaction: String,
    pub account: Account,
}

/// A worker's state after an admin's action.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerChange {
    pub id: String,
    /// `draining` (it leaves once idle), `removed`, `paused`, or, resumed,
    /// `active` (`calibrating` if it was never measured).
    pub state: String,
}

/// A model loaded (`loaded: true`) or unloaded (`deleted: true`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelChange {
    pub id: String,
    #[schema(value_type = String, example = "model")]
    pub object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<bool>,
}

/// A new key with its secret (shown once).
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedKey {
    #[serde(flatten)]
    pub record: KeyRecord,
    /// The secret: send it as `Authorization: Bearer <key>`.
    pub key: String,
}

/// A revoked key.
#[derive(Debug, Serialize, ToSchema)]
pub struct Revoked {
    pub id: String,
    pub revoked: bool,
}

/// An order as placed, and the fills it made.
#[derive(Debug, Serialize, ToSchema)]
pub struct Placed {
    pub order: Order,
    pub fills: Vec<Fill>,
}

/// A cancelled order.
#[derive(Debug, Serialize, ToSchema)]
pub struct Cancelled {
    pub order: Order,
    pub cancelled: bool,
}

/// Electricity prices by region (units per kWh).
#[derive(Debug, Serialize, ToSchema)]
pub struct Regions {
    pub regions: BTreeMap<String, String>,
}

/// One region's electricity price, as set (units per kWh).
#[derive(Debug, Serialize, ToSchema)]
pub struct RegionSet {
    pub region: String,
    pub price_per_kwh: String,
}

/// One cache tier's counters.
#[derive(Debug, Serialize, ToSchema)]
pub struct TierCounts {
    /// `l1`, `l2`, `l3` or `semantic`.
    pub tier: String,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub mean_lookup_us: u64,
}

/// A tier's size.
#[derive(Debug, Serialize, ToSchema)]
pub struct TierSize {
    pub bytes: u64,
    pub entries: u64,
}

/// The semantic index's size, policies and verifier rejections.
#[derive(Debug, Serialize, ToSchema)]
pub struct SemanticSize {
    pub entries: usize,
    /// The default policy's threshold.
    pub threshold: f32,
    /// Whether the default policy verifies candidates.
    pub verify: bool,
    /// The default policy's word alignment (absent: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub align: Option<f32>,
    /// Models with their own policy.
    pub models: std::collections::BTreeMap<String, crate::cache::semantic::Policy>,
    /// Lookups that missed because the verifier turned the nearest
    /// candidate down, by reason.
    pub rejections: std::collections::BTreeMap<String, u64>,
    /// The default policy's bound on wrong answers (absent: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f32>,
    /// Per model under a bound: what it decided and learned.
    pub bounded: std::collections::BTreeMap<String, Bounded>,
    /// The learned similarity thresholds (entries deciding by their own
    /// outcomes, and each model's pools): how many, and their quartiles.
    pub learned_thresholds: Quartiles,
    /// The learned cuts on the judge's chance of the same answer (where a
    /// judge and a bound are both on): how many, and their quartiles.
    pub learned_judge_cuts: Quartiles,
}

/// What one model's bound on wrong answers decided and learned.
#[derive(Debug, Serialize, ToSchema)]
pub struct Bounded {
    #[serde(flatten)]
    pub counts: crate::cache::Learned,
    /// The estimated share of near matches served wrong, with its 95%
    /// interval ([lower, upper]).
    pub error_rate: f64,
    pub error_interval: [f64; 2],
}

/// How many values, and their quartiles (absent when none).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Quartiles {
    pub count: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p25: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p75: Option<f64>,
}

impl Quartiles {
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let at = |q: usize| v.get((v.len() - 1) * q / 4).copied();
        match v.is_empty() {
            true => Self::default(),
            false => Self {
                count: v.len(),
                p25: at(1),
                p50: at(2),
                p75: at(3),
            },
        }
    }
}

/// `GET /admin/cache`.
#[derive(Debug, Serialize, ToSchema)]
pub struct CacheStats {
    pub tiers: Vec<TierCounts>,
    pub l1: TierSize,
    pub l2: TierSize,
    pub semantic: SemanticSize,
    /// Models whose cache is shared across tenants.
    pub shared_models: Vec<String>,
}

/// Entries removed per tier by a flush.
#[derive(Debug, Serialize, ToSchema)]
pub struct Removed {
    pub l1: usize,
    pub l2: usize,
    pub l3: usize,
    pub semantic: usize,
}

/// `POST /admin/cache/flush`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Flushed {
    pub removed: Removed,
}

/// A semantic policy, as set (`model` absent: the default).
#[derive(Debug, Serialize, ToSchema)]
pub struct ThresholdSet {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub threshold: f32,
    pub verify: bool,
    /// Word alignment (absent: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub align: Option<f32>,
    /// The bound on wrong answers (absent: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f32>,
    /// The judge's cut (absent: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge: Option<f32>,
}

/// A model's cache sharing, as set.
#[derive(Debug, Serialize, ToSchema)]
pub struct SharedSet {
    pub model: String,
    pub shared: bool,
}

/// `GET /health`: up (`ok`) or `draining`, with each model's engine state.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    #[schema(value_type = String, example = "ok")]
    pub status: &'static str,
    pub models: Vec<ModelHealth>,
}

/// One served model in `/health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelHealth {
    pub id: String,
    /// `text` or `embedding`.
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// A text model's engine statistics.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineHealth>,
}

/// A text engine's statistics, as `/health` shows them (absent for
/// embedding models, hence not required in the schema).
#[derive(Debug, Default, Serialize, ToSchema)]
#[serde(default)]
pub struct EngineHealth {
    pub running: u64,
    pub waiting: u64,
    pub kv_cache_usage: f64,
    pub kv_blocks: usize,
    pub block_size: usize,
    pub max_model_len: usize,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub steps: u64,
    pub batched_tokens: u64,
    pub generated_tokens: u64,
    pub busy_seconds: f64,
}

/// `GET /ready`: `ready` with the served models, or why not.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    #[schema(value_type = String, example = "ready")]
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
}
