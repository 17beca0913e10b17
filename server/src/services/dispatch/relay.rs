//! One choice's relay: it runs the choice's attempts where `Dispatch`
//! places them (the house engine or a worker), forwards their events to
//! the client's stream, replays a lost attempt elsewhere with the tokens
//! already delivered, and credits each attempt's provider for its work.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use engine::core::CoreEvent;
use engine::{EngineError, EngineHandle, FinishReason, GenerateRequest, Usage};
use tokio::sync::{mpsc, watch};

use super::split::{Estimate, Prefilled, SplitPlan};
use super::stages::Timing;
use super::{CANCEL_WAIT, Caught, Dispatch, HOUSE, MAX_ATTEMPTS, Target, Want};
use crate::fleet::assignments::JobEvent;
use crate::fleet::registry::Registry;
use crate::services::metering::Credits;
use crate::services::placement::Terms;
use crate::services::spotcheck::Sample;
use money::ledger::amount::Tokens;
use money::ledger::settle::Work;
use protocol::{JobParams, ToWorker, VERSION};

/// How an attempt ended.
pub(super) enum Attempt {
    /// The choice is over (finished, failed for real, or aborted).
    Over,
    /// The executor was lost: replay elsewhere.
    Lost(String),
    /// It had not started the choice while another worker sat idle: the
    /// idle one takes it (work stealing; not the first one's fault).
    Stolen,
}

/// One choice's relay.
pub(super) struct Relay {
    pub(super) dispatch: Arc<Dispatch>,
    pub(super) house: EngineHandle,
    pub(super) model: String,
    pub(super) job: u64,
    pub(super) prompt: Vec<u32>,
    pub(super) params: engine::SamplingParams,
    /// Tokens that end generation (EOS and end-of-generation ids).
    pub(super) ends: BTreeSet<u32>,
    /// Tokens delivered to the client so far.
    pub(super) delivered: Vec<u32>,
    pub(super) accepted: bool,
    pub(super) tx: mpsc::UnboundedSender<CoreEvent>,
    /// Set when the client left or a stop string matched.
    pub(super) abort: watch::Receiver<bool>,
    /// Who delivered what, for the providers' pay.
    pub(super) credits: Option<Credits>,
    /// Where its first attempt runs, when the request was planned there.
    pub(super) first: Option<(Target, Terms)>,
    /// When the current attempt started and delivered its tokens.
    pub(super) timing: Timing,
    /// Prompt tokens the current attempt's executor had cached.
    pub(super) cached: usize,
    /// A split attempt's prefill (`None` for a colocated one).
    pub(super) prefilled: Option<Prefilled>,
    /// The current attempt is spot-checked: its tokens and the
    /// log-probabilities its worker reported.
    pub(super) check: bool,
    pub(super) observed: Vec<(u32, Option<f32>)>,
    /// The executor counted as prefilling this choice until its first
    /// token comes.
    pub(super) prefilling: Option<String>,
    /// How the current attempt's worker broke the protocol, if it did.
    pub(super) violation: Option<&'static str>,
}

/// The longest any attempt may take (a bound on a slow profile's
/// allowance).
const MAX_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(86_400);

/// The least time an attempt is allowed per token it may produce.
const MIN_TOKEN_ALLOWANCE: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a worker has to send its `done` after the last token of the
/// answer (an honest one sends both in the same breath).
const END_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

impl Relay {
    pub(super) async fn run(mut self) {
        let mut tried: Vec<String> = Vec::new();
        for attempt in 1..=MAX_ATTEMPTS {
            if let Some(reason) = self.already_over() {
                self.finish(reason, 0);
                break;
            }
            // A new choice waits while the executor it would get is full
            // (a replay goes on: it is already running for its client).
            if attempt == 1 && !self.room().await {
                let waiting = self.dispatch.queued();
                let _ = self
                    .tx
                    .send(CoreEvent::Failed(EngineError::Overloaded { waiting }));
                break;
            }
            let left = self.params.max_tokens - self.delivered.len();
            let (target, terms) = match self.first.take() {
                Some(planned) => planned,
                None => {
                    let mut prompt = self.prompt.clone();
                    prompt.extend_from_slice(&self.delivered);
                    let house = self.dispatch.house_terms(&self.model, &self.house);
                    let w = Want {
                        model: &self.model,
                        house: &house,
                        prompt: &prompt,
                        max_tokens: left,
                        only: None,
                    };
                    if attempt == 1 {
                        self.dispatch.choose(&w, &tried)
                    } else {
                        self.dispatch.place(&w, &tried)
                    }
                }
            };
            let before = self.delivered.len();
            self.cached = 0;
            self.prefilled = None;
            self.violation = None;
            self.timing = Timing::start();
            let (estimate, split) = self.plan_split(&target, attempt);
            if attempt == 1 {
                // A split's decode worker never caches the KV it imports.
                let holder = split.as_ref().map_or(&target, |plan| &plan.prefill);
                self.dispatch.ran_prefix(holder.key(), &self.prompt);
            }
            self.observed.clear();
            self.check = self.pick_check(&target, split.as_ref());
            let key = target.key().to_string();
            // A split's decode side waits for the prefill worker: it is
            // not prefilling (the prefill worker counts it).
            let prefills = split.is_none();
            self.dispatch.measure(&key, |m| {
                m.outstanding += 1;
                m.prefilling += u32::from(prefills);
            });
            self.prefilling = prefills.then(|| key.clone());
            let outcome = match (&target, &split) {
                (Target::House, _) => self.on_house().await,
                (Target::Worker { worker: id, .. }, Some(plan)) => {
                    self.on_split(id, plan, attempt).await
                }
                (Target::Worker { worker: id, .. }, None) => self.on_worker(id, attempt).await,
            };
            if let Some((ttft, tpot)) = self.timing.ttft_tpot(self.delivered.len() - before) {
                self.dispatch
                    .split
                    .observe(split.is_some(), estimate, ttft, tpot);
            }
            if let Some(plan) = &split {
                self.account_prefill(plan);
            }
            self.dispatch
                .measure(&key, |m| m.outstanding = m.outstanding.saturating_sub(1));
            self.first_token_came();
            self.dispatch.admission.room.notify_waiters();
            if matches!(outcome, Attempt::Stolen) {
                tracing::info!(job = self.job, from = %key, attempt, "an idle worker takes a choice still queued");
                self.dispatch
                    .steals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tried.push(key);
                continue;
            }
            self.account(&target, &terms, before, matches!(outcome, Attempt::Lost(_)));
            if self.check && matches!(outcome, Attempt::Over) && !self.observed.is_empty() {
                self.spot_check(&target, &terms, attempt, before, split.as_ref());
            }
            match outcome {
                Attempt::Over => break,
                Attempt::Stolen => {}
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

    /// The attempt's first token came (or it ended without one): its
    /// executor no longer counts it as prefilling.
    fn first_token_came(&mut self) {
        if let Some(key) = self.prefilling.take() {
            self.dispatch
                .measure(&key, |m| m.prefilling = m.prefilling.saturating_sub(1));
        }
    }

    /// Whether to spot-check this attempt: at the rate of the least
    /// proven provider among its workers (a split's two included).
    fn pick_check(&self, target: &Target, split: Option<&SplitPlan>) -> bool {
        let jobs = |t: &Target| match t {
            Target::Worker { provider, .. } => {
                Some(self.dispatch.fleet.standing.get(provider).jobs_ok)
            }
            Target::House => None,
        };
        let least = [Some(target), split.map(|p| &p.prefill)]
            .into_iter()
            .flatten()
            .filter_map(jobs)
            .min();
        least.is_some_and(|jobs| self.dispatch.spot.pick(jobs))
    }

    /// Hands the attempt that just ended to a spot check: the tokens are
    /// scored once; a split's first token is judged as its prefill
    /// worker's work, the rest as its decode worker's.
    fn spot_check(
        &mut self,
        target: &Target,
        terms: &Terms,
        attempt: u32,
        before: usize,
        split: Option<&SplitPlan>,
    ) {
        let p = &self.params;
        let plain_greedy = p.temperature < 1e-5
            && p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
            && p.logit_bias.is_empty();
        let mut context = self.prompt.clone();
        context.extend_from_slice(&self.delivered[..before]);
        let n = self.observed.len();
        let caught = |target: &Target, terms: &Terms, tokens: Tokens| Caught {
            target: target.clone(),
            terms: terms.clone(),
            job: self.job,
            attempt,
            tokens,
            credits: self.credits.clone(),
        };
        let mut prompt = Tokens {
            prompt: context.len() as u64,
            cached: self.cached.min(context.len()) as u64,
            completion: 0,
        };
        let mut parts = Vec::new();
        let prefilled = self.prefilled.as_ref().filter(|s| s.counts.is_some());
        if let (Some(plan), Some(s)) = (split, prefilled) {
            let (computed, cached) = s.counts.unwrap_or_default();
            let first = Tokens {
                prompt: computed as u64,
                cached: cached as u64,
                completion: 1,
            };
            parts.push((caught(&plan.prefill, &plan.terms, first), 0..1));
            if s.imported == Some(true) {
                prompt = Tokens::default();
            }
        }
        let from = parts.len();
        if from < n {
            let rest = Tokens {
                completion: (n - from) as u64,
                ..prompt
            };
            parts.push((caught(target, terms, rest), from..n));
        }
        let sample = Sample {
            context,
            tokens: std::mem::take(&mut self.observed),
            plain_greedy,
        };
        self.dispatch.spot_check(self.house.clone(), parts, sample);
    }

    /// Attempt `attempt` as a worker's assignment (`kv`: its prompt's KV
    /// comes from a prefill worker).
    pub(super) fn assignment(
        &self,
        attempt: u32,
        params: JobParams,
        kv: Option<protocol::KvIncoming>,
    ) -> ToWorker {
        ToWorker::Assign {
            v: VERSION,
            job: self.job,
            attempt,
            model: self.model.clone(),
            prompt: self.prompt.clone(),
            resume: self.delivered.clone(),
            params,
            kv,
        }
    }

    /// The cost model's estimate for attempt `attempt` on `target`, and
    /// its split plan when it picks one (first attempts only: a replay
    /// runs where it lands).
    fn plan_split(&self, target: &Target, attempt: u32) -> (Estimate, Option<SplitPlan>) {
        if attempt != 1 || !self.delivered.is_empty() {
            return (Estimate::default(), None);
        }
        let house = self.dispatch.house_terms(&self.model, &self.house);
        let w = first_want(&self.model, &self.prompt, self.params.max_tokens, &house);
        let (colocated, split) = self.dispatch.split_for(&w, target);
        let c = &self.dispatch.split;
        let n = if split.is_some() {
            &c.split
        } else {
            &c.colocated
        };
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match split {
            Some(plan) => {
                let e = plan.estimate;
                tracing::info!(job = self.job, plan = "split", prefill = %plan.prefill.key(), decode = %target.key(), est_ttft_ms = e.ttft_ms, est_tpot_ms = e.tpot_ms, est_transfer_ms = e.transfer_ms, kv_bytes = e.kv_bytes, "placed");
                (e, Some(plan))
            }
            None => (colocated, None),
        }
    }

    /// Books a split attempt's prefill: its provider is paid for the
    /// prompt and the first token when the decode worker used its KV; a
    /// prefill that failed, or whose KV was refused, counts as lost.
    fn account_prefill(&self, plan: &SplitPlan) {
        let Some(s) = &self.prefilled else { return };
        let Target::Worker {
            worker: id,
            provider,
            label,
        } = &plan.prefill
        else {
            return;
        };
        let used = s.imported == Some(true);
        if let (Some((prompt, cached)), Some(timing)) = (s.counts, &s.timing) {
            let computed = if used { prompt - cached.min(prompt) } else { 0 };
            self.dispatch.stages.record(label, computed, 1, timing);
            if let (true, Some(c)) = (used, &self.credits) {
                let work = Work {
                    provider: plan.terms.provider_id.clone(),
                    prices: plan.terms.prices,
                    payout_bps: plan.terms.payout_bps,
                    tokens: Tokens {
                        prompt: prompt as u64,
                        cached: cached as u64,
                        completion: 1,
                    },
                };
                c.attempt(label, work);
            }
        }
        let lost = s.failed || s.imported == Some(false);
        self.dispatch
            .fleet
            .record(id, provider, usize::from(used), lost);
    }

    /// Books an attempt that ended, `before` tokens having been delivered
    /// when it started: its provider's accepted work (an attempt that
    /// delivered is paid for the prompt it computed, replayed tokens
    /// included, and what it delivered, at its own prices), the worker's
    /// record, and the executor's stage times.
    fn account(&self, target: &Target, terms: &Terms, before: usize, lost: bool) {
        let mut tokens = self.delivered.len() - before;
        let executor = target.label(&self.house);
        let mut computed = (self.prompt.len() + before).saturating_sub(self.cached);
        // Split: the first token was the prefill worker's, and with its
        // KV used the prompt was too.
        let mut prompt = (self.prompt.len() + before) as u64;
        let mut cached = self.cached as u64;
        if let Some(s) = &self.prefilled {
            if s.counts.is_some() {
                tokens = tokens.saturating_sub(1);
            }
            if s.imported == Some(true) {
                (computed, prompt, cached) = (0, 0, 0);
            }
        }
        self.dispatch
            .stages
            .record(&executor, computed, tokens, &self.timing);
        if let Some(c) = &self.credits {
            let work = Work {
                provider: terms.provider_id.clone(),
                prices: terms.prices,
                payout_bps: terms.payout_bps,
                tokens: Tokens {
                    prompt,
                    cached,
                    completion: tokens as u64,
                },
            };
            c.attempt(&executor, work);
        }
        if let Target::Worker {
            worker: id,
            provider,
            ..
        } = target
        {
            let lost = lost || self.violation.is_some();
            self.dispatch.fleet.record(id, provider, tokens, lost);
        }
    }

    /// A worker's event judged by this server's own count: the choice ends
    /// where the server says (its `max_tokens`, an end token, a stop id,
    /// or a cancel it sent), never where the worker says. `Err` ends the
    /// attempt: a token past the end closes the choice as it stands (the
    /// worker is paid for no more); an end before the end is lost and
    /// replayed elsewhere. An honest worker does neither.
    pub(super) fn vet(&mut self, ev: CoreEvent, cancelled: bool) -> Result<CoreEvent, Attempt> {
        match ev {
            CoreEvent::Token { .. } => match self.already_over() {
                None => Ok(ev),
                Some(reason) => {
                    self.violated("a token past the end of the answer");
                    self.finish(reason, 0);
                    Err(Attempt::Over)
                }
            },
            CoreEvent::Finished { usage, .. } => {
                let over = self.already_over();
                match over.or(cancelled.then_some(FinishReason::Abort)) {
                    Some(reason) => Ok(CoreEvent::Finished { reason, usage }),
                    None => {
                        let why = "an end before the answer's end";
                        self.violated(why);
                        Err(Attempt::Lost(format!("the worker sent {why}")))
                    }
                }
            }
            CoreEvent::Accepted | CoreEvent::Failed(_) => Ok(ev),
        }
    }

    /// How long an attempt on `worker` may take in all: the progress
    /// timeout, then for each token it may still produce twenty of its
    /// calibrated decode steps (at four sequences) or `MIN_TOKEN_ALLOWANCE`,
    /// whichever is longer (a tenth of the progress timeout before it is
    /// calibrated). A worker that trickles one token per progress timeout
    /// cannot hold a client for minutes.
    pub(super) fn allowance(&self, worker: &str) -> std::time::Duration {
        let progress = self.dispatch.progress;
        let mut step_ms = None;
        self.dispatch
            .measure(worker, |m| step_ms = m.profile.map(|p| p.decode_step_ms_4));
        let per_token = step_ms.map_or(progress / 10, |ms| {
            std::time::Duration::from_secs_f64(20.0 * ms.max(0.0) / 1e3).max(MIN_TOKEN_ALLOWANCE)
        });
        let left = self.params.max_tokens.saturating_sub(self.delivered.len());
        let tokens = per_token.saturating_mul(u32::try_from(left).unwrap_or(u32::MAX));
        progress.saturating_add(tokens).min(MAX_ATTEMPT)
    }

    /// Records that the current attempt's worker broke the protocol (its
    /// provider's standing counts the attempt as lost).
    pub(super) fn violated(&mut self, what: &'static str) {
        tracing::warn!(
            job = self.job,
            violation = what,
            "a worker broke the protocol"
        );
        self.violation = Some(what);
        self.dispatch
            .fleet
            .violations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits, if the executor the choice would get is full, until one has
    /// room (dropping the plan made before); false when it gave up.
    async fn room(&mut self) -> bool {
        let house = self.dispatch.house_terms(&self.model, &self.house);
        let w = first_want(&self.model, &self.prompt, self.params.max_tokens, &house);
        if !self.dispatch.saturated(&w) {
            return true;
        }
        self.first = None;
        self.dispatch.wait_for_room(&w, &mut self.abort).await
    }

    /// The choice ended with what was delivered (the lost executor had
    /// produced its last token, but not its end).
    pub(super) fn already_over(&self) -> Option<FinishReason> {
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
    pub(super) fn finish(&mut self, reason: FinishReason, cached: usize) {
        self.cached = cached;
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
    pub(super) fn forward(
        &mut self,
        ev: CoreEvent,
        key: &str,
        arrivals: &mut VecDeque<Instant>,
    ) -> Option<Attempt> {
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
                self.timing.token();
                self.first_token_came();
                if let Some(ms) = step_ms(arrivals, Instant::now()) {
                    let target = self.dispatch.step_target_ms;
                    self.dispatch.measure(key, |m| {
                        m.observe(ms);
                        m.adapt(ms, target);
                    });
                }
                self.delivered.push(id);
                if self.check {
                    self.observed
                        .push((id, logprob.as_ref().map(|l| l.logprob)));
                }
                // Asked of every worker (for spot checks): the client's only
                // if it asked.
                let logprob = logprob.filter(|_| self.params.logprobs.is_some());
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
        let mut arrivals = VecDeque::new();
        let mut aborted = false;
        loop {
            tokio::select! {
                ev = raw.next() => match ev {
                    Some(ev) => {
                        if let Some(done) = self.forward(ev, HOUSE, &mut arrivals) {
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

    pub(super) async fn on_worker(&mut self, worker: &str, attempt: u32) -> Attempt {
        let fleet = self.dispatch.fleet.clone();
        let (jtx, mut jrx) = mpsc::unbounded_channel();
        fleet.jobs.place(self.job, worker, attempt, jtx);
        let assign = self.assignment(attempt, job_params(&self.params, worker), None);
        if !fleet.send(worker, assign).await {
            return Attempt::Lost("the worker is gone".into());
        }
        let mut arrivals = VecDeque::new();
        let mut cancelled: Option<Instant> = None;
        let started = Instant::now();
        let before = self.delivered.len();
        let hard_end = started + self.allowance(worker);
        let mut look = tokio::time::interval(STEAL_LOOK);
        // Progress is measured from the attempt's last token (only tokens
        // count: `accepted` does not), whatever else wakes this loop.
        let mut last_event = Instant::now();
        loop {
            let patience = match cancelled {
                Some(at) => CANCEL_WAIT.saturating_sub(at.elapsed()),
                None if self.already_over().is_some() => {
                    END_WITHIN.saturating_sub(last_event.elapsed())
                }
                None => self
                    .dispatch
                    .progress
                    .saturating_sub(last_event.elapsed())
                    .min(hard_end.saturating_duration_since(Instant::now())),
            };
            tokio::select! {
                _ = look.tick(), if cancelled.is_none() && self.delivered.len() == before && attempt < MAX_ATTEMPTS => {
                    if started.elapsed() >= self.dispatch.steal_after
                        && self.dispatch.idle_worker(&self.model, worker)
                    {
                        cancel(&fleet, worker, self.job).await;
                        return Attempt::Stolen;
                    }
                }
                ev = tokio::time::timeout(patience, jrx.recv()) => match ev {
                    Ok(Some(JobEvent::Core(ev))) => {
                        if matches!(ev, CoreEvent::Token { .. }) {
                            last_event = Instant::now();
                        }
                        let ev = match self.vet(ev, cancelled.is_some()) {
                            Ok(ev) => ev,
                            Err(end) => {
                                cancel(&fleet, worker, self.job).await;
                                return end;
                            }
                        };
                        if let Some(done) = self.forward(ev, worker, &mut arrivals) {
                            return done;
                        }
                    }
                    Ok(Some(JobEvent::Lost(why))) if cancelled.is_none() => return Attempt::Lost(why),
                    Ok(Some(JobEvent::Embedded(_))) if cancelled.is_none() => {
                        return Attempt::Lost("the worker answered a generation with vectors".into());
                    }
                    Ok(None) if cancelled.is_none() => return Attempt::Lost("the worker is gone".into()),
                    Err(_) if cancelled.is_none() => {
                        cancel(&fleet, worker, self.job).await;
                        if let Some(reason) = self.already_over() {
                            self.violated("no end after the answer's last token");
                            self.finish(reason, 0);
                            return Attempt::Over;
                        }
                        if Instant::now() >= hard_end {
                            let s = hard_end.duration_since(started).as_secs_f64();
                            return Attempt::Lost(format!("past the attempt's deadline of {s:.1} s"));
                        }
                        let s = self.dispatch.progress.as_secs_f64();
                        return Attempt::Lost(format!("no progress for {s} s"));
                    }
                    // Cancelled and the worker went quiet or away: end here.
                    Ok(Some(JobEvent::Lost(_) | JobEvent::Embedded(_)) | None) | Err(_) => {
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

/// What placement weighs for a choice's first attempt.
fn first_want<'a>(
    model: &'a str,
    prompt: &'a [u32],
    max_tokens: usize,
    house: &'a Terms,
) -> Want<'a> {
    Want {
        model,
        house,
        prompt,
        max_tokens,
        only: None,
    }
}

pub(super) async fn cancel(fleet: &Registry, worker: &str, job: u64) {
    let _ = fleet
        .send(worker, ToWorker::Cancel { v: VERSION, job })
        .await;
}

/// How often a queued attempt looks for an idle worker to take it.
const STEAL_LOOK: std::time::Duration = std::time::Duration::from_millis(100);

/// Token arrivals a decode step is measured over.
const STEP_WINDOW: usize = 16;

/// The decode step (ms) as the mean gap over the last `STEP_WINDOW`
/// arrivals of an attempt, `at` included: a worker may send several
/// tokens in one message, so one gap alone says nothing (most are zero,
/// then one spans the batch). `None` on the attempt's first token (its
/// gap is the prefill's).
fn step_ms(arrivals: &mut VecDeque<Instant>, at: Instant) -> Option<f64> {
    arrivals.push_back(at);
    if arrivals.len() > STEP_WINDOW {
        arrivals.pop_front();
    }
    let (first, last) = (arrivals.front()?, arrivals.back()?);
    let gaps = arrivals.len().checked_sub(1).filter(|&g| g > 0)?;
    Some(last.duration_since(*first).as_secs_f64() * 1e3 / gaps as f64)
}

/// The wire form of a resolved choice's sampling. Every attempt asks for
/// the sampled tokens' log-probabilities, whether or not the client did
/// and whether or not a spot check will look at them: a worker cannot
/// tell a checked attempt from another. The request's tenant goes as a
/// pseudonym of its own for each worker (`worker_tenant`).
pub(super) fn job_params(p: &engine::SamplingParams, worker: &str) -> JobParams {
    JobParams {
        tenant: worker_tenant(p.tenant, worker),
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
        logprobs: Some(
            p.logprobs
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        ),
    }
}

/// The tenant `worker` sees for `tenant`: stable on that worker (its
/// scheduler shares prefill fairly between the keys it serves), another
/// number on every other worker, so workers cannot link one key's
/// requests between them; 0 (no tenant) stays 0.
fn worker_tenant(tenant: u64, worker: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    if tenant == 0 {
        return 0;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (tenant, worker).hash(&mut h);
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_worker_sees_a_keys_tenant_as_its_own_stable_number() {
        let params = |tenant| engine::SamplingParams {
            tenant,
            ..Default::default()
        };
        let on = |t, w| job_params(&params(t), w).tenant;
        assert_eq!(on(7, "w1"), on(7, "w1"));
        assert_ne!(on(7, "w1"), on(7, "w2"));
        assert_ne!(on(7, "w1"), on(9, "w1"));
        assert_ne!(on(7, "w1"), 0);
        assert_eq!(on(0, "w1"), 0);
    }

    #[test]
    fn the_step_is_the_mean_gap_whatever_the_batching() {
        let t0 = Instant::now();
        let mut arrivals = VecDeque::new();
        assert_eq!(
            step_ms(&mut arrivals, t0),
            None,
            "the first token is the prefill's"
        );
        // Tokens in batches of four, one batch every 40 ms: 10 ms a step.
        let mut last = None;
        for batch in 1..=8u64 {
            for _ in 0..4 {
                last = step_ms(&mut arrivals, t0 + Duration::from_millis(40 * batch));
            }
        }
        // 16 arrivals span four batches (120 ms over 15 gaps): 8 ms, near
        // the true 10 ms, where a single gap says 0 or 40.
        let ms = last.expect("measured");
        assert!((8.0..=10.0).contains(&ms), "{ms}");
        // Evenly spaced tokens: exactly the gap.
        let mut even = VecDeque::new();
        let mut got = None;
        for i in 0..40u64 {
            got = step_ms(&mut even, t0 + Duration::from_millis(25 * i));
        }
        assert!((got.expect("measured") - 25.0).abs() < 1e-6);
        assert_eq!(even.len(), STEP_WINDOW);
    }
}
