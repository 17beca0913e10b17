//! The request side of generation: `OutputProcessor` turns the core's token
//! ids into text events (incremental detokenization, stop strings), and
//! `RequestStream` is the `Stream` a caller holds. Dropping the stream
//! before it finished aborts the request in the core (a client that
//! disconnects stops the work within one step).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::task::{Context, Poll};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::Stream;

use crate::core::{Command, CoreEvent};
use crate::error::EngineError;
use crate::request::{FinishReason, RequestId, TokenEvent, TokenLogprob, Usage};
use crate::tokenizer::TextTokenizer;
use crate::tokenizer::detok::IncrementalDetokenizer;
use crate::tokenizer::stop::StopMatcher;

/// Detokenizes one request's tokens and applies its stop strings.
#[derive(Debug)]
pub struct OutputProcessor {
    tokenizer: Arc<TextTokenizer>,
    detok: IncrementalDetokenizer,
    stops: StopMatcher,
    generated: usize,
    /// A stop string matched: tokens after it are dropped, and the core's
    /// final event (after our abort) only supplies the cached-token count.
    stopped: bool,
}

/// What feeding one core event produced.
#[derive(Debug, Default, PartialEq)]
pub struct Processed {
    pub events: Vec<TokenEvent>,
    /// A stop string matched here: abort the sequence in the core.
    pub abort_core: bool,
}

impl OutputProcessor {
    pub fn new(tokenizer: Arc<TextTokenizer>, prompt: &[u32], stop: Vec<String>) -> Self {
        Self {
            tokenizer,
            detok: IncrementalDetokenizer::new(prompt),
            stops: StopMatcher::new(stop),
            generated: 0,
            stopped: false,
        }
    }

    /// Feeds one event from the core.
    pub fn process(&mut self, event: CoreEvent) -> Processed {
        match event {
            CoreEvent::Accepted => Processed::default(),
            CoreEvent::Token { .. } if self.stopped => Processed::default(),
            CoreEvent::Token { id, logprob } => self.token(id, logprob),
            CoreEvent::Finished { usage, .. } if self.stopped => {
                let usage = Usage {
                    completion_tokens: self.generated,
                    ..usage
                };
                Processed {
                    events: vec![TokenEvent::Finished {
                        reason: FinishReason::Stop,
                        usage,
                    }],
                    abort_core: false,
                }
            }
            CoreEvent::Finished { reason, usage } => self.finish(reason, usage),
            CoreEvent::Failed(e) => Processed {
                events: vec![TokenEvent::Failed(e)],
                abort_core: false,
            },
        }
    }

    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Processed {
        let flushed = self.detok.flush(&self.tokenizer).unwrap_or_default();
        let step = self.stops.push(&flushed);
        let mut text = step.emit;
        if !step.stopped {
            text.push_str(&self.stops.flush());
        }
        let reason = if step.stopped {
            FinishReason::Stop
        } else {
            reason
        };
        let mut events = Vec::new();
        if !text.is_empty() {
            events.push(TokenEvent::Delta {
                text,
                token_ids: Vec::new(),
                logprobs: Vec::new(),
            });
        }
        events.push(TokenEvent::Finished { reason, usage });
        Processed {
            events,
            abort_core: false,
        }
    }

    fn token(&mut self, id: u32, logprob: Option<TokenLogprob>) -> Processed {
        self.generated += 1;
        let text = match self.detok.push(&self.tokenizer, id) {
            Ok(t) => t,
            Err(e) => {
                return Processed {
                    events: vec![TokenEvent::Failed(e)],
                    abort_core: true,
                };
            }
        };
        let step = self.stops.push(&text);
        self.stopped = step.stopped;
        let delta = TokenEvent::Delta {
            text: step.emit,
            token_ids: vec![id],
            logprobs: logprob.into_iter().collect(),
        };
        Processed {
            events: vec![delta],
            abort_core: step.stopped,
        }
    }
}

/// The stream of one request's events. Ends after `Finished` or `Failed`.
pub struct RequestStream {
    id: RequestId,
    rx: UnboundedReceiver<CoreEvent>,
    processor: OutputProcessor,
    abort: Abort,
    ready: VecDeque<TokenEvent>,
    done: bool,
    /// The core has accepted the request (see `admitted`).
    admitted: bool,
}

impl RequestStream {
    pub(crate) fn new(
        id: RequestId,
        rx: UnboundedReceiver<CoreEvent>,
        processor: OutputProcessor,
        commands: Sender<Command>,
    ) -> Self {
        Self {
            id,
            rx,
            processor,
            abort: Abort::Core(commands),
            ready: VecDeque::new(),
            done: false,
            admitted: false,
        }
    }

    /// A stream over core events that come from elsewhere (the fleet's
    /// relay of a remote executor): the same text work (detokenization
    /// after `prompt`, the `stop` strings) on this side; `on_abort` runs
    /// when a stop string matches or the stream is dropped unfinished.
    pub fn relay(
        id: RequestId,
        tokenizer: Arc<TextTokenizer>,
        prompt: &[u32],
        stop: Vec<String>,
        rx: UnboundedReceiver<CoreEvent>,
        on_abort: Box<dyn Fn() + Send + Sync>,
    ) -> Self {
        Self {
            id,
            rx,
            processor: OutputProcessor::new(tokenizer, prompt, stop),
            abort: Abort::Call(on_abort),
            ready: VecDeque::new(),
            done: false,
            admitted: false,
        }
    }

    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Waits until the engine has taken the request into its queue, or
    /// refused it (`Overloaded`, `Shutdown`), so an API can answer a
    /// refusal with a status code before it starts streaming.
    pub async fn admitted(&mut self) -> Result<(), EngineError> {
        while !self.admitted && !self.done {
            match self.rx.recv().await {
                Some(CoreEvent::Accepted) => self.admitted = true,
                Some(CoreEvent::Failed(e)) => {
                    self.done = true;
                    self.rx.close();
                    return Err(e);
                }
                Some(ev) => {
                    self.admitted = true;
                    let processed = self.processor.process(ev);
                    self.push(processed);
                }
                None => {
                    self.done = true;
                    return Err(EngineError::Shutdown);
                }
            }
        }
        Ok(())
    }

    fn push(&mut self, processed: Processed) {
        if processed.abort_core {
            self.abort.run(self.id);
        }
        for ev in processed.events {
            if matches!(ev, TokenEvent::Finished { .. } | TokenEvent::Failed(_)) {
                self.done = true;
                self.ready.push_back(ev);
                self.rx.close();
                return;
            }
            self.ready.push_back(ev);
        }
    }
}

impl Stream for RequestStream {
    type Item = TokenEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TokenEvent>> {
        let this = &mut *self;
        loop {
            if let Some(ev) = this.ready.pop_front() {
                return Poll::Ready(Some(ev));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(ev)) => {
                    let processed = this.processor.process(ev);
                    this.push(processed);
                }
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(Some(TokenEvent::Failed(EngineError::Shutdown)));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            self.abort.run(self.id);
        }
    }
}

/// How a stream stops the work behind it.
enum Abort {
    /// A command to this process's engine core.
    Core(Sender<Command>),
    /// The relay's own way (cancel on a worker).
    Call(Box<dyn Fn() + Send + Sync>),
}

impl std::fmt::Debug for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Core(_) => "Abort::Core",
            Self::Call(_) => "Abort::Call",
        })
    }
}

impl Abort {
    fn run(&self, id: RequestId) {
        match self {
            Self::Core(commands) => {
                let _ = commands.send(Command::Abort(id));
            }
            Self::Call(f) => f(),
        }
    }
}

/// One choice's core events, without the text work (`submit_raw`): what
/// an executor serving the fleet forwards. Dropping it unfinished aborts
/// the sequence.
#[derive(Debug)]
pub struct RawStream {
    id: RequestId,
    rx: UnboundedReceiver<CoreEvent>,
    commands: Sender<Command>,
    done: bool,
}

impl RawStream {
    pub(crate) fn new(
        id: RequestId,
        rx: UnboundedReceiver<CoreEvent>,
        commands: Sender<Command>,
    ) -> Self {
        Self {
            id,
            rx,
            commands,
            done: false,
        }
    }

    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` after the last (`Finished` or `Failed`) or
    /// if the engine stopped.
    pub async fn next(&mut self) -> Option<CoreEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        if matches!(
            ev,
            None | Some(CoreEvent::Finished { .. } | CoreEvent::Failed(_))
        ) {
            self.done = true;
        }
        ev
    }

    /// The next event if one is waiting, without waiting (for a caller
    /// that drives the core itself); `None` as `next` gives it, or when
    /// nothing is queued yet.
    pub fn try_next(&mut self) -> Option<CoreEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.try_recv().ok();
        if matches!(ev, Some(CoreEvent::Finished { .. } | CoreEvent::Failed(_))) {
            self.done = true;
        }
        ev
    }

    /// Whether its last event was delivered.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Stops the sequence (its `Finished` with `Abort` still follows).
    pub fn abort(&self) {
        let _ = self.commands.send(Command::Abort(self.id));
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        if !self.done {
            self.abort();
        }
    }
}
