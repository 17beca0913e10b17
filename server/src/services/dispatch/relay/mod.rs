//! One choice's relay: it runs the choice's attempts where their
//! decisions place them (the house engine or a worker), forwards their
//! events to the client's stream, replays a lost attempt elsewhere with
//! the tokens already delivered, and books each attempt's work.
//!
//! - this file: the attempt loop, forwarding and the server's own count
//!   of where the answer ends;
//! - `colocated`: an attempt on the house engine or on one worker (timeouts,
//!   cancels, work stealing);
//! - `split`: an attempt whose prompt prefills on another worker;
//! - `books`: what an ended attempt counts for (its provider's pay, its
//!   worker's record, its spot check).

mod books;
mod colocated;
mod split;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use engine::core::CoreEvent;
use engine::{EngineError, EngineHandle, FinishReason, Usage, ValidRequest};
use tokio::sync::{mpsc, watch};

use super::decide::Want;
use super::stages::Timing;
use super::{Decision, Dispatch, MAX_ATTEMPTS, Target};
use crate::services::metering::Credits;
use crate::services::placement::Terms;
use crate::services::served::Executor;
use protocol::{JobParams, ToWorker, VERSION};

use split::Prefilled;

/// How an attempt ended.
enum Attempt {
    /// The choice is over (finished, failed for real, or aborted).
    Over,
    /// The executor was lost: replay elsewhere.
    Lost(String),
    /// It had not started the choice while another worker sat idle: the
    /// idle one takes it (work stealing; not the first one's fault).
    Stolen,
}

/// What the choice is, fixed for its life.
pub(super) struct Choice {
    pub(super) model: String,
    pub(super) job: u64,
    /// Resolved, and validated where the request entered: one choice, its
    /// seed set, its stop strings left to the stream.
    pub(super) request: ValidRequest,
    /// Tokens that end generation (EOS and end-of-generation ids).
    pub(super) ends: BTreeSet<u32>,
    /// Where its current attempt runs (for the request series).
    pub(super) on: Executor,
}

/// The client's side: what it was sent, and whether it left.
pub(super) struct Client {
    /// Tokens delivered so far.
    delivered: Vec<u32>,
    accepted: bool,
    tx: mpsc::UnboundedSender<CoreEvent>,
    /// Set when the client left or a stop string matched.
    abort: watch::Receiver<bool>,
}

impl Client {
    pub(super) fn new(tx: mpsc::UnboundedSender<CoreEvent>, abort: watch::Receiver<bool>) -> Self {
        Self {
            delivered: Vec::new(),
            accepted: false,
            tx,
            abort,
        }
    }

    /// Tells the client the choice is admitted (once).
    fn accept(&mut self) {
        if !self.accepted {
            self.accepted = true;
            let _ = self.tx.send(CoreEvent::Accepted);
        }
    }

    fn send(&self, ev: CoreEvent) {
        let _ = self.tx.send(ev);
    }
}

/// The current attempt, reset when one starts.
struct Current {
    /// When it started and delivered its tokens.
    timing: Timing,
    /// Prompt tokens its executor had cached.
    cached: usize,
    /// A split attempt's prefill (`None` for a colocated one).
    prefilled: Option<Prefilled>,
    /// It is spot-checked: its tokens and the log-probabilities its
    /// worker reported.
    check: bool,
    observed: Vec<(u32, Option<f32>)>,
    /// The executor counted as prefilling it until its first token.
    prefilling: Option<String>,
    /// How its worker broke the protocol, if it did.
    violation: Option<&'static str>,
}

impl Current {
    fn start() -> Self {
        Self {
            timing: Timing::start(),
            cached: 0,
            prefilled: None,
            check: false,
            observed: Vec::new(),
            prefilling: None,
            violation: None,
        }
    }
}

/// One choice's relay.
pub(super) struct Relay {
    dispatch: Arc<Dispatch>,
    house: EngineHandle,
    choice: Choice,
    client: Client,
    /// Who delivered what, for the providers' pay.
    credits: Option<Credits>,
    /// Its first attempt's decision, when the request was planned.
    first: Option<Decision>,
    now: Current,
}

impl Relay {
    pub(super) fn new(
        dispatch: Arc<Dispatch>,
        house: EngineHandle,
        choice: Choice,
        client: Client,
        credits: Option<Credits>,
        first: Option<Decision>,
    ) -> Self {
        Self {
            dispatch,
            house,
            choice,
            client,
            credits,
            first,
            now: Current::start(),
        }
    }

    /// Runs the choice's attempts until one ends it.
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
                self.client
                    .send(CoreEvent::Failed(EngineError::Overloaded { waiting }));
                break;
            }
            let d = self.decision(attempt, &tried);
            let before = self.client.delivered.len();
            let outcome = self.attempt(&d, attempt).await;
            if !self.after(outcome, &d, attempt, before, &mut tried) {
                break;
            }
        }
        self.dispatch.fleet.jobs.end(self.choice.job);
    }

    /// What placement weighs for the choice now: `prompt` (with the
    /// tokens delivered), at most what may still come.
    fn want<'a>(&self, model: &'a str, prompt: &'a [u32], house: &'a Terms) -> Want<'a> {
        Want {
            model,
            house,
            prompt,
            max_tokens: self.choice.request.params.max_tokens - self.client.delivered.len(),
            only: None,
        }
    }

    /// Waits, if the executor the choice would get is full, until one has
    /// room (the decision made before is dropped); false when it gave up.
    async fn room(&mut self) -> bool {
        let house = self.dispatch.house_terms(&self.choice.model, &self.house);
        let (model, prompt) = (
            self.choice.model.clone(),
            self.choice.request.prompt_tokens.clone(),
        );
        let w = self.want(&model, &prompt, &house);
        let d = match self.first.take() {
            Some(d) => d,
            None => self.dispatch.decide(&w, &[], true),
        };
        if !self.dispatch.must_wait(&d) {
            self.first = Some(d);
            return true;
        }
        self.dispatch
            .wait_for_room(&w, &mut self.client.abort)
            .await
    }

    /// Attempt `attempt`'s decision: the one made for it, or one made now
    /// over what was not `tried` (a replay's remembered as holding its
    /// prompt; a first attempt's prefix is remembered where it prefills).
    fn decision(&mut self, attempt: u32, tried: &[String]) -> Decision {
        if let Some(d) = self.first.take() {
            return d;
        }
        let house = self.dispatch.house_terms(&self.choice.model, &self.house);
        let mut prompt = self.choice.request.prompt_tokens.clone();
        prompt.extend_from_slice(&self.client.delivered);
        let model = self.choice.model.clone();
        let d = (self.dispatch).decide(&self.want(&model, &prompt, &house), tried, attempt == 1);
        if attempt > 1 {
            self.dispatch.ran_prefix(d.target.key(), &prompt);
        }
        d
    }

    /// Runs one attempt as `d` says and books its executor's load.
    async fn attempt(&mut self, d: &Decision, attempt: u32) -> Attempt {
        self.now = Current::start();
        *self.choice.on.lock().unwrap_or_else(|p| p.into_inner()) = d.target.label(&self.house);
        if attempt == 1 {
            self.placed(d);
        }
        self.now.check = self.pick_check(&d.target, d.split.as_ref());
        let key = d.target.key().to_string();
        // A split's decode side waits for the prefill worker: it is not
        // prefilling (the prefill worker counts it).
        let prefills = d.split.is_none();
        self.dispatch.started(&key, prefills);
        self.now.prefilling = prefills.then(|| key.clone());
        let before = self.client.delivered.len();
        let outcome = match (&d.target, &d.split) {
            (Target::House, _) => self.on_house().await,
            (Target::Worker { worker: id, .. }, Some(plan)) => {
                self.on_split(id, plan, attempt).await
            }
            (Target::Worker { worker: id, .. }, None) => self.on_worker(id, attempt).await,
        };
        let n = self.client.delivered.len() - before;
        if let Some((ttft, tpot)) = self.now.timing.ttft_tpot(n) {
            let split = &self.dispatch.stats.split;
            split.observe(d.split.is_some(), d.estimate, ttft, tpot);
        }
        if let Some(plan) = &d.split {
            self.account_prefill(plan);
        }
        self.dispatch.ended(&key);
        self.first_token_came();
        outcome
    }

    /// A first attempt is placed: its plan is counted and logged, and its
    /// prompt's prefix remembered where it will be cached.
    fn placed(&self, d: &Decision) {
        self.dispatch.stats.split.planned(d.split.is_some());
        let holder = match &d.split {
            Some(plan) => {
                let e = plan.estimate;
                tracing::info!(job = self.choice.job, plan = "split", prefill = %plan.prefill.key(), decode = %d.target.key(), est_ttft_ms = e.ttft_ms, est_tpot_ms = e.tpot_ms, est_transfer_ms = e.transfer_ms, kv_bytes = e.kv_bytes, "placed");
                &plan.prefill
            }
            // A split's decode worker never caches the KV it imports.
            None => &d.target,
        };
        self.dispatch
            .ran_prefix(holder.key(), &self.choice.request.prompt_tokens);
    }

    /// Books an ended attempt; whether the choice goes on to another.
    fn after(
        &mut self,
        outcome: Attempt,
        d: &Decision,
        attempt: u32,
        before: usize,
        tried: &mut Vec<String>,
    ) -> bool {
        let key = d.target.key().to_string();
        if matches!(outcome, Attempt::Stolen) {
            tracing::info!(job = self.choice.job, from = %key, attempt, "an idle worker takes a choice still queued");
            self.dispatch.stats.steals.inc();
            tried.push(key);
            return true;
        }
        let lost = matches!(outcome, Attempt::Lost(_));
        self.account(&d.target, &d.terms, before, lost);
        if self.now.check && matches!(outcome, Attempt::Over) && !self.now.observed.is_empty() {
            self.spot_check(&d.target, &d.terms, attempt, before, d.split.as_ref());
        }
        let Attempt::Lost(why) = outcome else {
            return false;
        };
        tracing::warn!(job = self.choice.job, executor = %key, attempt, delivered = self.client.delivered.len(), reason = %why, "attempt lost; replaying");
        self.dispatch.fleet.counts.replays.inc();
        self.dispatch.lost_on(&key);
        tried.push(key);
        if attempt == MAX_ATTEMPTS {
            let why = format!("the request was lost on {MAX_ATTEMPTS} executors; the last: {why}");
            self.client
                .send(CoreEvent::Failed(EngineError::Execution(why)));
        }
        true
    }

    /// The attempt's first token came (or it ended without one): its
    /// executor no longer counts it as prefilling.
    fn first_token_came(&mut self) {
        if let Some(key) = self.now.prefilling.take() {
            self.dispatch
                .measure(&key, |m| m.prefilling = m.prefilling.saturating_sub(1));
        }
    }

    /// Attempt `attempt` as a worker's assignment (`kv`: its prompt's KV
    /// comes from a prefill worker).
    fn assignment(
        &self,
        attempt: u32,
        params: JobParams,
        kv: Option<protocol::KvIncoming>,
    ) -> ToWorker {
        ToWorker::Assign {
            v: VERSION,
            job: self.choice.job,
            attempt,
            model: self.choice.model.clone(),
            prompt: self.choice.request.prompt_tokens.clone(),
            resume: self.client.delivered.clone(),
            params,
            kv,
        }
    }

    /// The choice ended with what was delivered (the lost executor had
    /// produced its last token, but not its end).
    fn already_over(&self) -> Option<FinishReason> {
        let last = self.client.delivered.last()?;
        let p = &self.choice.request.params;
        if self.client.delivered.len() >= p.max_tokens {
            Some(FinishReason::Length)
        } else if p.stop_token_ids.contains(last)
            || (!p.ignore_eos && self.choice.ends.contains(last))
        {
            Some(FinishReason::Stop)
        } else {
            None
        }
    }

    /// Sends the end, with the usage of the whole choice.
    fn finish(&mut self, reason: FinishReason, cached: usize) {
        self.now.cached = cached;
        let prompt = self.choice.request.prompt_tokens.len();
        let usage = Usage {
            prompt_tokens: prompt,
            completion_tokens: self.client.delivered.len(),
            cached_tokens: cached.min(prompt),
        };
        self.client.send(CoreEvent::Finished { reason, usage });
    }

    /// Forwards one core event from executor `key`; `Some` when the
    /// choice is over. `arrivals` are the attempt's token arrivals (the
    /// decode step is measured over them).
    fn forward(
        &mut self,
        ev: CoreEvent,
        key: &str,
        arrivals: &mut VecDeque<Instant>,
    ) -> Option<Attempt> {
        match ev {
            CoreEvent::Accepted => {
                self.client.accept();
                None
            }
            CoreEvent::Token { id, logprob } => {
                if id as usize >= self.house.info().vocab_size {
                    return Some(Attempt::Lost(format!(
                        "token {id} is outside the vocabulary"
                    )));
                }
                self.now.timing.token();
                self.first_token_came();
                if let Some(ms) = step_ms(arrivals, Instant::now()) {
                    self.dispatch.stepped(key, ms);
                }
                self.client.delivered.push(id);
                if self.now.check {
                    let lp = logprob.as_ref().map(|l| l.logprob);
                    self.now.observed.push((id, lp));
                }
                // Asked of every worker (for spot checks): the client's only
                // if it asked.
                let logprob = logprob.filter(|_| self.choice.request.params.logprobs.is_some());
                self.client.accept();
                self.client.send(CoreEvent::Token { id, logprob });
                None
            }
            CoreEvent::Finished { reason, usage } => {
                self.finish(reason, usage.cached_tokens);
                Some(Attempt::Over)
            }
            CoreEvent::Failed(e) => {
                self.client.send(CoreEvent::Failed(e));
                Some(Attempt::Over)
            }
        }
    }

    /// A worker's event judged by this server's own count: the choice ends
    /// where the server says (its `max_tokens`, an end token, a stop id,
    /// or a cancel it sent), never where the worker says. `Err` ends the
    /// attempt: a token past the end closes the choice as it stands (the
    /// worker is paid for no more); an end before the end is lost and
    /// replayed elsewhere. An honest worker does neither.
    fn vet(&mut self, ev: CoreEvent, cancelled: bool) -> Result<CoreEvent, Attempt> {
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

    /// Records that the current attempt's worker broke the protocol (its
    /// provider's standing counts the attempt as lost).
    fn violated(&mut self, what: &'static str) {
        tracing::warn!(
            job = self.choice.job,
            violation = what,
            "a worker broke the protocol"
        );
        self.now.violation = Some(what);
        self.dispatch.fleet.counts.violations.inc();
    }
}

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

/// The wire form of a resolved choice's sampling (`protocol::sampling`:
/// every job asks for log-probabilities), the request's tenant as a
/// pseudonym of its own for each worker (`worker_tenant`).
fn job_params(p: &engine::SamplingParams, worker: &str) -> JobParams {
    JobParams::of(p, worker_tenant(p.tenant, worker))
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

/// Tells `worker` to stop `job` (a job or a transfer).
async fn cancel(fleet: &crate::fleet::registry::Registry, worker: &str, job: u64) {
    let _ = fleet
        .send(worker, ToWorker::Cancel { v: VERSION, job })
        .await;
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
