//! `POST /v1/completions`: raw-prompt completion (string, strings, or token
//! ids; `n` choices per prompt), as JSON or an SSE stream, with optional
//! log-probabilities in the legacy shape.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use engine::{EngineHandle, FinishReason, TokenLogprob};

use crate::http::api::json::ApiJson;
use crate::http::api::stream::{self, ChunkEncoder, to_json};
use crate::http::api::types::{Completion, CompletionChoice, CompletionRequest, UsageDto};
use crate::http::api::{logprobs, response_id, unix_now, validate};
use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::services::caching::{CacheRequest, Hit};
use crate::services::generation::{Generated, Job};
use money::store::keys::KeyRecord;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/completions", post(completions))
}

/// Text completion (JSON, or an SSE stream).
#[utoipa::path(post, path = "/v1/completions", tag = "generation",
    request_body = CompletionRequest,
    responses((status = 200, description = "A completion, or with `stream: true` an SSE stream", body = Completion), (status = 400, description = "Invalid request", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or invalid API key", body = crate::http::error::ErrorResponse), (status = 429, description = "A per-key limit is reached (see Retry-After)", body = crate::http::error::ErrorResponse), (status = 503, description = "Overloaded (see Retry-After)", body = crate::http::error::ErrorResponse)),
    security(("api_key" = [])))]
pub(crate) async fn completions(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let engine = state.models.text(&req.model)?;
    let valid = validate::completion(&req, &engine)?;
    let job = Job {
        model: req.model.clone(),
        engine: engine.clone(),
        requests: valid.requests,
        cache: CacheRequest {
            mode: stream::cache_mode(&headers),
            endpoint: "completions",
            replayable: !valid.logprobs && valid.echo.iter().all(Option::is_none),
            conversation: None,
        },
    };
    let run = match state.generation().generate(key.as_deref(), job).await? {
        Generated::Cached(hit) => {
            return Ok(from_cache(
                req.model,
                engine,
                valid.stream,
                valid.include_usage,
                hit,
            ));
        }
        Generated::Fresh(run) => run,
    };
    let mut encoder = CompletionEncoder {
        id: response_id("cmpl"),
        created: unix_now(),
        model: req.model,
        offsets: vec![0; valid.echo.len()],
        echo: valid.echo,
        engine,
        logprobs: valid.logprobs,
    };
    let cached = (stream::CACHE_HEADER, run.cache_status());
    if valid.stream {
        let sse = stream::sse(run, encoder, valid.include_usage);
        return Ok(([cached], sse).into_response());
    }
    let outcomes = run.outcomes().await?;
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
    hit: Hit,
) -> Response {
    let answers = hit.choices();
    let encoder = CompletionEncoder {
        id: response_id("cmpl"),
        created: unix_now(),
        model,
        offsets: vec![0; answers.len()],
        echo: vec![None; answers.len()],
        engine,
        logprobs: false,
    };
    let (headers, usage) = (stream::hit_headers(&hit), stream::hit_usage(&hit));
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
