//! `POST /v1/completions`: raw-prompt completion (string, strings, or token
//! ids; `n` choices per prompt), as JSON or an SSE stream, with optional
//! log-probabilities in the legacy shape.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use engine::{EngineHandle, FinishReason, TokenLogprob};

use crate::api::json::ApiJson;
use crate::api::stream::{self, ChunkEncoder, to_json};
use crate::api::types::{Completion, CompletionChoice, CompletionRequest, UsageDto};
use crate::api::{logprobs, response_id, unix_now, validate};
use crate::caching;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::keys::KeyRecord;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/completions", post(completions))
}

/// Text completion (JSON, or an SSE stream).
#[utoipa::path(post, path = "/v1/completions", tag = "generation",
    request_body = CompletionRequest,
    responses((status = 200, description = "A completion, or with `stream: true` an SSE stream", body = Completion), (status = 400, description = "Invalid request", body = crate::openapi::ErrorResponse), (status = 401, description = "Missing or invalid API key", body = crate::openapi::ErrorResponse), (status = 429, description = "A per-key limit is reached (see Retry-After)", body = crate::openapi::ErrorResponse), (status = 503, description = "Overloaded (see Retry-After)", body = crate::openapi::ErrorResponse)),
    security(("api_key" = [])))]
pub(crate) async fn completions(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let engine = &state.models.text(&req.model)?;
    let valid = validate::completion(&req, engine)?;
    crate::auth::charge(&state, key.as_deref(), &valid.requests)?;
    let mut plan = caching::plan_completion(&state, &headers, key.as_deref(), &req.model, &valid);
    if let Some(p) = &mut plan
        && let Some(hit) = caching::lookup(&state, p).await
    {
        caching::bill_hit(&state, key.as_deref(), &hit).await?;
        return Ok(from_cache(
            req.model,
            engine.clone(),
            valid.stream,
            valid.include_usage,
            hit,
        ));
    }
    let mut tab =
        crate::billing::open_for(&state, key.as_deref(), &req.model, engine, &valid.requests)
            .await?;
    let streams = stream::submit_all(engine, valid.requests).await?;
    let mut encoder = CompletionEncoder {
        id: response_id("cmpl"),
        created: unix_now(),
        model: req.model,
        offsets: vec![0; valid.echo.len()],
        echo: valid.echo,
        engine: engine.clone(),
        logprobs: valid.logprobs,
    };
    let cached = caching::miss_header(plan.as_ref());
    if valid.stream {
        let on_done = caching::on_done(&state, plan);
        let sse = stream::sse(streams, encoder, valid.include_usage, tab, on_done);
        return Ok(([cached], sse).into_response());
    }
    let outcomes = stream::collect_all(streams).await?;
    caching::store_outcomes(&state, plan, &outcomes);
    if let Some(tab) = &mut tab {
        for (i, o) in outcomes.iter().enumerate() {
            tab.finished(i, &o.usage);
        }
    }
    crate::billing::settle(tab).await;
    let mut usage = UsageDto::default();
    let mut choices = Vec::with_capacity(outcomes.len());
    for (index, o) in outcomes.into_iter().enumerate() {
        usage.add(&o.usage);
        let prefix = encoder
            .echo
            .get_mut(index)
            .and_then(Option::take)
            .unwrap_or_default();
        let logprobs = encoder.logprobs_of(&o.logprobs, prefix.len());
        choices.push(CompletionChoice {
            index,
            text: prefix + &o.text,
            logprobs,
            finish_reason: Some(o.finish.as_openai()),
        });
    }
    let body = encoder.completion(choices, usage);
    Ok(([cached], Json(body)).into_response())
}

/// A cached completion, as JSON or as an SSE stream like a generated one.
fn from_cache(
    model: String,
    engine: EngineHandle,
    stream: bool,
    include_usage: bool,
    hit: caching::Hit,
) -> Response {
    let answers = caching::hit_choices(&hit);
    let encoder = CompletionEncoder {
        id: response_id("cmpl"),
        created: unix_now(),
        model,
        offsets: vec![0; answers.len()],
        echo: vec![None; answers.len()],
        engine,
        logprobs: false,
    };
    let (headers, usage) = (caching::hit_headers(&hit), caching::hit_usage(&hit));
    if stream {
        let usage = include_usage.then_some(usage);
        return (headers, stream::replay(encoder, answers, usage)).into_response();
    }
    let choices = answers
        .into_iter()
        .enumerate()
        .map(|(index, (text, reason))| CompletionChoice {
            index,
            text,
            logprobs: None,
            finish_reason: Some(reason.as_openai()),
        })
        .collect();
    let body = encoder.completion(choices, usage);
    (headers, Json(body)).into_response()
}

/// Encodes completion streams (`text_completion` chunks).
struct CompletionEncoder {
    id: String,
    created: u64,
    model: String,
    /// Prompt text to send first, per choice (`echo`).
    echo: Vec<Option<String>>,
    /// Text already sent per choice (for `text_offset`).
    offsets: Vec<usize>,
    engine: EngineHandle,
    logprobs: bool,
}

impl CompletionEncoder {
    /// The whole (non-streamed) answer.
    fn completion(self, choices: Vec<CompletionChoice>, usage: UsageDto) -> Completion {
        Completion {
            id: self.id,
            object: "text_completion",
            created: self.created,
            model: self.model,
            choices,
            usage: Some(usage),
        }
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<UsageDto>) -> String {
        to_json(&Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn logprobs_of(&self, lps: &[TokenLogprob], offset: usize) -> Option<serde_json::Value> {
        self.logprobs
            .then(|| logprobs::completion(self.engine.tokenizer(), lps, offset))
    }

    fn text(
        &mut self,
        index: usize,
        text: String,
        lps: &[TokenLogprob],
        finish: Option<FinishReason>,
    ) -> String {
        let offset = self.offsets.get(index).copied().unwrap_or(0);
        let logprobs = if finish.is_none() {
            self.logprobs_of(lps, offset)
        } else {
            None
        };
        if let Some(o) = self.offsets.get_mut(index) {
            *o += text.len();
        }
        let choice = CompletionChoice {
            index,
            text,
            logprobs,
            finish_reason: finish.map(FinishReason::as_openai),
        };
        self.chunk(vec![choice], None)
    }
}

impl ChunkEncoder for CompletionEncoder {
    fn start(&mut self, _choices: usize) -> Vec<String> {
        let echoes: Vec<(usize, String)> = self
            .echo
            .iter_mut()
            .enumerate()
            .filter_map(|(i, e)| e.take().map(|t| (i, t)))
            .collect();
        echoes
            .into_iter()
            .map(|(i, t)| {
                if let Some(o) = self.offsets.get_mut(i) {
                    *o += t.len();
                }
                let choice = CompletionChoice {
                    index: i,
                    text: t,
                    logprobs: None,
                    finish_reason: None,
                };
                self.chunk(vec![choice], None)
            })
            .collect()
    }

    fn delta(&mut self, index: usize, text: String, lps: &[TokenLogprob]) -> Option<String> {
        Some(self.text(index, text, lps, None))
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> String {
        self.text(index, String::new(), &[], Some(reason))
    }

    fn usage(&mut self, usage: UsageDto) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
