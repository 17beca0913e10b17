//! The one path of a generation, shared by chat and completions, and of an
//! embedding request: validated engine requests in, a cached answer or a
//! running stream of token events out. Around the engine it applies, once
//! and in this order: the key's tokens-per-minute limit (the worst case),
//! the response cache (lookup, and billing a hit), the quote and hold,
//! submission (admission, so an overloaded engine answers before anything
//! is streamed), then while the stream runs the meter, and when it ends the
//! settlement and the cache store. Handlers only parse, call and encode.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use engine::{
    EmbedInput, EmbeddingHandle, Embeddings, EngineError, EngineHandle, FinishReason,
    RequestStream, TokenEvent, TokenLogprob, Usage, ValidRequest,
};
use futures_util::stream::{self, BoxStream, Stream, StreamExt};

use crate::services::ServiceError;
use crate::services::caching::{CacheRequest, Hit, Plan, ResponseCaching};
use crate::services::dispatch::Target;
use crate::services::limits::Limiter;
use crate::services::metering::{Billing, Payer, Tab};
use crate::services::served::{Executor, Served, Watch, executor};
use engine::registry::ModelRegistry;
use money::ledger::amount::Stages;
use money::store::keys::KeyRecord;

/// Everything a generation passes through. Cheap to clone (handles).
#[derive(Debug, Clone)]
pub struct Generation {
    pub models: Arc<ModelRegistry>,
    pub limiter: Arc<Limiter>,
    /// `None`: requests are not metered.
    pub billing: Option<Arc<Billing>>,
    /// `None`: the response cache is off.
    pub caching: Option<ResponseCaching>,
    /// Placement over the fleet (`None`: the house engine only).
    pub dispatch: Option<Arc<crate::services::dispatch::Dispatch>>,
    /// The request series of every generation, by model and executor.
    pub served: Arc<Served>,
}

/// One validated generation request.
#[derive(Debug)]
pub struct Job {
    pub model: String,
    pub engine: EngineHandle,
    /// One engine request per prompt (each with its `n`), validated.
    pub requests: Vec<ValidRequest>,
    pub cache: CacheRequest,
}

/// What a generation answers with.
#[derive(Debug)]
pub enum Generated {
    /// A cached answer (already billed).
    Cached(Hit),
    /// A running generation.
    Fresh(Box<Run>),
}

/// How one choice ended, with its full text and log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: FinishReason,
    pub usage: Usage,
}

/// The engine tenant of a caller: its key (open mode: one tenant, 0).
fn tenant_of(key: Option<&KeyRecord>) -> u64 {
    use std::hash::{Hash, Hasher};
    key.map_or(0, |k| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        k.id.hash(&mut h);
        h.finish() | 1
    })
}

impl Generation {
    /// Runs `job` for the caller with `key` (none in open mode).
    pub async fn generate(
        &self,
        key: Option<&KeyRecord>,
        mut job: Job,
    ) -> Result<Generated, ServiceError> {
        // Each key is its own tenant: the engines share prefill between them.
        let tenant = tenant_of(key);
        for r in &mut job.requests {
            r.set_tenant(tenant);
        }
        let worst = crate::services::metering::worst_tokens(&job.requests);
        self.charge_tokens(key, worst)?;
        let mut plan = self
            .caching
            .as_ref()
            .and_then(|c| c.plan(key, &job.model, &job.requests, &job.cache));
        if let (Some(c), Some(p)) = (&self.caching, &mut plan)
            && let Some(hit) = c.lookup(p).await
        {
            c.bill_hit(self.billing.as_deref(), key, &hit).await?;
            return Ok(Generated::Cached(hit));
        }
        // Capacity the payer bought covers the request when it has room;
        // it then runs on the seller's executors, prepaid.
        let serves = |seller: &str| match &self.dispatch {
            Some(d) => d.can_serve(&job.model, seller),
            None => seller == money::ledger::HOUSE_PROVIDER,
        };
        let cover = match &self.billing {
            Some(b) => {
                b.cover(&Payer::of(key), &job.model, &job.requests, serves)
                    .await
            }
            None => None,
        };
        // With workers serving the model, the first choice is placed now,
        // once: the request is priced at the terms of the executor it
        // runs on, and the decision goes down to its relay.
        let only = cover.as_ref().map(|c| c.seller.as_str());
        let planned = match (&self.dispatch, job.requests.first()) {
            (Some(d), Some(first)) => d.plan(&job.model, &job.engine, first, only),
            _ => None,
        };
        let tab = match &self.billing {
            Some(b) => {
                let label = planned
                    .as_ref()
                    .map(|d| (d.target.label(&job.engine), &d.terms));
                let on = label.as_ref().map(|(l, t)| (l.as_str(), *t));
                let payer = Payer::of(key);
                let (model, engine) = (&job.model, &job.engine);
                Some(
                    b.open_generation(&payer, model, engine, &job.requests, on, cover.as_ref())
                        .await?,
                )
            }
            None => None,
        };
        let submitted = Instant::now();
        // Each stream's prompt, in the streams' order (a request's `n`
        // choices together).
        let prompts: Vec<usize> = job
            .requests
            .iter()
            .flat_map(|r| std::iter::repeat_n(r.prompt_tokens.len(), r.params.n))
            .collect();
        let streams = match &self.dispatch {
            Some(d) => {
                let credits = tab.as_ref().map(Tab::credits);
                d.submit_all(&job.model, &job.engine, job.requests, credits, planned)
                    .await?
            }
            None => submit_all(&job.engine, job.requests).await?,
        };
        let store = self.caching.clone().zip(plan);
        let watches = streams
            .iter()
            .map(|(_, on)| self.served.watch(&job.model, on.clone(), submitted))
            .collect();
        let streams = streams.into_iter().map(|(s, _)| s).collect();
        Ok(Generated::Fresh(Box::new(Run::new(
            streams, watches, prompts, tab, store,
        ))))
    }

    /// Embeds `input` (already validated against the model) for the caller
    /// with `key`: the same token limit and metering as a generation (the
    /// input's worst-case token count charged and held, the counted tokens
    /// settled).
    pub async fn embed(
        &self,
        key: Option<&KeyRecord>,
        model: &str,
        encoder: &EmbeddingHandle,
        input: EmbedInput,
    ) -> Result<Embeddings, ServiceError> {
        let worst = worst_tokens(&input);
        let mut charged = self.charge_tokens(key, worst);
        if let Err(ServiceError::OverLimit { param, .. }) = &mut charged {
            *param = "input";
        }
        charged?;
        let tab = match &self.billing {
            Some(b) => {
                let mut quote = b.quote(model, money::market::pricing::Occupancy::default())?;
                quote.stages = Stages::one(encoder.executor());
                Some(b.open(&Payer::of(key), &quote, &[(worst, 0)]).await?)
            }
            None => None,
        };
        let (out, on) = match &self.dispatch {
            Some(d) => d.embed(model, encoder, input, false).await?,
            None => (encoder.embed_input(input).await?, Target::House),
        };
        if let Some(mut tab) = tab {
            let usage = Usage {
                prompt_tokens: out.prompt_tokens,
                ..Usage::default()
            };
            // A worker computed it: its provider is paid for the tokens.
            if let (
                Target::Worker {
                    provider, label, ..
                },
                Some(d),
            ) = (&on, &self.dispatch)
            {
                let work = d.encoder_work(provider, tab.prices(), out.prompt_tokens);
                tab.credits().encoded(label, work);
            }
            tab.finished(0, &usage);
            crate::services::metering::settle(Some(tab)).await;
        }
        Ok(out)
    }

    /// Charges `tokens` to the key's tokens-per-minute limit.
    fn charge_tokens(&self, key: Option<&KeyRecord>, tokens: u64) -> Result<(), ServiceError> {
        match key {
            Some(k) => self.limiter.charge(k, tokens, Instant::now()),
            None => Ok(()),
        }
    }
}

/// At most how many tokens embedding inputs become: a WordPiece or BPE
/// token covers at least one character, plus the two special tokens.
fn worst_tokens(input: &EmbedInput) -> u64 {
    let n: usize = match input {
        EmbedInput::Texts(ts) => ts.iter().map(|t| t.chars().count() + 2).sum(),
        EmbedInput::Tokens(ls) => ls.iter().map(|l| l.len() + 2).sum(),
    };
    n as u64
}

/// Submits every request's `n` choices, flattened in order, and waits until
/// the engine has admitted each of them, so an overloaded engine is answered
/// with 503 and `Retry-After` before any response starts; if one is refused,
/// the others are dropped (aborted).
async fn submit_all(
    engine: &EngineHandle,
    requests: Vec<ValidRequest>,
) -> Result<Vec<(RequestStream, Executor)>, ServiceError> {
    let mut all = Vec::new();
    for r in requests {
        all.extend(engine.submit_n(r)?);
    }
    for s in &mut all {
        s.admitted().await?;
    }
    let on = executor(&engine.info().executor);
    Ok(all.into_iter().map(|s| (s, on.clone())).collect())
}

/// The cache store of a running generation: its plan and what the
/// choices produced so far.
#[derive(Debug)]
struct Recorder {
    caching: ResponseCaching,
    plan: Plan,
    /// The prices the answer is generated at (`None`: unmetered).
    prices: Option<money::ledger::Prices>,
    texts: Vec<String>,
    reasons: Vec<Option<FinishReason>>,
    usage: (u64, u64),
}

/// A running generation: the events of every choice, interleaved and
/// tagged with the choice's index. Reading it meters the request; when it
/// ends it stores the answer (if every choice finished), and `settle` bills
/// it; when it is dropped unsettled (the client left) the engine requests
/// are aborted and the meter settles what ran in the background.
pub struct Run {
    events: BoxStream<'static, (usize, TokenEvent)>,
    /// Each choice's request series, and its prompt's tokens.
    watches: Vec<Watch>,
    prompts: Vec<usize>,
    choices: usize,
    tab: Option<Tab>,
    recorder: Option<Recorder>,
    cached: bool,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("choices", &self.choices)
            .field("tab", &self.tab)
            .finish_non_exhaustive()
    }
}

impl Run {
    fn new(
        streams: Vec<RequestStream>,
        watches: Vec<Watch>,
        prompts: Vec<usize>,
        tab: Option<Tab>,
        store: Option<(ResponseCaching, Plan)>,
    ) -> Self {
        let n = streams.len();
        let events = stream::select_all(
            streams
                .into_iter()
                .enumerate()
                .map(|(i, s)| s.map(move |ev| (i, ev)).boxed()),
        )
        .boxed();
        let prices = tab.as_ref().map(Tab::prices);
        Self {
            events,
            watches,
            prompts,
            choices: n,
            tab,
            cached: store.is_some(),
            recorder: store.map(|(caching, plan)| Recorder {
                caching,
                plan,
                prices,
                texts: vec![String::new(); n],
                reasons: vec![None; n],
                usage: (0, 0),
            }),
        }
    }

    /// How many choices run.
    pub fn choices(&self) -> usize {
        self.choices
    }

    /// Whether the answer will be offered to the response cache (`miss`)
    /// or the cache was not used (`bypass`).
    pub fn cache_status(&self) -> &'static str {
        if self.cached { "miss" } else { "bypass" }
    }

    /// Meters and records one event.
    fn observe(&mut self, i: usize, ev: &TokenEvent) {
        if let Some(w) = self.watches.get_mut(i) {
            w.observe(
                ev,
                Instant::now(),
                self.prompts.get(i).copied().unwrap_or(0),
            );
        }
        if let Some(tab) = &mut self.tab {
            tab.on_event(i, ev);
        }
        let Some(r) = &mut self.recorder else {
            return;
        };
        match ev {
            TokenEvent::Delta { text, .. } => {
                if let Some(t) = r.texts.get_mut(i) {
                    t.push_str(text);
                }
            }
            TokenEvent::Finished { reason, usage } => {
                if let Some(slot) = r.reasons.get_mut(i) {
                    *slot = Some(*reason);
                }
                r.usage.0 += usage.prompt_tokens as u64;
                r.usage.1 += usage.completion_tokens as u64;
            }
            TokenEvent::Failed(_) => self.recorder = None,
        }
    }

    /// The stream ended: stores the answer if every choice finished.
    fn end(&mut self) {
        let Some(r) = self.recorder.take() else {
            return;
        };
        if r.reasons.iter().all(Option::is_some) {
            let choices = r
                .texts
                .into_iter()
                .zip(r.reasons.into_iter().flatten())
                .collect();
            r.caching.store(r.plan, choices, r.usage, r.prices);
        }
    }

    /// Settles what ran and waits for the commit, so a streamed answer is
    /// billed before its `[DONE]` (and `/v1/usage` shows it once the client
    /// has it); called again, or never, it does nothing more.
    pub async fn settle(&mut self) {
        crate::services::metering::settle(self.tab.take()).await;
    }

    /// Runs every choice to the end and settles (waiting for the commit,
    /// so a JSON answer is billed before it is sent).
    pub async fn outcomes(mut self) -> Result<Vec<Outcome>, ServiceError> {
        let mut parts = vec![Partial::default(); self.choices];
        while let Some((i, ev)) = self.events.next().await {
            self.observe(i, &ev);
            let Some(p) = parts.get_mut(i) else { continue };
            match ev {
                TokenEvent::Delta { text, logprobs, .. } => {
                    p.text.push_str(&text);
                    p.logprobs.extend(logprobs);
                }
                TokenEvent::Finished { reason, usage } => p.end = Some((reason, usage)),
                TokenEvent::Failed(e) => return Err(e.into()),
            }
        }
        // A choice whose stream ended without finishing (the engine shut
        // down): the answer is an error, so nothing is billed or cached.
        if parts.iter().any(|p| p.end.is_none()) {
            if let Some(tab) = &mut self.tab {
                tab.fail();
            }
            self.recorder = None;
            return Err(EngineError::Shutdown.into());
        }
        self.end();
        crate::services::metering::settle(self.tab.take()).await;
        parts
            .into_iter()
            .map(|p| {
                let (finish, usage) = p.end.ok_or(EngineError::Shutdown)?;
                Ok(Outcome {
                    text: p.text,
                    logprobs: p.logprobs,
                    finish,
                    usage,
                })
            })
            .collect()
    }
}

/// One choice of a JSON answer, while it runs.
#[derive(Debug, Clone, Default)]
struct Partial {
    text: String,
    logprobs: Vec<TokenLogprob>,
    end: Option<(FinishReason, Usage)>,
}

impl Stream for Run {
    type Item = (usize, TokenEvent);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.events.poll_next_unpin(cx) {
            Poll::Ready(Some((i, ev))) => {
                this.observe(i, &ev);
                Poll::Ready(Some((i, ev)))
            }
            Poll::Ready(None) => {
                // The tab stays for `settle`; a run dropped without it
                // settles in the background from what was counted.
                this.end();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
