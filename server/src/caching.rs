//! The response cache as the chat and completions APIs use it (semantic
//! lookups for chat only): which requests may use it,
//! the lookup (exact in three tiers, then semantic), billing a hit at the
//! cache price, and storing fresh answers.
//!
//! Rules:
//! - Only deterministic requests (temperature 0 or a fixed seed) use the
//!   cache, unless the request sends `x-synor-cache: allow`;
//!   `x-synor-cache: bypass` (or `Cache-Control: no-cache`/`no-store`)
//!   skips it. `n` > 1, log-probabilities and tools bypass it.
//! - The scope is the payer's account, or `shared` for models an admin
//!   shared; keys cover the model and its version, the whole rendered
//!   conversation and every sampling parameter.
//! - A semantic hit needs the same scope, model and context (earlier turns,
//!   system prompt, parameters, hashed into the index key), a similar last
//!   user message over the threshold, and the same guard terms.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use engine::{EmbeddingHandle, FinishReason};
use sha2::{Digest, Sha256};

use crate::api::types::{ChatCompletionRequest, MessageContent, UsageDto};
use crate::api::validate::ValidGeneration;
use crate::billing::Payer;
use crate::cache::answer::{CachedAnswer, CachedChoice, KeyParts, exact_key, hex};
use crate::cache::semantic::IndexKey;
use crate::error::ApiError;
use crate::ledger::Quote;
use crate::ledger::money::BPS;
use crate::state::{AppState, ModelKind};
use crate::store::keys::KeyRecord;

/// How a request may use the cache.
#[derive(Debug, Clone)]
pub struct Plan {
    pub key: String,
    pub scope: String,
    pub model: String,
    /// The semantic probe: its index and the last user message.
    semantic: Option<(IndexKey, String)>,
    /// The last message's embedding, once computed (stored with the answer).
    vector: Option<Vec<f32>>,
}

/// A cached answer to serve.
#[derive(Debug, Clone)]
pub struct Hit {
    pub answer: Arc<CachedAnswer>,
    /// `exact` or `semantic`.
    pub kind: &'static str,
    pub similarity: Option<f32>,
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Whether (and how) this chat request may use the cache (exact and
/// semantic).
pub fn plan(
    state: &AppState,
    headers: &HeaderMap,
    key: Option<&KeyRecord>,
    req: &ChatCompletionRequest,
    valid: &ValidGeneration,
) -> Option<Plan> {
    let (mut plan, version, params) = exact_plan(state, headers, key, &req.model, "chat", valid)?;
    plan.semantic = semantic_probe(req, &plan.scope, version, &params);
    Some(plan)
}

/// Whether this completions request may use the cache (exact only: one
/// prompt, no `echo`).
pub fn plan_completion(
    state: &AppState,
    headers: &HeaderMap,
    key: Option<&KeyRecord>,
    model: &str,
    valid: &ValidGeneration,
) -> Option<Plan> {
    if valid.echo.iter().any(Option::is_some) {
        return None;
    }
    exact_plan(state, headers, key, model, "completions", valid).map(|(p, _, _)| p)
}

/// The exact-cache plan, with the model version and the parameters' text
/// (for a semantic probe), if the request may use the cache.
fn exact_plan(
    state: &AppState,
    headers: &HeaderMap,
    key: Option<&KeyRecord>,
    model_name: &str,
    endpoint: &str,
    valid: &ValidGeneration,
) -> Option<(Plan, u64, String)> {
    let cache = state.cache.as_ref()?;
    let mode = header(headers, "x-synor-cache");
    let control = header(headers, "cache-control");
    if mode == "bypass" || control.contains("no-cache") || control.contains("no-store") {
        return None;
    }
    let [one] = valid.requests.as_slice() else {
        return None;
    };
    let p = &one.params;
    let deterministic = p.temperature == 0.0 || p.seed.is_some();
    if p.n != 1 || valid.logprobs || valid.tools || !(deterministic || mode == "allow") {
        return None;
    }
    let model = state.models.get(model_name).ok()?;
    let scope = if cache.is_shared(model_name) {
        "shared".to_string()
    } else {
        Payer::of(key).account_id
    };
    let params = format!("{p:?}");
    let key = exact_key(&KeyParts {
        scope: &scope,
        model: model_name,
        model_version: model.version,
        endpoint,
        prompt_tokens: &one.prompt_tokens,
        params: &params,
    });
    let plan = Plan {
        key,
        semantic: None,
        scope,
        model: model_name.to_string(),
        vector: None,
    };
    Some((plan, model.version, params))
}

/// Longest last message the semantic cache considers: questions get
/// rephrased, long documents do not, and embedding them would cost every
/// such miss tens of milliseconds.
const SEMANTIC_MAX_CHARS: usize = 500;

/// The semantic index and text of a conversation whose last message is a
/// user's text: every earlier message, the model version and the
/// parameters are hashed into the index key.
fn semantic_probe(
    req: &ChatCompletionRequest,
    scope: &str,
    version: u64,
    params: &str,
) -> Option<(IndexKey, String)> {
    let (last, earlier) = req.messages.split_last()?;
    let text = match (&last.role[..], &last.content) {
        ("user", Some(MessageContent::Text(t))) if t.chars().count() <= SEMANTIC_MAX_CHARS => {
            t.clone()
        }
        _ => return None,
    };
    let mut h = Sha256::new();
    h.update(version.to_le_bytes());
    h.update(params.as_bytes());
    for m in earlier {
        let content = match &m.content {
            Some(MessageContent::Text(t)) => t.clone(),
            Some(MessageContent::Parts(p)) => {
                format!("{:?}", p.iter().map(|x| &x.text).collect::<Vec<_>>())
            }
            None => String::new(),
        };
        for part in [&m.role, &content] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
    }
    let ik = IndexKey {
        scope: scope.to_string(),
        model: req.model.clone(),
        context: hex(&h.finalize()),
    };
    Some((ik, text))
}

/// The embedding model the semantic cache uses (the first one served).
fn embedder(state: &AppState) -> Option<EmbeddingHandle> {
    state.models.list().into_iter().find_map(|m| match m.kind {
        ModelKind::Embedding(h) => Some(h),
        ModelKind::Text(_) => None,
    })
}

/// Exact lookup in every tier, then semantic.
pub async fn lookup(state: &AppState, plan: &mut Plan) -> Option<Hit> {
    let cache = state.cache.as_ref()?;
    if let Some((answer, _)) = cache.get(&plan.scope, &plan.model, &plan.key).await {
        return Some(Hit {
            answer,
            kind: "exact",
            similarity: None,
        });
    }
    let (ik, text) = plan.semantic.clone()?;
    if !cache.semantic_has(&ik) {
        // Nothing to compare with: skip the embedding (the answer's is
        // computed after the response, when it is stored).
        return None;
    }
    let embedder = embedder(state)?;
    let vector = match embedder.embed_query(&text).await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "semantic cache: embedding failed");
            return None;
        }
    };
    plan.vector = Some(vector.clone());
    let m = cache.semantic_get(&ik, &vector, &text)?;
    match cache.get(&plan.scope, &plan.model, &m.key).await {
        Some((answer, _)) => Some(Hit {
            answer,
            kind: "semantic",
            similarity: Some(m.similarity),
        }),
        None => {
            cache.semantic_forget(&m.key);
            None
        }
    }
}

/// Bills a hit at the cache price (a fraction of the generated price),
/// crediting the provider that produced the answer; 402 if the payer
/// cannot cover it. The cost is known, so no hold is needed: the funds are
/// checked now and the charge is committed by the ledger's writer in its
/// next batch (the answer does not wait for it).
pub async fn bill_hit(
    state: &AppState,
    key: Option<&KeyRecord>,
    hit: &Hit,
) -> Result<(), ApiError> {
    let Some(b) = &state.billing else {
        return Ok(());
    };
    let a = &hit.answer;
    let fraction = state.cache_price_bps;
    let base = b.quote(&a.model, crate::market::pricing::Load::default())?;
    let scale = |p: i64| (i128::from(p) * i128::from(fraction) / i128::from(BPS)) as i64;
    let quote = Quote {
        provider_id: a.provider_id.clone(),
        prices: crate::ledger::Prices {
            input: scale(base.prices.input),
            cached_input: scale(base.prices.cached_input),
            output: scale(base.prices.output),
        },
        ..base
    };
    let payer = Payer::of(key);
    let tokens = crate::ledger::Tokens {
        prompt: a.prompt_tokens,
        cached: 0,
        completion: a.completion_tokens,
    };
    let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
    let hold = crate::ledger::holds::HoldRequest {
        request_id: &request_id,
        account_id: &payer.account_id,
        key_id: payer.key_id.as_deref(),
        quote: &quote,
        amount: quote.cost(tokens),
    };
    Ok(b.ledger.charge(hold, tokens).await?)
}

/// Stores a fresh answer (in the background: the response does not wait).
pub fn store(state: &AppState, plan: Plan, choices: Vec<(String, FinishReason)>, usage: &UsageDto) {
    let Some(cache) = state.cache.clone() else {
        return;
    };
    if choices.iter().any(|(_, r)| *r == FinishReason::Abort) {
        return;
    }
    let answer = CachedAnswer {
        scope: plan.scope.clone(),
        model: plan.model.clone(),
        choices: choices
            .into_iter()
            .map(|(text, r)| CachedChoice {
                text,
                finish_reason: r.as_openai().to_string(),
            })
            .collect(),
        prompt_tokens: usage.prompt_tokens as u64,
        completion_tokens: usage.completion_tokens as u64,
        provider_id: crate::ledger::HOUSE_PROVIDER.to_string(),
        created_at: crate::store::now(),
    };
    let embedder = embedder(state);
    tokio::spawn(async move {
        cache.put(&plan.key, answer).await;
        let Some((ik, text)) = plan.semantic else {
            return;
        };
        let vector = match (plan.vector, embedder) {
            (Some(v), _) => v,
            (None, Some(e)) => match e.embed_query(&text).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "semantic cache: embedding failed");
                    return;
                }
            },
            (None, None) => return,
        };
        cache.semantic_put(ik, vector, &text, plan.key);
    });
}

/// Which cache answered (`exact`, `semantic`), or `miss` / `bypass`.
pub const HEADER: &str = "x-synor-cache";

/// `x-synor-cache` (and the similarity of a semantic hit).
pub fn hit_headers(hit: &Hit) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(HEADER, HeaderValue::from_static(hit.kind));
    if let Some(s) = hit.similarity
        && let Ok(v) = HeaderValue::from_str(&format!("{s:.4}"))
    {
        headers.insert("x-synor-cache-similarity", v);
    }
    headers
}

/// The usage a hit reports: the cached answer's tokens.
pub fn hit_usage(hit: &Hit) -> UsageDto {
    let mut usage = UsageDto::default();
    usage.add(&engine::Usage {
        prompt_tokens: hit.answer.prompt_tokens as usize,
        completion_tokens: hit.answer.completion_tokens as usize,
        cached_tokens: 0,
    });
    usage
}

/// A hit's choices with their finish reasons.
pub fn hit_choices(hit: &Hit) -> Vec<(String, FinishReason)> {
    hit.answer
        .choices
        .iter()
        .map(|c| (c.text.clone(), finish_of(c)))
        .collect()
}

/// The `x-synor-cache` value of a generated answer.
pub fn miss_header(plan: Option<&Plan>) -> (&'static str, &'static str) {
    (HEADER, if plan.is_some() { "miss" } else { "bypass" })
}

/// For a stream: stores the answer once every choice has finished.
pub fn on_done(state: &AppState, plan: Option<Plan>) -> Option<crate::api::stream::OnDone> {
    let state = state.clone();
    plan.map(|p| {
        Box::new(
            move |choices: Vec<(String, FinishReason)>, usage: &UsageDto| {
                store(&state, p, choices, usage);
            },
        ) as crate::api::stream::OnDone
    })
}

/// For a JSON answer: stores the finished choices.
pub fn store_outcomes(
    state: &AppState,
    plan: Option<Plan>,
    outcomes: &[crate::api::stream::Outcome],
) {
    let Some(p) = plan else { return };
    let mut usage = UsageDto::default();
    outcomes.iter().for_each(|o| usage.add(&o.usage));
    let texts = outcomes
        .iter()
        .map(|o| (o.text.clone(), o.finish))
        .collect();
    store(state, p, texts, &usage);
}

/// The finish reason a cached choice was stored with.
pub fn finish_of(c: &CachedChoice) -> FinishReason {
    if c.finish_reason == "length" {
        FinishReason::Length
    } else {
        FinishReason::Stop
    }
}
