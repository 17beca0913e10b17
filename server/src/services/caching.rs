//! The response-cache policy that generation applies (semantic lookups for
//! chat only): which requests may use the cache, the lookup (exact in three
//! tiers, then semantic), billing a hit at the cache price, and storing
//! fresh answers. The tiers themselves are the `cache` domain module.
//!
//! Rules:
//! - Only deterministic requests (temperature 0 or a fixed seed) use the
//!   cache, unless the caller allows it (`x-synor-cache: allow`); a bypass
//!   (`x-synor-cache: bypass`, `Cache-Control: no-cache`/`no-store`) skips
//!   it. `n` > 1, log-probabilities, tools and `echo` bypass it.
//! - The scope is the payer's account, or `shared` for models an admin
//!   shared; keys cover the model and its version, the whole rendered
//!   conversation and every sampling parameter, in the explicit encoding of
//!   `params_key` (never a `Debug` text, so renaming a field cannot empty
//!   the caches).
//! - A semantic hit needs the same scope, model and context (earlier turns,
//!   system prompt, parameters, hashed into the index key), a similar last
//!   user message over the model's threshold, and the verifier's consent
//!   (`cache::verify`).
//! - Under a model's bound on wrong answers (`delta`), a near match the
//!   cache has not learned to trust is a miss that probes it: the request
//!   is generated (and billed) as usual, and once it is stored its answer
//!   is compared with the cached one (`cache::agree`) and the outcome
//!   learned (by the entry, and by its tenant's pool for the model). A
//!   probe that agrees adds no entry (the cached one answers it); one that
//!   differs is cached as its own question.
//! - Under a model's judge (`judge`), a near match that passes the
//!   verifier's structure is put to the requested model (`cache_judge`):
//!   served as a hit when it says both questions get the same answer with
//!   at least the policy's chance, generated otherwise.

use std::fmt::Write as _;
use std::sync::Arc;

use engine::{EmbeddingHandle, FinishReason, SamplingParams, ValidRequest};
use sha2::{Digest, Sha256};

use crate::cache::answer::{CachedAnswer, CachedChoice, KeyParts, exact_key, hex};
use crate::cache::semantic::{IndexKey, Probe};
use crate::cache::verify::Facts;
use crate::cache::{Found, ResponseCache};
use crate::services::ServiceError;
use crate::services::metering::{Billing, Payer};
use engine::registry::{ModelKind, ModelRegistry};
use money::ledger::amount::BPS;
use money::ledger::{Prices, Quote};
use money::store::keys::KeyRecord;

/// What the caller asked of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Deterministic requests only.
    #[default]
    Default,
    /// Sampled requests too (`x-synor-cache: allow`).
    Allow,
    /// Never (`x-synor-cache: bypass`, `Cache-Control: no-cache`).
    Bypass,
}

/// A generation request as the cache sees it.
#[derive(Debug, Clone, Default)]
pub struct CacheRequest {
    pub mode: CacheMode,
    /// `chat` or `completions` (part of the key).
    pub endpoint: &'static str,
    /// False when the answer has parts a cached one cannot replay
    /// (log-probabilities, a tool-call envelope, `echo`).
    pub replayable: bool,
    /// Chat: the conversation, for a semantic lookup.
    pub conversation: Option<Conversation>,
}

/// A chat conversation as the semantic cache sees it.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// Every message before the last, as (role, content).
    pub earlier: Vec<(String, String)>,
    /// The last message's text, when it is a user's plain text.
    pub last_user: Option<String>,
}

/// How a request uses the cache.
#[derive(Debug, Clone)]
pub struct Plan {
    pub key: String,
    pub scope: String,
    pub model: String,
    /// The semantic probe: its index and the last user message.
    semantic: Option<(IndexKey, String)>,
    /// The last message's embedding, once computed (stored with the answer).
    vector: Option<Vec<f32>>,
    /// The near match this request probes (its answer is compared).
    probe: Option<Probe>,
}

/// A cached answer to serve.
#[derive(Debug, Clone)]
pub struct Hit {
    pub answer: Arc<CachedAnswer>,
    /// `exact` or `semantic`.
    pub kind: &'static str,
    pub similarity: Option<f32>,
}

impl Hit {
    /// The hit's choices with their finish reasons.
    pub fn choices(&self) -> Vec<(String, FinishReason)> {
        self.answer
            .choices
            .iter()
            .map(|c| (c.text.clone(), finish_of(c)))
            .collect()
    }
}

/// The response cache with what its policy needs: the served models (for
/// versions and the embedder) and the price of a hit.
#[derive(Debug, Clone)]
pub struct ResponseCaching {
    pub cache: Arc<ResponseCache>,
    pub models: Arc<ModelRegistry>,
    /// What a hit costs, as a fraction of the generated price (bps).
    pub price_bps: i64,
    /// Places query embeddings (on a worker's encoder when that is
    /// expected to be sooner).
    pub dispatch: Option<Arc<crate::services::dispatch::Dispatch>>,
}

/// The query encoder's vector of `text`: on the executor placement
/// expects to be soonest (the house's, or a worker's with the same
/// encoder), or the house's without a fleet.
async fn query_vector(
    (name, encoder): (String, EmbeddingHandle),
    dispatch: Option<Arc<crate::services::dispatch::Dispatch>>,
    text: &str,
) -> Option<Vec<f32>> {
    let got = match dispatch {
        Some(d) => {
            let input = engine::EmbedInput::Texts(vec![text.to_string()]);
            d.embed(&name, &encoder, input, true)
                .await
                .map(|(mut e, _)| e.vectors.pop().unwrap_or_default())
        }
        None => encoder.embed_query(text).await,
    };
    match got {
        Ok(v) if !v.is_empty() => Some(v),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "semantic cache: embedding failed");
            None
        }
    }
}

/// The stable encoding of every sampling parameter that shapes an answer
/// (`priority` does not). Floats are written as their bit patterns, lists
/// with their lengths, strings length-prefixed: a new field changes this
/// function (the destructuring below does not compile without it), a
/// renamed one does not change any key.
pub fn params_key(p: &SamplingParams) -> String {
    let SamplingParams {
        temperature,
        top_p,
        top_k,
        seed,
        max_tokens,
        stop,
        stop_token_ids,
        ignore_eos,
        min_p,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        logit_bias,
        logprobs,
        n,
        priority: _,
        tenant: _,
        grammar,
    } = p;
    let mut s = String::from("v1");
    let f = |x: &f32| format!("{:08x}", x.to_bits());
    let _ = write!(
        s,
        ";t={};p={};k={top_k};s={seed:?};m={max_tokens};e={ignore_eos};min_p={};rp={};fp={};pp={};lp={logprobs:?};n={n}",
        f(temperature),
        f(top_p),
        f(min_p),
        f(repetition_penalty),
        f(frequency_penalty),
        f(presence_penalty),
    );
    let _ = write!(s, ";stop={}", stop.len());
    for t in stop {
        let _ = write!(s, ":{}:{t}", t.len());
    }
    let _ = write!(s, ";ids={stop_token_ids:?};bias={}", logit_bias.len());
    for (id, b) in logit_bias {
        let _ = write!(s, ":{id}={}", f(b));
    }
    let g = match grammar {
        None => String::new(),
        Some(engine::Grammar::JsonObject) => "json_object".into(),
        // Keys sorted, so reordered but equal schemas share a key.
        Some(engine::Grammar::JsonSchema(v)) => format!("json_schema:{}", canonical(v)),
        Some(engine::Grammar::Regex(r)) => format!("regex:{r}"),
        Some(engine::Grammar::Lark(l)) => format!("lark:{l}"),
    };
    let _ = write!(s, ";g={}:{g}", g.len());
    s
}

/// JSON with every object's keys in sorted order (serde_json keeps
/// insertion order in this build).
fn canonical(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&m[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => v.to_string(),
    }
}

impl ResponseCaching {
    /// Whether (and how) this request may use the cache.
    pub fn plan(
        &self,
        key: Option<&KeyRecord>,
        model_name: &str,
        requests: &[ValidRequest],
        req: &CacheRequest,
    ) -> Option<Plan> {
        if req.mode == CacheMode::Bypass || !req.replayable {
            return None;
        }
        let [one] = requests else {
            return None;
        };
        let p = &one.params;
        let deterministic = p.temperature == 0.0 || p.seed.is_some();
        if p.n != 1 || !(deterministic || req.mode == CacheMode::Allow) {
            return None;
        }
        let model = self.models.get(model_name).ok()?;
        let scope = if self.cache.is_shared(model_name) {
            crate::cache::SHARED_SCOPE.to_string()
        } else {
            Payer::of(key).account_id
        };
        let params = params_key(p);
        let key = exact_key(&KeyParts {
            scope: &scope,
            model: model_name,
            model_version: model.version,
            endpoint: req.endpoint,
            prompt_tokens: &one.prompt_tokens,
            params: &params,
        });
        let semantic = req
            .conversation
            .as_ref()
            .and_then(|c| semantic_probe(c, &scope, model_name, model.version, &params));
        Some(Plan {
            key,
            semantic,
            scope,
            model: model_name.to_string(),
            vector: None,
            probe: None,
        })
    }

    /// Exact lookup in every tier, then semantic.
    pub async fn lookup(&self, plan: &mut Plan) -> Option<Hit> {
        let cache = &self.cache;
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
        let vector = query_vector(self.embedder()?, self.dispatch.clone(), &text).await?;
        plan.vector = Some(vector.clone());
        let facts = Facts::of(&text);
        if cache.policy(&ik.model).align.is_some() {
            learn_words(&self.cache, self.embedder(), &facts).await;
        }
        let started = std::time::Instant::now();
        let m = match cache.semantic_get(&ik, &vector, &facts)? {
            Found::Hit(m) => m,
            Found::Probe(p) => {
                plan.probe = Some(p);
                return None;
            }
            Found::Judge(m, cached) => {
                // A model the house does not run (a pipeline's) cannot judge.
                let p = match self.models.text(&ik.model) {
                    Ok(engine) => {
                        crate::services::cache_judge::same_answer(&engine, &cached, &text).await
                    }
                    Err(_) => None,
                };
                match cache.semantic_judged(&ik, m, p, started)? {
                    Ok(m) => m,
                    Err(p) => {
                        plan.probe = Some(p);
                        return None;
                    }
                }
            }
        };
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

    /// The embedding model the semantic cache uses (the first one served).
    fn embedder(&self) -> Option<(String, EmbeddingHandle)> {
        self.models.list().into_iter().find_map(|m| match m.kind {
            ModelKind::Embedding(h) => Some((m.name.clone(), h)),
            ModelKind::Text(_) => None,
        })
    }

    /// Bills a hit at the cache price (a fraction of the generated price),
    /// crediting the provider that produced the answer; 402 if the payer
    /// cannot cover it. The cost is known, so no hold is needed: the funds
    /// are checked now and the charge is committed by the ledger's writer
    /// in its next batch (the answer does not wait for it).
    pub async fn bill_hit(
        &self,
        billing: Option<&Billing>,
        key: Option<&KeyRecord>,
        hit: &Hit,
    ) -> Result<(), ServiceError> {
        let Some(b) = billing else {
            return Ok(());
        };
        let a = &hit.answer;
        let base = b.quote(&a.model, money::market::pricing::Occupancy::default())?;
        // Answers stored before prices were recorded: today's idle price.
        let generated = a.prices.unwrap_or(base.prices);
        let quote = Quote {
            provider_id: a.provider_id.clone(),
            prices: hit_prices(generated, self.price_bps),
            // Nothing ran: the answer is replayed.
            stages: money::ledger::amount::Stages::default(),
            ..base
        };
        let payer = Payer::of(key);
        let tokens = money::ledger::Tokens {
            prompt: a.prompt_tokens,
            cached: 0,
            completion: a.completion_tokens,
        };
        let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
        let hold = money::ledger::holds::HoldRequest {
            request_id: &request_id,
            account_id: &payer.account_id,
            key_id: payer.key_id.as_deref(),
            quote: &quote,
            amount: quote.cost(tokens),
            max_completion: None,
        };
        Ok(b.ledger.charge(hold, tokens).await?)
    }

    /// Stores a fresh answer whose choices all finished (in the
    /// background: the response does not wait); `usage` is the sum of the
    /// choices' (prompt, completion) tokens.
    pub fn store(
        &self,
        plan: Plan,
        choices: Vec<(String, FinishReason)>,
        usage: (u64, u64),
        prices: Option<Prices>,
    ) {
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
            prompt_tokens: usage.0,
            completion_tokens: usage.1,
            provider_id: money::ledger::HOUSE_PROVIDER.to_string(),
            created_at: money::store::now(),
            prices,
        };
        let embedder = self.embedder();
        let dispatch = self.dispatch.clone();
        let cache = self.cache.clone();
        let fresh = answer.choices.first().map(|c| c.text.clone());
        tokio::spawn(async move {
            cache.put(&plan.key, answer).await;
            let Some((ik, text)) = plan.semantic else {
                return;
            };
            if let (Some(probe), Some(fresh)) = (&plan.probe, fresh) {
                let found = &probe.found;
                let cached = cache.get(&plan.scope, &plan.model, &found.key).await;
                let Some(cached) = cached.and_then(|(a, _)| a.choices.first().cloned()) else {
                    cache.semantic_forget(&found.key);
                    return;
                };
                let Some(same) = agreement(&cached.text, &fresh, embedder.clone()).await else {
                    return;
                };
                cache.semantic_observe(&ik, probe, same);
                if same {
                    return;
                }
            }
            if cache.policy(&ik.model).align.is_some() {
                learn_words(&cache, embedder.clone(), &Facts::of(&text)).await;
            }
            let vector = match (plan.vector, embedder) {
                (Some(v), _) => v,
                (None, Some(e)) => match query_vector(e, dispatch, &text).await {
                    Some(v) => v,
                    None => return,
                },
                (None, None) => return,
            };
            cache.semantic_put(ik, vector, &text, plan.key);
        });
    }
}

/// Whether a probe's generated answer agrees with the cached one: the
/// same text, or close in meaning by the embedder with the same facts;
/// `None` when the embedder failed (nothing is learned).
async fn agreement(
    cached: &str,
    fresh: &str,
    embedder: Option<(String, EmbeddingHandle)>,
) -> Option<bool> {
    use crate::cache::agree;
    if agree::same_text(cached, fresh) {
        return Some(true);
    }
    let (_, encoder) = embedder?;
    let texts = vec![
        agree::compared(cached).to_string(),
        agree::compared(fresh).to_string(),
    ];
    match encoder.embed_queries(texts).await {
        Ok(v) if v.len() == 2 => Some(agree::agree(cached, fresh, &v[0], &v[1])),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "semantic cache: comparing a probe failed");
            None
        }
    }
}

/// Embeds the topic words of `facts` the verifier has no vectors for (one
/// word each, with the query encoder), so that it can tell "tallest" from
/// "highest" and "boil" from "poach". On failure the words stay unknown
/// and only the same stems align.
async fn learn_words(
    cache: &ResponseCache,
    embedder: Option<(String, EmbeddingHandle)>,
    facts: &Facts,
) {
    let missing = cache.semantic_missing_words(facts);
    let Some((_, encoder)) = embedder.filter(|_| !missing.is_empty()) else {
        return;
    };
    match encoder.embed_queries(missing.clone()).await {
        Ok(vectors) => cache.semantic_add_words(missing.into_iter().zip(vectors).collect()),
        Err(e) => tracing::warn!(error = %e, "semantic cache: word vectors failed"),
    }
}

/// What a hit's tokens cost: `bps` of the prices the answer was generated
/// at, rounded up like every amount a user pays (so a hit never costs less
/// than its fraction, and at most one tick per million tokens more).
pub fn hit_prices(generated: Prices, bps: i64) -> Prices {
    // Stored prices come back from the disk or Redis tier: never below 0.
    let scale = |p: i64| {
        let x = i128::from(p.max(0)) * i128::from(bps.max(0));
        i64::try_from((x + i128::from(BPS) - 1) / i128::from(BPS)).unwrap_or(i64::MAX)
    };
    Prices {
        input: scale(generated.input),
        cached_input: scale(generated.cached_input),
        output: scale(generated.output),
    }
}

/// Longest last message the semantic cache considers: questions get
/// rephrased, long documents do not, and embedding them would cost every
/// such miss tens of milliseconds.
const SEMANTIC_MAX_CHARS: usize = 500;

/// The semantic index and text of a conversation whose last message is a
/// user's text: every earlier message, the model version and the
/// parameters are hashed into the index key.
fn semantic_probe(
    c: &Conversation,
    scope: &str,
    model: &str,
    version: u64,
    params: &str,
) -> Option<(IndexKey, String)> {
    let text = c
        .last_user
        .as_ref()
        .filter(|t| t.chars().count() <= SEMANTIC_MAX_CHARS)?;
    let mut h = Sha256::new();
    h.update(version.to_le_bytes());
    h.update(params.as_bytes());
    for (role, content) in &c.earlier {
        for part in [role, content] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
    }
    let ik = IndexKey {
        scope: scope.to_string(),
        model: model.to_string(),
        context: hex(&h.finalize()),
    };
    Some((ik, text.clone()))
}

/// The finish reason a cached choice was stored with.
pub fn finish_of(c: &CachedChoice) -> FinishReason {
    if c.finish_reason == "length" {
        FinishReason::Length
    } else {
        FinishReason::Stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_costs_its_fraction_of_the_generated_prices_rounded_up() {
        let generated = Prices {
            input: 150_001,
            cached_input: 15_000,
            output: 600_009,
        };
        let p = hit_prices(generated, 1_000);
        assert_eq!((p.input, p.cached_input, p.output), (15_001, 1_500, 60_001));
        assert_eq!(hit_prices(generated, 10_000), generated);
        let negative = Prices {
            input: -5,
            cached_input: -1,
            output: i64::MIN,
        };
        let p = hit_prices(negative, 1_000);
        assert_eq!((p.input, p.cached_input, p.output), (0, 0, 0));
    }

    #[test]
    fn the_params_encoding_is_pinned() {
        let p = SamplingParams {
            temperature: 0.0,
            seed: Some(7),
            max_tokens: 32,
            stop: vec!["\n\n".into()],
            logit_bias: vec![(5, -1.5)],
            priority: 9,
            grammar: Some(engine::Grammar::Regex("[0-9]+".into())),
            ..SamplingParams::default()
        };
        assert_eq!(
            params_key(&p),
            "v1;t=00000000;p=3f800000;k=0;s=Some(7);m=32;e=false;min_p=00000000;\
             rp=3f800000;fp=00000000;pp=00000000;lp=None;n=1;stop=1:2:\n\n;ids=[];\
             bias=1:5=bfc00000;g=12:regex:[0-9]+"
        );
        // Scheduling priority does not shape the answer.
        let q = SamplingParams {
            priority: 0,
            ..p.clone()
        };
        assert_eq!(params_key(&p), params_key(&q));
        let r = SamplingParams {
            top_k: 3,
            ..p.clone()
        };
        assert_ne!(params_key(&p), params_key(&r));
        // Equal schemas written in another key order share a key.
        let schema = |s: &str| SamplingParams {
            grammar: Some(engine::Grammar::JsonSchema(
                serde_json::from_str(s).expect("json"),
            )),
            ..SamplingParams::default()
        };
        assert_eq!(
            params_key(&schema(r#"{"type":"object","required":["a"]}"#)),
            params_key(&schema(r#"{"required":["a"],"type":"object"}"#))
        );
    }
}
