//! `POST /v1/completions`: raw-prompt completion (string, strings, or token
//! ids; one choice per prompt), as JSON or an SSE stream.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use engine::FinishReason;

use crate::api::json::ApiJson;
use crate::api::stream::{self, ChunkEncoder, to_json};
use crate::api::types::{Completion, CompletionChoice, CompletionRequest, UsageDto};
use crate::api::{response_id, unix_now, validate};
use crate::error::ApiError;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/completions", post(completions))
}

async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let engine = state.models.text(&req.model)?;
    let valid = validate::completion(&req, engine)?;
    let streams = stream::submit_all(engine, valid.requests)?;
    let mut encoder = CompletionEncoder {
        id: response_id("cmpl"),
        created: unix_now(),
        model: req.model,
        echo: valid.echo,
    };
    if valid.stream {
        return Ok(stream::sse(streams, encoder, valid.include_usage).into_response());
    }
    let outcomes = stream::collect_all(streams).await?;
    let mut usage = UsageDto::default();
    let choices = outcomes
        .into_iter()
        .enumerate()
        .map(|(index, o)| {
            usage.add(&o.usage);
            let prefix = encoder
                .echo
                .get_mut(index)
                .and_then(Option::take)
                .unwrap_or_default();
            CompletionChoice {
                index,
                text: prefix + &o.text,
                logprobs: None,
                finish_reason: Some(o.finish.as_openai()),
            }
        })
        .collect();
    let body = Completion {
        id: encoder.id,
        object: "text_completion",
        created: encoder.created,
        model: encoder.model,
        choices,
        usage: Some(usage),
    };
    Ok(Json(body).into_response())
}

/// Encodes completion streams (`text_completion` chunks).
struct CompletionEncoder {
    id: String,
    created: u64,
    model: String,
    /// Prompt text to send first, per choice (`echo`).
    echo: Vec<Option<String>>,
}

impl CompletionEncoder {
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

    fn text(&self, index: usize, text: String, finish: Option<FinishReason>) -> String {
        let choice = CompletionChoice {
            index,
            text,
            logprobs: None,
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
            .map(|(i, t)| self.text(i, t, None))
            .collect()
    }

    fn delta(&mut self, index: usize, text: String) -> String {
        self.text(index, text, None)
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> String {
        self.text(index, String::new(), Some(reason))
    }

    fn usage(&mut self, usage: UsageDto) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
