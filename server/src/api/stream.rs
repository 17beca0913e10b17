//! From engine streams to OpenAI answers: submitting a request's choices,
//! collecting them for a plain JSON response, and encoding them as SSE
//! chunks (`data: {...}` ... `data: [DONE]`) with an optional usage chunk.
//! Dropping any of these streams (a client that left) aborts the requests.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use engine::{
    EngineHandle, FinishReason, GenerateRequest, RequestStream, TokenEvent, TokenLogprob, Usage,
};
use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use serde::Serialize;

use super::types::UsageDto;
use crate::billing::Tab;
use crate::error::ApiError;

/// How one choice ended, with its full text and log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: FinishReason,
    pub usage: Usage,
}

/// Submits every request's `n` choices, flattened in order, and waits until
/// the engine has admitted each of them, so an overloaded engine is answered
/// with 503 and `Retry-After` before any response starts; if one is refused,
/// the others are dropped (aborted).
pub async fn submit_all(
    engine: &EngineHandle,
    requests: Vec<GenerateRequest>,
) -> Result<Vec<RequestStream>, ApiError> {
    let mut all = Vec::new();
    for r in requests {
        all.extend(engine.submit_n(r)?);
    }
    for s in &mut all {
        s.admitted().await?;
    }
    Ok(all)
}

/// Runs one choice to the end.
pub async fn collect(mut stream: RequestStream) -> Result<Outcome, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            TokenEvent::Delta {
                text: t,
                logprobs: lp,
                ..
            } => {
                text.push_str(&t);
                logprobs.extend(lp);
            }
            TokenEvent::Finished { reason, usage } => {
                return Ok(Outcome {
                    text,
                    logprobs,
                    finish: reason,
                    usage,
                });
            }
            TokenEvent::Failed(e) => return Err(e.into()),
        }
    }
    Err(engine::EngineError::Shutdown.into())
}

/// Runs every choice concurrently, in order.
pub async fn collect_all(streams: Vec<RequestStream>) -> Result<Vec<Outcome>, ApiError> {
    futures_util::future::try_join_all(streams.into_iter().map(collect)).await
}

/// Interleaves the events of several choices, tagged with their index.
pub fn merge(streams: Vec<RequestStream>) -> BoxStream<'static, (usize, TokenEvent)> {
    stream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.map(move |ev| (i, ev)).boxed()),
    )
    .boxed()
}

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

/// Called with every choice's text and finish reason when a stream ends
/// normally (every choice finished); not called when it is cut or fails.
pub type OnDone = Box<dyn FnOnce(Vec<(String, FinishReason)>, &UsageDto) + Send>;

/// Collects the streamed text for `OnDone`.
struct Recorder {
    texts: Vec<String>,
    reasons: Vec<Option<FinishReason>>,
    done: OnDone,
}

struct SseState<E> {
    recorder: Option<Recorder>,
    events: BoxStream<'static, (usize, TokenEvent)>,
    /// The request's meter: settles from what was streamed when the
    /// stream ends or is dropped.
    tab: Option<Tab>,
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
    streams: Vec<RequestStream>,
    mut encoder: E,
    include_usage: bool,
    tab: Option<Tab>,
    on_done: Option<OnDone>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let head: Vec<_> = encoder.start(streams.len()).into_iter().map(data).collect();
    let n = streams.len();
    let state = SseState {
        recorder: on_done.map(|done| Recorder {
            texts: vec![String::new(); n],
            reasons: vec![None; n],
            done,
        }),
        events: merge(streams),
        tab,
        encoder,
        usage: UsageDto::default(),
        include_usage,
        done: false,
    };
    let body = stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let out = match st.events.next().await {
            Some((i, ev)) => on_event(&mut st, i, ev),
            None => {
                st.done = true;
                if let Some(r) = st.recorder.take()
                    && r.reasons.iter().all(Option::is_some)
                {
                    let choices = r
                        .texts
                        .into_iter()
                        .zip(r.reasons.into_iter().flatten())
                        .collect();
                    (r.done)(choices, &st.usage);
                }
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
    if let Some(tab) = &mut st.tab {
        tab.on_event(i, &ev);
    }
    if let Some(r) = &mut st.recorder {
        match &ev {
            TokenEvent::Delta { text, .. } => {
                if let Some(t) = r.texts.get_mut(i) {
                    t.push_str(text);
                }
            }
            TokenEvent::Finished { reason, .. } => {
                if let Some(slot) = r.reasons.get_mut(i) {
                    *slot = Some(*reason);
                }
            }
            TokenEvent::Failed(_) => st.recorder = None,
        }
    }
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
