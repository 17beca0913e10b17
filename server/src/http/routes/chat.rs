//! `POST /v1/chat/completions`: chat through the model's template, as a
//! JSON answer or an SSE stream of `chat.completion.chunk`s; `n` choices,
//! optional log-probabilities.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use engine::{EngineHandle, FinishReason, TokenLogprob};

use crate::http::api::json::ApiJson;
use crate::http::api::stream::{self, ChunkEncoder, to_json};
use crate::http::api::tools::{ToolOutput, parse_output};
use crate::http::api::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, Delta, MessageContent, UsageDto,
};
use crate::http::api::{logprobs, response_id, unix_now, validate};
use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::services::caching::{CacheRequest, Conversation, Hit};
use crate::services::generation::{Generated, Job};
use money::store::keys::KeyRecord;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/chat/completions", post(chat_completions))
}

/// Chat completion (JSON, or an SSE stream of `chat.completion.chunk`s).
#[utoipa::path(post, path = "/v1/chat/completions", tag = "generation",
    request_body = ChatCompletionRequest,
    responses((status = 200, description = "A completion, or with `stream: true` an SSE stream of chunks", body = ChatCompletion), (status = 400, description = "Invalid request", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or invalid API key", body = crate::http::error::ErrorResponse), (status = 429, description = "A per-key limit is reached (see Retry-After)", body = crate::http::error::ErrorResponse), (status = 503, description = "Overloaded (see Retry-After)", body = crate::http::error::ErrorResponse)),
    security(("api_key" = [])))]
pub(crate) async fn chat_completions(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let engine = state.models.text(&req.model)?;
    let valid = validate::chat(&req, &engine)?;
    let job = Job {
        model: req.model.clone(),
        engine: engine.clone(),
        requests: valid.requests,
        cache: CacheRequest {
            mode: stream::cache_mode(&headers),
            endpoint: "chat",
            replayable: !valid.logprobs && !valid.tools,
            conversation: Some(conversation(&req)),
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
    let encoder = ChatEncoder {
        id: response_id("chatcmpl"),
        created: unix_now(),
        model: req.model,
        engine,
        logprobs: valid.logprobs,
        tools: valid.tools,
        held: Vec::new(),
    };
    let cached = (stream::CACHE_HEADER, run.cache_status());
    if valid.stream {
        let sse = stream::sse(run, encoder, valid.include_usage);
        return Ok(([cached], sse).into_response());
    }
    let outcomes = run.outcomes().await?;
    let mut usage = UsageDto::default();
    let choices = outcomes
        .into_iter()
        .enumerate()
        .map(|(index, o)| {
            usage.add(&o.usage);
            let (message, finish) = assistant(o.text, o.finish, encoder.tools);
            ChatChoice {
                index,
                logprobs: encoder.logprobs_of(&o.logprobs),
                message,
                finish_reason: Some(finish),
            }
        })
        .collect();
    let body = encoder.completion(choices, usage);
    Ok(([cached], Json(body)).into_response())
}

/// The conversation as the semantic cache sees it: earlier messages as
/// (role, text) and the last one's text when it is a user's plain text.
fn conversation(req: &ChatCompletionRequest) -> Conversation {
    let Some((last, earlier)) = req.messages.split_last() else {
        return Conversation::default();
    };
    let last_user = match (&last.role[..], &last.content) {
        ("user", Some(MessageContent::Text(t))) => Some(t.clone()),
        _ => None,
    };
    let earlier = earlier
        .iter()
        .map(|m| {
            let content = match &m.content {
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(p)) => {
                    format!("{:?}", p.iter().map(|x| &x.text).collect::<Vec<_>>())
                }
                None => String::new(),
            };
            (m.role.clone(), content)
        })
        .collect();
    Conversation { earlier, last_user }
}

/// A cached answer, as JSON or as an SSE stream like a generated one.
fn from_cache(
    model: String,
    engine: EngineHandle,
    stream: bool,
    include_usage: bool,
    hit: Hit,
) -> Response {
    let encoder = ChatEncoder {
        id: response_id("chatcmpl"),
        created: unix_now(),
        model,
        engine,
        logprobs: false,
        tools: false,
        held: Vec::new(),
    };
    let (headers, usage, answers) = (
        stream::hit_headers(&hit),
        stream::hit_usage(&hit),
        hit.choices(),
    );
    if stream {
        let usage = include_usage.then_some(usage);
        return (headers, stream::replay(encoder, answers, usage)).into_response();
    }
    let choices = answers
        .into_iter()
        .enumerate()
        .map(|(index, (text, reason))| {
            let (message, finish) = assistant(text, reason, false);
            ChatChoice {
                index,
                logprobs: None,
                message,
                finish_reason: Some(finish),
            }
        })
        .collect();
    let body = encoder.completion(choices, usage);
    (headers, Json(body)).into_response()
}

/// Encodes chat streams as `chat.completion.chunk`s.
struct ChatEncoder {
    id: String,
    created: u64,
    model: String,
    /// For rendering token strings in log-probabilities.
    engine: EngineHandle,
    logprobs: bool,
    /// The output is a tool-call envelope: held back per choice, then sent
    /// whole as content or `tool_calls` with the finish.
    tools: bool,
    held: Vec<String>,
}

/// One tool call in OpenAI's shape.
fn tool_call(name: String, arguments: String) -> serde_json::Value {
    serde_json::json!({
        "id": response_id("call"),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    })
}

/// A finished choice as an assistant message and its finish reason; with
/// tools, the envelope becomes `tool_calls` (reason `tool_calls`) or content.
fn assistant(text: String, finish: FinishReason, tools: bool) -> (AssistantMessage, &'static str) {
    let text = match tools.then(|| parse_output(&text)) {
        Some(ToolOutput::Call { name, arguments }) => {
            let message = AssistantMessage {
                role: "assistant",
                content: None,
                tool_calls: Some(vec![tool_call(name, arguments)]),
            };
            return (message, "tool_calls");
        }
        Some(ToolOutput::Content(c)) => c,
        None => text,
    };
    let message = AssistantMessage {
        role: "assistant",
        content: Some(text),
        tool_calls: None,
    };
    (message, finish.as_openai())
}

impl ChatEncoder {
    /// The whole (non-streamed) answer.
    fn completion(self, choices: Vec<ChatChoice>, usage: UsageDto) -> ChatCompletion {
        ChatCompletion {
            id: self.id,
            object: "chat.completion",
            created: self.created,
            model: self.model,
            choices,
            usage,
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageDto>) -> String {
        to_json(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn logprobs_of(&self, lps: &[TokenLogprob]) -> Option<serde_json::Value> {
        self.logprobs
            .then(|| logprobs::chat(self.engine.tokenizer(), lps))
    }
}

fn choice(
    index: usize,
    delta: Delta,
    logprobs: Option<serde_json::Value>,
    finish: Option<FinishReason>,
) -> ChatChunkChoice {
    ChatChunkChoice {
        index,
        delta,
        logprobs,
        finish_reason: finish.map(FinishReason::as_openai),
    }
}

impl ChunkEncoder for ChatEncoder {
    fn start(&mut self, choices: usize) -> Vec<String> {
        (0..choices)
            .map(|i| {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    tool_calls: None,
                };
                self.chunk(vec![choice(i, delta, None, None)], None)
            })
            .collect()
    }

    fn delta(&mut self, index: usize, text: String, lps: &[TokenLogprob]) -> Option<String> {
        if self.tools {
            if self.held.len() <= index {
                self.held.resize(index + 1, String::new());
            }
            self.held[index].push_str(&text);
            return None;
        }
        let delta = Delta {
            role: None,
            content: Some(text),
            tool_calls: None,
        };
        Some(self.chunk(
            vec![choice(index, delta, self.logprobs_of(lps), None)],
            None,
        ))
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> String {
        if !self.tools {
            let c = choice(index, Delta::default(), None, Some(reason));
            return self.chunk(vec![c], None);
        }
        let text = self
            .held
            .get_mut(index)
            .map(std::mem::take)
            .unwrap_or_default();
        let (message, finish) = assistant(text, reason, true);
        let delta = Delta {
            role: None,
            content: message.content,
            tool_calls: message.tool_calls.map(|calls| {
                calls
                    .into_iter()
                    .map(|mut c| {
                        c["index"] = 0.into();
                        c
                    })
                    .collect()
            }),
        };
        let c = ChatChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: Some(finish),
        };
        self.chunk(vec![c], None)
    }

    fn usage(&mut self, usage: UsageDto) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
