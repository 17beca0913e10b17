//! Where each choice of a generation runs: on the house engine (this
//! process) or on a provider's worker, and what happens when a worker is
//! lost. With no worker serving the model, everything runs on the house
//! engine exactly as before. Otherwise each choice gets a relay: the
//! server keeps the text work (detokenization, stop strings) and feeds the
//! choice's stream with the token ids of whichever executor runs it. When
//! an attempt is lost (socket closed, missed heartbeats, no progress, a
//! failure report) the relay replays it elsewhere as the prompt plus the
//! tokens already delivered, with the same resolved seed, so the client
//! sees one uninterrupted stream with the text it would have got; after
//! `MAX_ATTEMPTS` it ends with a clean error.
//!
//! Placement: the executor expected to finish the choice first, from its
//! calibrated profile (`services::calibration`, measured by the server,
//! never self-reported): its prefill rate for the prompt plus the decode
//! step at the batch it would run, times `max_tokens`, scaled by a
//! correction learned from the token gaps this server observes in
//! production. An executor that lost a job has its correction doubled so
//! it gets less work until it proves itself again, and one that just lost
//! this job is not tried again for it. Workers are eligible once
//! calibrated; before the house engine's own calibration, its time per
//! token is what it delivered.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::core::CoreEvent;
use engine::{
    EngineError, EngineHandle, FinishReason, GenerateRequest, RequestId, RequestStream, Usage,
};
use tokio::sync::{mpsc, watch};

use crate::fleet::jobs::JobEvent;
use crate::fleet::protocol::{JobParams, ToWorker, VERSION};
use crate::fleet::registry::{Profile, Registry};
use crate::services::ServiceError;
use crate::services::metering::Credits;

/// Attempts of one choice before it fails.
pub const MAX_ATTEMPTS: u32 = 3;
/// How long an attempt may go without an event before it counts as lost
/// (`--fleet-progress-timeout`).
const PROGRESS: Duration = Duration::from_secs(30);
/// How long a cancelled attempt has to confirm before the relay ends it.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// The largest batch cap.
const MAX_CAP: u32 = 1024;
/// How much slower a full executor counts in placement.
const FULL_PENALTY: f64 = 4.0;
/// The default decode step target (`--fleet-step-target-ms`).
const STEP_TARGET_MS: f64 = 100.0;

/// The house engine's key in the per-executor measures.
const HOUSE: &str = "house";

/// One executor's measures, as this server observed them.
#[derive(Debug, Clone, Copy)]
struct Measure {
    /// Choices it runs for this server now.
    outstanding: u32,
    /// Moving average of milliseconds per delivered token.
    ms_per_token: f64,
    /// Its calibrated profile, once measured.
    profile: Option<Profile>,
    /// Observed token gaps over the profile's prediction (moving average;
    /// doubled when it loses a job).
    correction: f64,
    /// The most choices it takes at once so a decode step stays under the
    /// step target: from the profile, shrunk x0.7 when an observed gap
    /// misses the target, grown by one when at the cap and well under it
    /// (0: no cap yet).
    cap: u32,
}

impl Default for Measure {
    fn default() -> Self {
        Self {
            outstanding: 0,
            ms_per_token: 20.0,
            profile: None,
            correction: 1.0,
            cap: 0,
        }
    }
}

impl Measure {
    /// Expected milliseconds to run a choice of `prompt` tokens and at
    /// most `max_tokens` here, alongside what it already runs.
    fn expected_ms(&self, prompt: usize, max_tokens: usize) -> f64 {
        let batch = self.outstanding + 1;
        let raw = match &self.profile {
            Some(p) => {
                prompt as f64 * 1e3 / p.prefill_tokens_per_s.max(1.0)
                    + max_tokens as f64 * p.step_ms(batch)
            }
            None => f64::from(batch) * self.ms_per_token * max_tokens as f64,
        };
        raw * self.correction
    }

    /// Whether it runs as many choices as its cap allows.
    fn full(&self) -> bool {
        self.cap > 0 && self.outstanding >= self.cap
    }

    /// Adjusts the cap to one observed gap against the step target.
    fn adapt(&mut self, gap_ms: f64, target_ms: f64) {
        if self.cap == 0 {
            return;
        }
        if gap_ms > target_ms {
            self.cap = ((f64::from(self.cap) * 0.7) as u32).max(1);
        } else if gap_ms < 0.5 * target_ms && self.outstanding >= self.cap {
            self.cap = (self.cap + 1).min(MAX_CAP);
        }
    }

    /// Learns from one observed token gap.
    fn observe(&mut self, gap_ms: f64) {
        self.ms_per_token = 0.9 * self.ms_per_token + 0.1 * gap_ms;
        if let Some(p) = &self.profile {
            let ratio = gap_ms / p.step_ms(self.outstanding.max(1)).max(0.01);
            self.correction = (0.95 * self.correction + 0.05 * ratio).clamp(0.25, 16.0);
        }
    }
}

/// Placement and relays over the fleet.
pub struct Dispatch {
    fleet: Arc<Registry>,
    measures: Mutex<HashMap<String, Measure>>,
    /// Weight of the house engine's expected wait (`--placement-house-factor`).
    house_factor: f64,
    /// `--placement round-robin`: workers in turn (comparisons only).
    round_robin: Option<std::sync::atomic::AtomicUsize>,
    /// How long an attempt may go without an event.
    progress: Duration,
    /// The decode step a choice should see, in ms (the batch caps).
    step_target_ms: f64,
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch").finish_non_exhaustive()
    }
}

/// Where one attempt runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    House,
    /// A worker, the provider account it earns for, and how usage
    /// records name it (`name@provider`).
    Worker(String, String, String),
}

impl Target {
    fn key(&self) -> &str {
        match self {
            Self::House => HOUSE,
            Self::Worker(id, ..) => id,
        }
    }

    /// The provider credited for its tokens (`""`: the house).
    fn provider(&self) -> &str {
        match self {
            Self::House => "",
            Self::Worker(_, p, _) => p,
        }
    }
}

impl Dispatch {
    pub fn new(fleet: Arc<Registry>) -> Self {
        Self {
            fleet,
            measures: Mutex::default(),
            house_factor: 1.0,
            round_robin: None,
            progress: PROGRESS,
            step_target_ms: STEP_TARGET_MS,
        }
    }

    /// Caps each executor's batch so its decode step stays under `ms`.
    pub fn with_step_target(mut self, ms: f64) -> Self {
        if ms.is_finite() && ms > 0.0 {
            self.step_target_ms = ms;
        }
        self
    }

    /// Takes a job from a worker silent for `d`.
    pub fn with_progress_timeout(mut self, d: Duration) -> Self {
        self.progress = d;
        self
    }

    /// Places choices on the workers in turn instead of by measure.
    pub fn round_robin(mut self, on: bool) -> Self {
        self.round_robin = on.then(Default::default);
        self
    }

    /// Weighs the house engine's expected wait by `f` (finite, > 0).
    pub fn with_house_factor(mut self, f: f64) -> Self {
        if f.is_finite() && f > 0.0 {
            self.house_factor = f;
        }
        self
    }

    /// Submits every request's choices, flattened in order, and waits until
    /// each is admitted (an overloaded engine answers before any response
    /// starts; if one is refused the others are dropped).
    pub async fn submit_all(
        self: &Arc<Self>,
        model: &str,
        house: &EngineHandle,
        requests: Vec<GenerateRequest>,
        credits: Option<Credits>,
    ) -> Result<Vec<RequestStream>, ServiceError> {
        let remote = !self.fleet.serving(model).is_empty();
        let mut all = Vec::new();
        for r in requests {
            if !remote || r.params.grammar.is_some() {
                // Structured output stays here: its matcher cannot resume.
                all.extend(house.submit_n(r)?);
                continue;
            }
            house.validate(&r)?;
            for i in 0..r.params.n {
                all.push(self.relay(model, house, &r, i, credits.clone()));
            }
        }
        for s in &mut all {
            s.admitted().await?;
        }
        Ok(all)
    }

    /// Starts the relay of choice `i` of `r` and returns its stream.
    fn relay(
        self: &Arc<Self>,
        model: &str,
        house: &EngineHandle,
        r: &GenerateRequest,
        i: usize,
        credits: Option<Credits>,
    ) -> RequestStream {
        let mut params = r.params.clone();
        params.n = 1;
        params.seed = Some(match r.params.seed {
            Some(s) => s.wrapping_add(i as u64),
            None => rand::random(),
        });
        let stop = std::mem::take(&mut params.stop);
        let job = self.fleet.jobs.next_id();
        let (tx, rx) = mpsc::unbounded_channel();
        let (abort_tx, abort) = watch::channel(false);
        let tokenizer = house.shared_tokenizer();
        let mut ends: BTreeSet<u32> = tokenizer.eog_ids().clone();
        ends.extend(tokenizer.special().eos);
        let relay = Relay {
            dispatch: self.clone(),
            house: house.clone(),
            model: model.to_string(),
            job,
            prompt: r.prompt_tokens.clone(),
            params,
            ends,
            delivered: Vec::new(),
            accepted: false,
            tx,
            abort,
            credits,
        };
        tokio::spawn(relay.run());
        RequestStream::relay(
            RequestId(u64::MAX - job),
            tokenizer,
            &r.prompt_tokens,
            stop,
            rx,
            Box::new(move || {
                let _ = abort_tx.send(true);
            }),
        )
    }

    /// Records an executor's calibrated profile (`house` for this
    /// process's engine); a recalibration resets the correction.
    pub fn set_profile(&self, key: &str, p: Profile) {
        let target = self.step_target_ms;
        self.measure(key, |m| {
            m.profile = Some(p);
            m.correction = 1.0;
            m.cap = (1..=MAX_CAP)
                .take_while(|&b| p.step_ms(b) <= target)
                .last()
                .unwrap_or(1);
        });
    }

    /// The executor expected to finish first, leaving out `tried`.
    fn place(&self, model: &str, tried: &[String], prompt: usize, max_tokens: usize) -> Target {
        let workers = self.fleet.serving(model);
        if let Some(turn) = &self.round_robin {
            let fresh: Vec<_> = workers.iter().filter(|w| !tried.contains(&w.id)).collect();
            if !fresh.is_empty() {
                let w =
                    fresh[turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % fresh.len()];
                return worker_target(w);
            }
        }
        let measures = self.measures.lock().unwrap_or_else(|e| e.into_inner());
        let wait = |key: &str| {
            let m = measures.get(key).copied().unwrap_or_default();
            m.expected_ms(prompt, max_tokens)
        };
        // A full executor counts `FULL_PENALTY` times slower: others with
        // room go first, unless they are that much slower themselves (the
        // house weighed by its factor stays the fallback).
        let score = |key: &str, factor: f64| {
            let full = measures.get(key).is_some_and(Measure::full);
            wait(key) * factor * if full { FULL_PENALTY } else { 1.0 }
        };
        let mut best = (score(HOUSE, self.house_factor), Target::House);
        for w in workers.iter().filter(|w| !tried.contains(&w.id)) {
            let t = score(&w.id, 1.0);
            if t < best.0 {
                best = (t, worker_target(w));
            }
        }
        best.1
    }

    fn measure(&self, key: &str, f: impl FnOnce(&mut Measure)) {
        let mut m = self.measures.lock().unwrap_or_else(|e| e.into_inner());
        f(m.entry(key.to_string()).or_default());
    }
}

/// How an attempt ended.
enum Attempt {
    /// The choice is over (finished, failed for real, or aborted).
    Over,
    /// The executor was lost: replay elsewhere.
    Lost(String),
}

/// One choice's relay.
struct Relay {
    dispatch: Arc<Dispatch>,
    house: EngineHandle,
    model: String,
    job: u64,
    prompt: Vec<u32>,
    params: engine::SamplingParams,
    /// Tokens that end generation (EOS and end-of-generation ids).
    ends: BTreeSet<u32>,
    /// Tokens delivered to the client so far.
    delivered: Vec<u32>,
    accepted: bool,
    tx: mpsc::UnboundedSender<CoreEvent>,
    /// Set when the client left or a stop string matched.
    abort: watch::Receiver<bool>,
    /// Who delivered what, for the provider's share of the bill.
    credits: Option<Credits>,
}

impl Relay {
    async fn run(mut self) {
        let mut tried: Vec<String> = Vec::new();
        for attempt in 1..=MAX_ATTEMPTS {
            if let Some(reason) = self.already_over() {
                self.finish(reason, 0);
                break;
            }
            let left = self.params.max_tokens - self.delivered.len();
            let target = self.dispatch.place(
                &self.model,
                &tried,
                self.prompt.len() + self.delivered.len(),
                left,
            );
            let before = self.delivered.len();
            let key = target.key().to_string();
            self.dispatch.measure(&key, |m| m.outstanding += 1);
            let outcome = match &target {
                Target::House => self.on_house().await,
                Target::Worker(id, ..) => self.on_worker(id, attempt).await,
            };
            self.dispatch
                .measure(&key, |m| m.outstanding = m.outstanding.saturating_sub(1));
            let tokens = self.delivered.len() - before;
            if let Some(c) = &self.credits {
                let executor = match &target {
                    Target::House => self.house.info().executor.clone(),
                    Target::Worker(_, _, label) => label.clone(),
                };
                c.attempt(&executor, target.provider(), tokens as u64);
            }
            if let Target::Worker(id, ..) = &target {
                let lost = matches!(outcome, Attempt::Lost(_));
                self.dispatch.fleet.record(id, tokens, lost);
            }
            match outcome {
                Attempt::Over => break,
                Attempt::Lost(why) => {
                    tracing::warn!(job = self.job, executor = %key, attempt, delivered = self.delivered.len(), reason = %why, "attempt lost; replaying");
                    self.dispatch
                        .fleet
                        .replays
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // Error backoff: a lost job doubles its time per token.
                    self.dispatch.measure(&key, |m| {
                        m.ms_per_token *= 2.0;
                        m.correction = (m.correction * 2.0).min(16.0);
                    });
                    tried.push(key);
                    if attempt == MAX_ATTEMPTS {
                        let _ = self
                            .tx
                            .send(CoreEvent::Failed(EngineError::Execution(format!(
                                "the request was lost on {MAX_ATTEMPTS} executors; the last: {why}"
                            ))));
                    }
                }
            }
        }
        self.dispatch.fleet.jobs.end(self.job);
    }

    /// The choice ended with what was delivered (the lost executor had
    /// produced its last token, but not its end).
    fn already_over(&self) -> Option<FinishReason> {
        let last = self.delivered.last()?;
        if self.delivered.len() >= self.params.max_tokens {
            Some(FinishReason::Length)
        } else if (self.params.stop_token_ids.contains(last))
            || (!self.params.ignore_eos && self.ends.contains(last))
        {
            Some(FinishReason::Stop)
        } else {
            None
        }
    }

    /// Sends the end, with the usage of the whole choice.
    fn finish(&self, reason: FinishReason, cached: usize) {
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.delivered.len(),
            cached_tokens: cached.min(self.prompt.len()),
        };
        let _ = self.tx.send(CoreEvent::Finished { reason, usage });
    }

    /// Forwards one core event; `Some` when the choice is over.
    /// `last` is when this attempt's previous token came (`None` before
    /// its first: that gap is the prefill's, not a decode step).
    fn forward(&mut self, ev: CoreEvent, key: &str, last: &mut Option<Instant>) -> Option<Attempt> {
        match ev {
            CoreEvent::Accepted => {
                if !self.accepted {
                    self.accepted = true;
                    let _ = self.tx.send(CoreEvent::Accepted);
                }
                None
            }
            CoreEvent::Token { id, logprob } => {
                if id as usize >= self.house.info().vocab_size {
                    return Some(Attempt::Lost(format!(
                        "token {id} is outside the vocabulary"
                    )));
                }
                if let Some(prev) = last.replace(Instant::now()) {
                    let ms = prev.elapsed().as_secs_f64() * 1e3;
                    let target = self.dispatch.step_target_ms;
                    self.dispatch.measure(key, |m| {
                        m.observe(ms);
                        m.adapt(ms, target);
                    });
                }
                self.delivered.push(id);
                if !self.accepted {
                    self.accepted = true;
                    let _ = self.tx.send(CoreEvent::Accepted);
                }
                let _ = self.tx.send(CoreEvent::Token { id, logprob });
                None
            }
            CoreEvent::Finished { reason, usage } => {
                self.finish(reason, usage.cached_tokens);
                Some(Attempt::Over)
            }
            CoreEvent::Failed(e) => {
                let _ = self.tx.send(CoreEvent::Failed(e));
                Some(Attempt::Over)
            }
        }
    }

    async fn on_house(&mut self) -> Attempt {
        let req = GenerateRequest {
            prompt_tokens: self.prompt.clone(),
            params: self.params.clone(),
        };
        let mut raw = match self.house.submit_raw(req, self.delivered.clone()) {
            Ok(r) => r,
            Err(e) => {
                let _ = self.tx.send(CoreEvent::Failed(e));
                return Attempt::Over;
            }
        };
        let mut last = None;
        let mut aborted = false;
        loop {
            tokio::select! {
                ev = raw.next() => match ev {
                    Some(ev) => {
                        if let Some(done) = self.forward(ev, HOUSE, &mut last) {
                            return done;
                        }
                    }
                    None => {
                        let _ = self.tx.send(CoreEvent::Failed(EngineError::Shutdown));
                        return Attempt::Over;
                    }
                },
                r = self.abort.changed(), if !aborted => {
                    aborted = true;
                    if r.is_err() || *self.abort.borrow() {
                        raw.abort();
                    }
                }
            }
        }
    }

    async fn on_worker(&mut self, worker: &str, attempt: u32) -> Attempt {
        let fleet = self.dispatch.fleet.clone();
        let (jtx, mut jrx) = mpsc::unbounded_channel();
        fleet.jobs.place(self.job, worker, attempt, jtx);
        let assign = ToWorker::Assign {
            v: VERSION,
            job: self.job,
            attempt,
            model: self.model.clone(),
            prompt: self.prompt.clone(),
            resume: self.delivered.clone(),
            params: job_params(&self.params),
        };
        if !fleet.send(worker, assign).await {
            return Attempt::Lost("the worker is gone".into());
        }
        let mut last = None;
        let mut cancelled: Option<Instant> = None;
        loop {
            let patience = match cancelled {
                Some(at) => CANCEL_WAIT.saturating_sub(at.elapsed()),
                None => self.dispatch.progress,
            };
            tokio::select! {
                ev = tokio::time::timeout(patience, jrx.recv()) => match ev {
                    Ok(Some(JobEvent::Core(ev))) => {
                        if let Some(done) = self.forward(ev, worker, &mut last) {
                            return done;
                        }
                    }
                    Ok(Some(JobEvent::Lost(why))) if cancelled.is_none() => return Attempt::Lost(why),
                    Ok(None) if cancelled.is_none() => return Attempt::Lost("the worker is gone".into()),
                    Err(_) if cancelled.is_none() => {
                        cancel(&fleet, worker, self.job).await;
                        let s = self.dispatch.progress.as_secs_f64();
                        return Attempt::Lost(format!("no progress for {s} s"));
                    }
                    // Cancelled and the worker went quiet or away: end here.
                    Ok(Some(JobEvent::Lost(_)) | None) | Err(_) => {
                        self.finish(FinishReason::Abort, 0);
                        return Attempt::Over;
                    }
                },
                r = self.abort.changed(), if cancelled.is_none() => {
                    if r.is_err() || *self.abort.borrow() {
                        cancel(&fleet, worker, self.job).await;
                        cancelled = Some(Instant::now());
                    }
                }
            }
        }
    }
}

fn worker_target(w: &crate::fleet::registry::WorkerInfo) -> Target {
    Target::Worker(
        w.id.clone(),
        w.provider_id.clone(),
        format!("{}@{}", w.name, w.provider_id),
    )
}

async fn cancel(fleet: &Registry, worker: &str, job: u64) {
    let _ = fleet
        .send(worker, ToWorker::Cancel { v: VERSION, job })
        .await;
}

/// The wire form of a resolved choice's sampling.
fn job_params(p: &engine::SamplingParams) -> JobParams {
    JobParams {
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
        min_p: p.min_p,
        seed: p.seed.unwrap_or_default(),
        max_tokens: u32::try_from(p.max_tokens).unwrap_or(u32::MAX),
        stop_token_ids: p.stop_token_ids.clone(),
        ignore_eos: p.ignore_eos,
        repetition_penalty: p.repetition_penalty,
        frequency_penalty: p.frequency_penalty,
        presence_penalty: p.presence_penalty,
        logit_bias: p.logit_bias.clone(),
        logprobs: p.logprobs.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::protocol::ServedModel;
    use crate::fleet::registry::Registration;

    fn profile(step_1: f64, step_4: f64) -> Profile {
        Profile {
            prefill_tokens_per_s: 1000.0,
            decode_step_ms_1: step_1,
            decode_step_ms_4: step_4,
            measured_at: 0,
        }
    }

    fn worker(fleet: &Registry, name: &str) -> String {
        let (tx, _rx) = mpsc::channel(1);
        let id = fleet.register(
            Registration {
                provider_id: format!("provider:{name}"),
                token_id: "t".into(),
                remote: "r".into(),
                name: name.into(),
                build: "b".into(),
                devices: vec![],
                models: vec![ServedModel {
                    name: "m".into(),
                    layers: 1,
                    kv_heads: 1,
                    head_dim: 1,
                    block_size: 16,
                    context_length: 64,
                }],
                threads: 1,
                region: "r".into(),
            },
            tx,
        );
        std::mem::forget(_rx);
        id
    }

    #[test]
    fn placement_prefers_the_measured_fastest_until_its_batch_makes_it_slower() {
        let fleet = Arc::new(Registry::default());
        let d = Dispatch::new(fleet.clone()).with_house_factor(1000.0);
        // Uncalibrated workers get nothing: the house it is.
        let (fast, slow) = (worker(&fleet, "fast"), worker(&fleet, "slow"));
        assert_eq!(d.place("m", &[], 10, 100), Target::House);
        for (id, p) in [(&fast, profile(5.0, 8.0)), (&slow, profile(40.0, 45.0))] {
            fleet.set_profile(id, p);
            d.set_profile(id, p);
        }
        let key = |t: Target| t.key().to_string();
        assert_eq!(key(d.place("m", &[], 10, 100)), fast);
        // Loaded enough that the slow one now finishes first.
        d.measure(&fast, |m| m.outstanding = 40);
        assert_eq!(key(d.place("m", &[], 10, 100)), slow);
        // A lost job doubles the correction: less work until it recovers.
        d.measure(&fast, |m| m.outstanding = 0);
        d.measure(&fast, |m| m.correction = 16.0);
        assert_eq!(key(d.place("m", &[], 10, 100)), slow);
        // What just failed this job is not tried again.
        assert_eq!(
            key(d.place("m", std::slice::from_ref(&slow), 10, 100)),
            fast
        );
        // Observed gaps near the prediction bring the correction back.
        for _ in 0..200 {
            d.measure(&fast, |m| m.observe(5.0));
        }
        assert_eq!(key(d.place("m", &[], 10, 100)), fast);
    }

    #[test]
    fn a_full_executor_is_passed_over_and_its_cap_follows_the_observed_steps() {
        let fleet = Arc::new(Registry::default());
        let d = Dispatch::new(fleet.clone())
            .with_house_factor(1000.0)
            .with_step_target(20.0);
        let (fast, slow) = (worker(&fleet, "fast"), worker(&fleet, "slow"));
        for (id, p) in [(&fast, profile(5.0, 8.0)), (&slow, profile(40.0, 45.0))] {
            fleet.set_profile(id, p);
            d.set_profile(id, p);
        }
        let cap = |id: &str| d.measures.lock().expect("measures")[id].cap;
        // 5 ms + 1 ms per extra sequence stays under 20 ms up to 16.
        assert_eq!(cap(&fast), 16);
        let key = |t: Target| t.key().to_string();
        d.measure(&fast, |m| m.outstanding = 15);
        assert_eq!(key(d.place("m", &[], 10, 100)), fast);
        d.measure(&fast, |m| m.outstanding = 16);
        assert_eq!(key(d.place("m", &[], 10, 100)), slow, "fast is full");
        // A step that misses the target shrinks the cap x0.7.
        d.measure(&fast, |m| m.adapt(30.0, 20.0));
        assert_eq!(cap(&fast), 11);
        // Well under the target while full: it grows again.
        d.measure(&fast, |m| {
            m.outstanding = 11;
            m.adapt(5.0, 20.0);
        });
        assert_eq!(cap(&fast), 12);
        // Everyone full: the fastest all the same (the house, weighed by
        // its factor, stays the fallback).
        d.measure(&slow, |m| m.outstanding = 1_000);
        d.measure(&fast, |m| m.outstanding = 1_000);
        assert_eq!(key(d.place("m", &[], 10, 100)), fast);
    }

    #[test]
    fn round_robin_takes_the_workers_in_turn() {
        let fleet = Arc::new(Registry::default());
        let d = Dispatch::new(fleet.clone()).round_robin(true);
        let ids = [worker(&fleet, "a"), worker(&fleet, "b")];
        for id in &ids {
            fleet.set_profile(id, profile(5.0, 8.0));
        }
        let got: Vec<String> = (0..4)
            .map(|_| d.place("m", &[], 1, 1).key().to_string())
            .collect();
        assert_eq!(got[0], got[2]);
        assert_eq!(got[1], got[3]);
        assert_ne!(got[0], got[1]);
    }
}
