//! From a generation to OpenAI's SSE answer: a running generation encoded
//! as chunks (`data: {...}` ... `data: [DONE]`) with an optional usage
//! chunk, a cached answer replayed in the same shape, and the cache's
//! request and response headers. Dropping the stream (a client that left)
//! aborts the requests.

use std::convert::Infallible;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use engine::{FinishReason, TokenEvent, TokenLogprob};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Serialize;

use super::types::UsageDto;
use crate::http::error::ApiError;
use crate::services::caching::{CacheMode, Hit};
use crate::services::generation::Run;

/// Builds the JSON payloads of one endpoint's stream.
pub trait ChunkEncoder: Send + 'static {
    /// Payloads sent before any token (chat sends the role here).
    fn start(&mut self, choices: usize) -> Vec<String>;
    /// A text delta of choice `index`, with the log-probabilities of the
    /// tokens behind it (empty unless requested); `None` when the encoder
    /// holds the text back (a tool-call envelope is sent whole at the end).
    fn delta(&mut self, index: usize, text: String, logprobs: &[TokenLogprob]) -> Option<String>;
    /// The closing chunk of choice `index`.
    fn finish(&mut self, index: usize, reason: FinishReason) -> String;
    /// The usage chunk (after every choice finished).
    fn usage(&mut self, usage: UsageDto) -> String;
}

/// Serializes a chunk; our chunk types always serialize.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value)
        .unwrap_or_else(|e| format!("{{\"error\":{{\"message\":\"{e}\"}}}}"))
}

struct SseState<E> {
    run: Box<Run>,
    encoder: E,
    usage: UsageDto,
    include_usage: bool,
    done: bool,
}

fn data(payload: String) -> Result<Event, Infallible> {
    Ok(Event::default().data(payload))
}

/// The SSE response of a generation: chunks, then usage, then `[DONE]`.
pub fn sse<E: ChunkEncoder>(
    run: Box<Run>,
    mut encoder: E,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let head: Vec<_> = encoder.start(run.choices()).into_iter().map(data).collect();
    let state = SseState {
        run,
        encoder,
        usage: UsageDto::default(),
        include_usage,
        done: false,
    };
    let body = stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let out = match st.run.next().await {
            Some((i, ev)) => on_event(&mut st, i, ev),
            None => {
                st.done = true;
                st.run.settle().await;
                let mut out = Vec::new();
                if st.include_usage {
                    out.push(st.encoder.usage(st.usage));
                }
                out.push("[DONE]".to_string());
                out
            }
        };
        Some((
            stream::iter(out.into_iter().map(data).collect::<Vec<_>>()),
            st,
        ))
    })
    .flatten();
    Sse::new(stream::iter(head).chain(body)).keep_alive(KeepAlive::default())
}

/// Replays finished choices (a cached answer) as an SSE response shaped
/// like a generated one: start, one delta and the finish per choice, the
/// usage chunk if asked for, then `[DONE]`.
pub fn replay<E: ChunkEncoder>(
    mut encoder: E,
    choices: Vec<(String, FinishReason)>,
    usage: Option<UsageDto>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut out = encoder.start(choices.len());
    for (i, (text, reason)) in choices.into_iter().enumerate() {
        out.extend(encoder.delta(i, text, &[]));
        out.push(encoder.finish(i, reason));
    }
    out.extend(usage.map(|u| encoder.usage(u)));
    out.push("[DONE]".to_string());
    Sse::new(stream::iter(out.into_iter().map(data).collect::<Vec<_>>()))
}

fn on_event<E: ChunkEncoder>(st: &mut SseState<E>, i: usize, ev: TokenEvent) -> Vec<String> {
    match ev {
        TokenEvent::Delta { text, logprobs, .. } if text.is_empty() && logprobs.is_empty() => {
            Vec::new()
        }
        TokenEvent::Delta { text, logprobs, .. } => {
            st.encoder.delta(i, text, &logprobs).into_iter().collect()
        }
        TokenEvent::Finished { reason, usage } => {
            st.usage.add(&usage);
            vec![st.encoder.finish(i, reason)]
        }
        TokenEvent::Failed(e) => {
            st.done = true;
            let err = ApiError::from(e);
            tracing::warn!(error = %err, "generation failed mid-stream");
            vec![
                to_json(&serde_json::json!({ "error": err.to_object() })),
                "[DONE]".to_string(),
            ]
        }
    }
}

/// What the request's headers ask of the response cache.
pub fn cache_mode(headers: &HeaderMap) -> CacheMode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let control = header("cache-control");
    match &header(CACHE_HEADER)[..] {
        "bypass" => CacheMode::Bypass,
        _ if control.contains("no-cache") || control.contains("no-store") => CacheMode::Bypass,
        "allow" => CacheMode::Allow,
        _ => CacheMode::Default,
    }
}

/// Which cache answered (`exact`, `semantic`), or `miss` / `bypass`.
pub const CACHE_HEADER: &str = "x-synor-cache";

/// `x-synor-cache` (and the similarity of a semantic hit).
pub fn hit_headers(hit: &Hit) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CACHE_HEADER, HeaderValue::from_static(hit.kind));
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
