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
//! `MAX_ATTEMPTS` it ends with a clean error. The relay itself is in
//! `relay`; this module places, prices and admits.
//!
//! Placement (`services::placement` scores): each executor's price for the
//! choice (a worker's ask, fee added, or the house quote), its expected
//! time from its calibrated profile (`services::calibration`, measured by
//! the server, never self-reported) scaled by a correction learned from
//! the token gaps this server observes in production, its provider's
//! measured reputation, and its load. An executor that lost a job has its
//! correction doubled so it gets less work until it proves itself again,
//! and one that just lost this job is not tried again for it. Workers are
//! eligible once calibrated. A request is billed at the terms of the
//! executor its first choice is placed on; each attempt's provider is
//! credited for its accepted work at its own prices.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::{EngineError, EngineHandle, GenerateRequest, RequestId, RequestStream};
use tokio::sync::{mpsc, watch};

use crate::fleet::registry::{Profile, Registry, WorkerInfo};
use crate::services::ServiceError;
use crate::services::metering::{Billing, Credits};
use crate::services::spotcheck::{Sample, SpotCheck, SpotConfig, Verdict};
use money::ledger::HOUSE_PROVIDER;
use money::ledger::amount::{BPS, Prices};
use relay::Relay;

pub mod encode;
mod relay;
pub mod split;
pub mod stages;
pub mod utilization;

use crate::services::placement::{
    Affinity, Candidate, MAX_CAP, Measure, Terms, Weights, gross, prefix_hashes,
};

/// Attempts of one choice before it fails.
pub const MAX_ATTEMPTS: u32 = 3;
/// How long an attempt may go without an event before it counts as lost
/// (`--fleet-progress-timeout`).
const PROGRESS: Duration = Duration::from_secs(30);
/// How long a cancelled attempt has to confirm before the relay ends it.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// The default decode step target (`--fleet-step-target-ms`).
const STEP_TARGET_MS: f64 = 100.0;

/// The house engine's key in the per-executor measures.
const HOUSE: &str = "house";

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
    /// How placement weighs price, time, reputation and load.
    weights: Weights,
    /// Prices the house and the workers (`None`: an unmetered server,
    /// where every executor costs the same).
    billing: Option<Arc<Billing>>,
    /// Admission past saturation: choices wait while every executor is at
    /// its batch cap, at most `max_queue` of them for `queue_timeout`.
    admission: Admission,
    /// Which prompt prefixes each executor ran lately.
    affinity: Mutex<Affinity>,
    /// Each executor's prefill and decode totals, as relays saw them.
    pub stages: stages::Stages,
    /// How busy each executor is.
    pub utilization: utilization::Utilization,
    /// Whether prompts may prefill on another worker than their decode.
    split_mode: split::SplitMode,
    /// How long a KV transfer may take before the decode side recomputes.
    kv_timeout: Duration,
    /// Plans, transfers and the cost model's accuracy.
    pub split: split::SplitStats,
    /// Spot checks of workers' output.
    pub spot: SpotCheck,
    /// A choice a worker has not started after this long goes to an idle
    /// worker (`--fleet-steal-after-ms`).
    steal_after: Duration,
    /// Choices taken over that way (for `/metrics`).
    pub steals: std::sync::atomic::AtomicU64,
    /// KV transfers open on each executor (sending or receiving).
    kv_open: Mutex<HashMap<String, u32>>,
    /// Each executor's embedding measures.
    encoders: encode::Encoders,
    /// Embedding jobs workers answered (for `/metrics`).
    pub embedded_on_workers: std::sync::atomic::AtomicU64,
}

/// Default `--fleet-steal-after-ms`.
const STEAL_AFTER: Duration = Duration::from_secs(1);

/// Default `--fleet-kv-timeout`.
const KV_TIMEOUT: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The queue of choices waiting for an executor with room.
#[derive(Debug)]
struct Admission {
    max_queue: usize,
    timeout: Duration,
    queued: std::sync::atomic::AtomicUsize,
    /// Signalled whenever an attempt ends (an executor has room again).
    room: tokio::sync::Notify,
}

/// Default `--fleet-max-queue` and `--fleet-queue-timeout`.
const MAX_QUEUE: usize = 256;
const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch").finish_non_exhaustive()
    }
}

/// What placement weighs for one choice.
struct Want<'a> {
    model: &'a str,
    /// The house engine's terms now.
    house: &'a Terms,
    /// The prompt (and, for a replay, the tokens already delivered).
    prompt: &'a [u32],
    max_tokens: usize,
    /// Only this provider's executors (capacity its bidder bought), the
    /// house engine where it is the house.
    only: Option<&'a str>,
}

impl<'a> Want<'a> {
    /// A request's first choice.
    fn of(model: &'a str, house: &'a Terms, r: &'a GenerateRequest, only: Option<&'a str>) -> Self {
        Self {
            model,
            house,
            prompt: &r.prompt_tokens,
            max_tokens: r.params.max_tokens,
            only,
        }
    }
}

/// Whose attempt a spot check judges, as its record names it.
fn who(c: &Caught) -> crate::services::spotcheck::Who<'_> {
    let (worker, provider) = match &c.target {
        Target::Worker {
            worker: id,
            provider,
            ..
        } => (id.as_str(), provider.as_str()),
        Target::House => (HOUSE, HOUSE),
    };
    crate::services::spotcheck::Who { worker, provider }
}

/// An attempt under a spot check: where it ran, on what terms, for
/// whose request.
#[derive(Debug, Clone)]
struct Caught {
    target: Target,
    terms: Terms,
    job: u64,
    attempt: u32,
    /// The work it was paid for (the server's counts).
    tokens: money::ledger::amount::Tokens,
    credits: Option<Credits>,
}

/// Where one attempt runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    House,
    /// A worker: its id, the provider account it earns for, and how
    /// usage records name it (`name@provider`).
    Worker {
        worker: String,
        provider: String,
        label: String,
    },
}

impl Target {
    fn key(&self) -> &str {
        match self {
            Self::House => HOUSE,
            Self::Worker { worker: id, .. } => id,
        }
    }

    /// How usage records name it.
    pub fn label(&self, house: &EngineHandle) -> String {
        match self {
            Self::House => house.info().executor.clone(),
            Self::Worker { label, .. } => label.clone(),
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
            weights: Weights::default(),
            billing: None,
            admission: Admission {
                max_queue: MAX_QUEUE,
                timeout: QUEUE_TIMEOUT,
                queued: Default::default(),
                room: tokio::sync::Notify::new(),
            },
            affinity: Mutex::default(),
            stages: stages::Stages::default(),
            utilization: utilization::Utilization::default(),
            split_mode: split::SplitMode::default(),
            kv_timeout: KV_TIMEOUT,
            split: split::SplitStats::default(),
            spot: SpotCheck::default(),
            steal_after: STEAL_AFTER,
            steals: Default::default(),
            kv_open: Mutex::default(),
            encoders: encode::Encoders::default(),
            embedded_on_workers: Default::default(),
        }
    }

    /// One more (`delta` 1) or one fewer (-1) KV transfer open on `key`.
    fn kv_transfers(&self, key: &str, delta: i32) {
        let n = {
            let mut m = lock(&self.kv_open);
            let n = m.entry(key.to_string()).or_default();
            *n = n.saturating_add_signed(delta);
            *n
        };
        self.utilization.transferring(key, n);
    }

    /// Lets an idle worker take a choice another has not started after `d`.
    pub fn with_steal_after(mut self, d: Duration) -> Self {
        self.steal_after = d;
        self
    }

    /// Whether executor `key`'s observed steps have drifted from its
    /// calibrated profile (the learned correction is past 2x either way):
    /// it gets less work meanwhile, and calibration measures it again.
    pub fn drifted(&self, key: &str) -> bool {
        lock(&self.measures)
            .get(key)
            .is_some_and(|m| m.profile.is_some() && !(0.5..=2.0).contains(&m.correction))
    }

    /// Whether a calibrated worker other than `except`, serving `model`,
    /// runs nothing for this server now.
    fn idle_worker(&self, model: &str, except: &str) -> bool {
        let measures = lock(&self.measures);
        self.fleet.serving(model).iter().any(|w| {
            w.id != except
                && measures
                    .get(&w.id)
                    .is_some_and(|m| m.profile.is_some() && m.outstanding == 0)
        })
    }

    /// Checks workers' output as `c` says (`--spot-check-*`).
    pub fn with_spot_checks(mut self, c: SpotConfig) -> Self {
        self.spot = SpotCheck::new(c);
        self
    }

    /// Runs a spot check of an attempt `target` (a worker, on `terms`)
    /// delivered, in the background; a failure costs its provider.
    fn spot_check(
        self: &Arc<Self>,
        house: EngineHandle,
        parts: Vec<(Caught, std::ops::Range<usize>)>,
        sample: Sample,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            let whose: Vec<_> = parts.iter().map(|(c, r)| (who(c), r.clone())).collect();
            let Some(verdicts) = me.spot.check_parts(&house, &sample, &whose).await else {
                return;
            };
            for ((caught, _), verdict) in parts.into_iter().zip(verdicts) {
                if let Verdict::Fail(why) = verdict {
                    me.caught(caught, &why).await;
                }
            }
        });
    }

    /// Quarantines worker `id` of `provider`, caught cheating: no more
    /// work, its token refused, its provider's standing cut.
    pub async fn quarantine(&self, id: &str, provider: &str, why: &str) {
        tracing::warn!(worker = %id, %provider, reason = %why, "quarantining a worker");
        self.fleet
            .standing
            .cheated(provider, crate::services::spotcheck::CHEAT_WEIGHT);
        let db = self.billing.as_ref().map(|b| &b.ledger.db);
        crate::services::sanctions::quarantine(db, &self.fleet, id, why).await;
    }

    /// A worker's attempt failed its spot check: its provider's standing
    /// takes the hit, the worker is quarantined, the pay is clawed back
    /// and the user refunded.
    async fn caught(&self, c: Caught, why: &str) {
        let Target::Worker {
            worker: id,
            provider,
            label,
        } = &c.target
        else {
            return;
        };
        tracing::warn!(worker = %label, job = c.job, attempt = c.attempt, "clawing back the pay of a failed spot check");
        self.quarantine(id, provider, why).await;
        let (Some(b), Some(p)) = (&self.billing, c.credits.as_ref().and_then(Credits::payer))
        else {
            return;
        };
        let tokens = c.tokens;
        let quote = money::ledger::Quote {
            provider_id: provider.clone(),
            model: String::new(),
            prices: c.terms.prices,
            fee_bps: p.fee_bps,
            payout_bps: c.terms.payout_bps,
            stages: Default::default(),
        };
        let cost = quote.cost(tokens).max(0);
        let work = money::ledger::settle::Work {
            provider: provider.clone(),
            prices: c.terms.prices,
            payout_bps: c.terms.payout_bps,
            tokens,
        };
        let pay: i64 = money::ledger::settle::payees(p.fee_bps, cost, &[work])
            .iter()
            .map(|x| x.1)
            .sum();
        let refund = if p.refundable { cost } else { 0 };
        // Its pay lands when the request settles: claw after that.
        for _ in 0..600 {
            if matches!(b.ledger.usage_of(&p.request_id).await, Ok(Some(_))) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let key = format!("{}:{}:{}", p.request_id, c.job, c.attempt);
        let memo = format!("spot check failed on {label}: {why}");
        if let Err(e) = b
            .ledger
            .clawback(&key, provider, &p.account_id, pay, refund, &memo)
            .await
        {
            tracing::error!(error = %e, %key, "the clawback failed");
        }
    }

    /// Whether prompts may prefill on another worker (`--fleet-split`),
    /// and how long a KV transfer may take (`--fleet-kv-timeout`).
    pub fn with_split(mut self, mode: split::SplitMode, kv_timeout: Duration) -> Self {
        self.split_mode = mode;
        self.kv_timeout = kv_timeout;
        self
    }

    /// Lets at most `max` choices wait for room, each for at most `wait`.
    pub fn with_queue(mut self, max: usize, wait: Duration) -> Self {
        self.admission.max_queue = max;
        self.admission.timeout = wait;
        self
    }

    /// Whether the choice would go to an executor at its batch cap now
    /// (every executor worth using is full: better to wait than to slow
    /// everyone down). Never with round-robin.
    fn saturated(&self, w: &Want<'_>) -> bool {
        if self.round_robin.is_some() {
            return false;
        }
        let (target, _) = self.choose(w, &[]);
        lock(&self.measures)
            .get(target.key())
            .is_some_and(Measure::full)
    }

    /// Choices waiting for room now.
    pub fn queued(&self) -> usize {
        self.admission
            .queued
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until some executor for `model` has room; false when the
    /// wait timed out or the client left.
    async fn wait_for_room(&self, w: &Want<'_>, abort: &mut watch::Receiver<bool>) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.saturated(w) {
            return true;
        }
        let a = &self.admission;
        a.queued.fetch_add(1, Relaxed);
        let deadline = tokio::time::Instant::now() + a.timeout;
        let ok = loop {
            if !self.saturated(w) {
                break true;
            }
            tokio::select! {
                _ = a.room.notified() => {}
                // Caps also grow, and profiles arrive, without an attempt
                // ending: look again now and then.
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = tokio::time::sleep_until(deadline) => break false,
                r = abort.changed() => if r.is_err() || *abort.borrow() { break false },
            }
        };
        a.queued.fetch_sub(1, Relaxed);
        ok
    }

    /// Weighs placement's terms by `w`.
    pub fn with_weights(mut self, w: Weights) -> Self {
        self.weights = w;
        self
    }

    /// Prices executors from `b` (the house quote, workers' asks).
    pub fn with_billing(mut self, b: Arc<Billing>) -> Self {
        self.billing = Some(b);
        self
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
        mut planned: Option<(Target, Terms)>,
    ) -> Result<Vec<RequestStream>, ServiceError> {
        let remote = !self.fleet.serving(model).is_empty();
        let full = |r: &GenerateRequest| {
            let house = self.house_terms(model, house);
            self.saturated(&Want::of(model, &house, r, None))
        };
        if remote && self.queued() >= self.admission.max_queue && requests.first().is_some_and(full)
        {
            return Err(EngineError::Overloaded {
                waiting: self.queued(),
            }
            .into());
        }
        let mut all = Vec::new();
        for r in requests {
            if !remote || r.params.grammar.is_some() {
                // Structured output stays here: its matcher cannot resume.
                all.extend(house.submit_n(r)?);
                continue;
            }
            house.validate(&r)?;
            for i in 0..r.params.n {
                let first = planned.take();
                all.push(self.relay(model, house, &r, i, credits.clone(), first));
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
        first: Option<(Target, Terms)>,
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
            first,
            cached: 0,
            timing: stages::Timing::start(),
            prefilled: None,
            check: false,
            observed: Vec::new(),
            prefilling: None,
            violation: None,
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

    /// Where the first choice of a request for `model` would run and on
    /// what terms, when workers serve it (`None`: the house engine alone,
    /// as without a fleet, or structured output, which stays here).
    pub fn plan(
        &self,
        model: &str,
        house: &EngineHandle,
        first: &GenerateRequest,
        only: Option<&str>,
    ) -> Option<(Target, Terms)> {
        if self.fleet.serving(model).is_empty() || first.params.grammar.is_some() {
            return None;
        }
        let house = self.house_terms(model, house);
        // Its prefix is remembered where it runs once the relay knows
        // whether it splits (the split's cost model reads what was there).
        Some(self.choose(&Want::of(model, &house, first, only), &[]))
    }

    /// Remembers `key` as holding `prompt`'s prefix blocks.
    fn ran_prefix(&self, key: &str, prompt: &[u32]) {
        lock(&self.affinity).record(key, &prefix_hashes(prompt));
    }

    /// Whether `provider` has an executor for `model` here: the house
    /// engine for the house, an active worker for a provider.
    pub fn can_serve(&self, model: &str, provider: &str) -> bool {
        provider == HOUSE_PROVIDER
            || self
                .fleet
                .serving(model)
                .iter()
                .any(|w| w.provider_id == provider)
    }

    /// The house engine's terms for `model` now (its quote under load).
    fn house_terms(&self, model: &str, house: &EngineHandle) -> Terms {
        let quote = self
            .billing
            .as_ref()
            .and_then(|b| b.quote(model, b.load_of(house)).ok());
        let reputation_bps = self
            .billing
            .as_ref()
            .and_then(|b| {
                b.market
                    .providers()
                    .into_iter()
                    .find(|p| p.account_id == HOUSE_PROVIDER)
            })
            .map_or(BPS, |p| p.reputation_bps);
        match quote {
            Some(q) => Terms {
                provider_id: HOUSE_PROVIDER.into(),
                prices: q.prices,
                payout_bps: q.payout_bps,
                reputation_bps,
            },
            None => Terms {
                provider_id: HOUSE_PROVIDER.into(),
                prices: Prices {
                    input: 1,
                    cached_input: 1,
                    output: 1,
                },
                payout_bps: BPS,
                reputation_bps,
            },
        }
    }

    /// A worker's terms: its ask for `model` with the fee added, or the
    /// house's prices; its provider's measured standing.
    fn worker_terms(&self, w: &WorkerInfo, model: &str, house: &Terms) -> Terms {
        let market = self.billing.as_ref().map(|b| &b.market);
        let fee = market.map_or(0, |m| m.fee_bps);
        let now = money::store::now();
        let listable =
            |a: &&protocol::Ask| market.is_none_or(|m| m.in_band(model, gross(a.output, fee)));
        let prices = w
            .asks
            .iter()
            .filter(|a| a.model == model && (a.until == 0 || a.until > now))
            .find(listable)
            .map_or(house.prices, |a| Prices {
                input: gross(a.input, fee),
                cached_input: gross(a.cached_input, fee),
                output: gross(a.output, fee),
            });
        let r = self.fleet.standing.get(&w.provider_id);
        Terms {
            provider_id: w.provider_id.clone(),
            prices,
            payout_bps: money::market::pricing::payout_bps(r.reputation_bps()),
            reputation_bps: r.reputation_bps(),
        }
    }

    /// The executor with the best score for the choice, leaving out
    /// `tried`, with its terms; it is remembered as holding the prompt's
    /// prefix.
    fn place(&self, w: &Want<'_>, tried: &[String]) -> (Target, Terms) {
        let (target, terms) = self.choose(w, tried);
        lock(&self.affinity).record(target.key(), &prefix_hashes(w.prompt));
        (target, terms)
    }

    /// Where the choice would go now (round-robin takes its turn).
    fn choose(&self, want: &Want<'_>, tried: &[String]) -> (Target, Terms) {
        let (model, house_terms) = (want.model, want.house);
        let workers = self.fleet.serving(model);
        self.sync_profiles(&workers);
        let fresh: Vec<&WorkerInfo> = workers
            .iter()
            .filter(|w| !tried.contains(&w.id))
            .filter(|w| want.only.is_none_or(|p| p == w.provider_id))
            .collect();
        if let Some(turn) = &self.round_robin
            && !fresh.is_empty()
        {
            let w = fresh[turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % fresh.len()];
            return (worker_target(w), self.worker_terms(w, model, house_terms));
        }
        let hashes = prefix_hashes(want.prompt);
        // Only another provider's executors: the house is the last resort.
        let factor = match want.only {
            Some(p) if p != HOUSE_PROVIDER => f64::MAX,
            _ => self.house_factor,
        };
        let house = (Target::House, house_terms.clone(), factor);
        let workers: Vec<_> = fresh
            .into_iter()
            .map(|w| {
                (
                    worker_target(w),
                    self.worker_terms(w, model, house_terms),
                    1.0,
                )
            })
            .collect();
        let (prompt, max_tokens) = (want.prompt.len(), want.max_tokens);
        self.best(house, workers, &hashes, prompt, max_tokens)
    }

    /// The candidate with the lowest score: the house, or the first of
    /// the workers that beats it and those before.
    fn best(
        &self,
        house: (Target, Terms, f64),
        workers: Vec<(Target, Terms, f64)>,
        hashes: &[u64],
        prompt: usize,
        max_tokens: usize,
    ) -> (Target, Terms) {
        let measures = lock(&self.measures);
        let affinity = lock(&self.affinity);
        let score = |(target, terms, factor): &(Target, Terms, f64)| {
            let m = measures.get(target.key()).copied().unwrap_or_default();
            Candidate {
                measure: &m,
                terms,
                factor: *factor,
                cached: affinity.cached_tokens(target.key(), hashes),
            }
            .score(&self.weights, prompt, max_tokens)
        };
        let mut best = (score(&house), house);
        for w in workers {
            let s = score(&w);
            if s < best.0 {
                best = (s, w);
            }
        }
        let (_, (target, terms, _)) = best;
        (target, terms)
    }

    /// Takes the profiles of workers measured by another replica (or
    /// recalibrated) into their measures.
    fn sync_profiles(&self, workers: &[WorkerInfo]) {
        for w in workers {
            let known = lock(&self.measures)
                .get(&w.id)
                .and_then(|m| m.profile)
                .map(|p| p.measured_at);
            if let Some(p) = w.profile.filter(|p| known != Some(p.measured_at)) {
                self.set_profile(&w.id, p);
            }
        }
    }

    fn measure(&self, key: &str, f: impl FnOnce(&mut Measure)) {
        let running = {
            let mut m = lock(&self.measures);
            let m = m.entry(key.to_string()).or_default();
            let before = m.outstanding;
            f(m);
            (m.outstanding != before).then_some(m.outstanding)
        };
        if let Some(n) = running {
            self.utilization.running(key, n);
        }
    }
}

fn worker_target(w: &crate::fleet::registry::WorkerInfo) -> Target {
    Target::Worker {
        worker: w.id.clone(),
        provider: w.provider_id.clone(),
        label: format!("{}@{}", w.name, w.provider_id),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::fleet::registry::Registration;

    fn profile(step_1: f64, step_4: f64) -> Profile {
        Profile {
            prefill_tokens_per_s: 1000.0,
            prefill_ms_long: 0.0,
            decode_step_ms_1: step_1,
            decode_step_ms_4: step_4,
            measured_at: 0,
        }
    }

    /// Gives a worker (or the house) its calibrated profile everywhere.
    fn calibrate(fleet: &Registry, d: &Dispatch, ids: &[&String], p: Profile) {
        for id in ids {
            fleet.set_profile(id, p);
            d.set_profile(id, p);
        }
    }

    /// A dispatcher placing by expected time alone, the house a fallback.
    fn by_time(fleet: &Arc<Registry>) -> Dispatch {
        Dispatch::new(fleet.clone())
            .with_house_factor(1000.0)
            .with_weights("latency=1".parse().expect("weights"))
    }

    /// A 10-token choice of at most 100 tokens on model `m`.
    fn short(house: &Terms) -> Want<'_> {
        Want {
            model: "m",
            house,
            prompt: &[7; 10],
            max_tokens: 100,
            only: None,
        }
    }

    /// Places a choice of `prompt` on model `m` with the test house.
    fn place(d: &Dispatch, tried: &[String], prompt: &[u32], max_tokens: usize) -> (Target, Terms) {
        let house = house();
        let w = Want {
            model: "m",
            house: &house,
            prompt,
            max_tokens,
            only: None,
        };
        d.place(&w, tried)
    }

    fn house() -> Terms {
        Terms {
            provider_id: HOUSE_PROVIDER.into(),
            prices: Prices {
                input: 100_000_000,
                cached_input: 100_000_000,
                output: 100_000_000,
            },
            payout_bps: BPS,
            reputation_bps: BPS,
        }
    }

    fn worker(fleet: &Registry, name: &str) -> String {
        priced(fleet, name, None)
    }

    /// A worker asking `output` (net, ticks per million tokens) for `m`.
    fn priced(fleet: &Registry, name: &str, output: Option<i64>) -> String {
        let asks = output
            .map(|o| protocol::Ask {
                model: "m".into(),
                input: o,
                cached_input: o,
                output: o,
                capacity: 0,
                until: 0,
                preemptible: false,
            })
            .into_iter()
            .collect();
        let (tx, _rx) = mpsc::channel(1);
        let id = fleet.register(Registration::for_test(name, asks), tx);
        std::mem::forget(_rx);
        id
    }

    #[test]
    fn placement_prefers_the_measured_fastest_until_its_batch_makes_it_slower() {
        let fleet = Arc::new(Registry::default());
        let d = by_time(&fleet);
        // Uncalibrated workers get nothing: the house it is.
        let (fast, slow) = (worker(&fleet, "fast"), worker(&fleet, "slow"));
        assert_eq!(place(&d, &[], &[7; 10], 100).0, Target::House);
        calibrate(&fleet, &d, &[&fast], profile(5.0, 8.0));
        calibrate(&fleet, &d, &[&slow], profile(40.0, 45.0));
        let key = |t: (Target, Terms)| t.0.key().to_string();
        assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
        // Loaded enough that the slow one now finishes first.
        d.measure(&fast, |m| m.outstanding = 40);
        assert_eq!(key(place(&d, &[], &[7; 10], 100)), slow);
        // A lost job doubles the correction: less work until it recovers.
        d.measure(&fast, |m| m.outstanding = 0);
        d.measure(&fast, |m| m.correction = 16.0);
        assert_eq!(key(place(&d, &[], &[7; 10], 100)), slow);
        // What just failed this job is not tried again.
        assert_eq!(
            key(place(&d, std::slice::from_ref(&slow), &[7; 10], 100)),
            fast
        );
        // Observed gaps near the prediction bring the correction back.
        for _ in 0..200 {
            d.measure(&fast, |m| m.observe(5.0));
        }
        assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
    }

    #[test]
    fn a_full_executor_is_passed_over_and_its_cap_follows_the_observed_steps() {
        let fleet = Arc::new(Registry::default());
        let d = Dispatch::new(fleet.clone())
            .with_house_factor(1000.0)
            .with_step_target(20.0)
            .with_weights("latency=1".parse().expect("weights"));
        let (fast, slow) = (worker(&fleet, "fast"), worker(&fleet, "slow"));
        calibrate(&fleet, &d, &[&fast], profile(5.0, 8.0));
        calibrate(&fleet, &d, &[&slow], profile(40.0, 45.0));
        let cap = |id: &str| d.measures.lock().expect("measures")[id].cap;
        // 5 ms + 1 ms per extra sequence stays under 20 ms up to 16.
        assert_eq!(cap(&fast), 16);
        let key = |t: (Target, Terms)| t.0.key().to_string();
        d.measure(&fast, |m| m.outstanding = 15);
        assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
        d.measure(&fast, |m| m.outstanding = 16);
        assert_eq!(key(place(&d, &[], &[7; 10], 100)), slow, "fast is full");
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
        assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
    }

    #[test]
    fn the_cheaper_of_equally_fast_workers_gets_the_choice_at_its_own_terms() {
        let fleet = Arc::new(Registry::default());
        let d = Dispatch::new(fleet.clone()).with_house_factor(1000.0);
        let (cheap, dear, taker) = (
            priced(&fleet, "cheap", Some(40_000_000)),
            priced(&fleet, "dear", Some(80_000_000)),
            worker(&fleet, "taker"),
        );
        calibrate(&fleet, &d, &[&cheap, &dear, &taker], profile(5.0, 8.0));
        let (target, terms) = place(&d, &[], &[7; 10], 100);
        assert_eq!(target.key(), cheap);
        // Its ask, as a user pays it (no billing here: no fee), and its
        // provider's standing: a new provider at 1.0x, paid 1.0x.
        assert_eq!(
            (terms.provider_id.as_str(), terms.prices.output),
            ("provider:cheap", 40_000_000)
        );
        assert_eq!(terms.reputation_bps, BPS);
        assert_eq!(terms.payout_bps, BPS);
        // Busy to its cap, the cheap one is passed over for the next cheapest.
        d.measure(&cheap, |m| m.outstanding = m.cap);
        assert_eq!(place(&d, &[], &[7; 10], 100).0.key(), dear);
        // A worker with no ask takes the house's prices.
        let (_, t) = place(&d, &[cheap.clone(), dear.clone()], &[7; 10], 100);
        assert_eq!(
            (t.provider_id.as_str(), t.prices),
            ("provider:taker", house().prices)
        );
    }

    #[tokio::test]
    async fn past_saturation_a_choice_waits_for_room_and_gives_up_at_its_deadline() {
        let fleet = Arc::new(Registry::default());
        let d = Arc::new(
            Dispatch::new(fleet.clone())
                .with_step_target(20.0)
                .with_queue(1, Duration::from_millis(200)),
        );
        let w = worker(&fleet, "w");
        for key in [HOUSE, w.as_str()] {
            d.set_profile(key, profile(5.0, 8.0));
        }
        fleet.set_profile(&w, profile(5.0, 8.0));
        let (_abort_tx, mut abort) = watch::channel(false);
        let h = house();
        let want = short(&h);
        assert!(!d.saturated(&want));
        assert!(d.wait_for_room(&want, &mut abort).await, "room: no wait");
        for key in [HOUSE, w.as_str()] {
            d.measure(key, |m| m.outstanding = m.cap);
        }
        assert!(d.saturated(&want));
        // Nobody leaves: it gives up at its deadline.
        let t = Instant::now();
        assert!(!d.wait_for_room(&want, &mut abort).await);
        assert!(t.elapsed() >= Duration::from_millis(200));
        // Someone leaves while it waits: it goes on.
        let waiter = {
            let d = d.clone();
            tokio::spawn(async move {
                let (_tx, mut abort) = watch::channel(false);
                let h = house();
                d.wait_for_room(&short(&h), &mut abort).await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(d.queued(), 1);
        d.measure(&w, |m| m.outstanding -= 1);
        d.admission.room.notify_waiters();
        assert!(waiter.await.expect("task"));
        assert_eq!(d.queued(), 0);
    }

    #[test]
    fn a_worker_that_ran_the_prompt_prefix_is_credited_for_its_cache() {
        let fleet = Arc::new(Registry::default());
        let d = by_time(&fleet);
        let (a, b) = (worker(&fleet, "a"), worker(&fleet, "b"));
        calibrate(&fleet, &d, &[&a, &b], profile(5.0, 8.0));
        let p: Vec<u32> = (0..512).collect();
        let q: Vec<u32> = (1_000..1_512).collect();
        let first = place(&d, &[], &p, 10).0.key().to_string();
        let other = if first == a { b.clone() } else { a.clone() };
        d.measure(&first, |m| m.outstanding += 1);
        // Busier, but it holds the prefix: it saves the 512-token prefill.
        assert_eq!(place(&d, &[], &p, 10).0.key(), first);
        // A prompt it never ran goes to the idle one.
        assert_eq!(place(&d, &[], &q, 10).0.key(), other);
    }

    #[test]
    fn capacity_bought_from_a_provider_runs_on_its_executors() {
        let fleet = Arc::new(Registry::default());
        let d = Dispatch::new(fleet.clone());
        let (cheap, seller) = (
            priced(&fleet, "cheap", Some(1_000_000)),
            priced(&fleet, "seller", Some(90_000_000)),
        );
        calibrate(&fleet, &d, &[&cheap, &seller], profile(5.0, 8.0));
        let h = house();
        let want = |only| Want {
            model: "m",
            house: &h,
            prompt: &[7; 10],
            max_tokens: 100,
            only,
        };
        assert_eq!(d.place(&want(None), &[]).0.key(), cheap);
        let only = want(Some("provider:seller"));
        assert_eq!(d.place(&only, &[]).0.key(), seller);
        assert!(d.can_serve("m", "provider:seller") && d.can_serve("m", HOUSE_PROVIDER));
        assert!(!d.can_serve("m", "provider:nobody"));
        // The house's capacity runs on the house engine.
        let house_only = want(Some(HOUSE_PROVIDER));
        assert_eq!(d.place(&house_only, &[]).0, Target::House);
    }

    #[test]
    fn a_worker_whose_steps_drift_from_its_profile_gets_less_work_and_is_flagged() {
        let fleet = Arc::new(Registry::default());
        let d = by_time(&fleet);
        let (a, b) = (worker(&fleet, "a"), worker(&fleet, "b"));
        calibrate(&fleet, &d, &[&a, &b], profile(5.0, 8.0));
        assert!(!d.drifted(&a) && !d.drifted(&b));
        // `a` now takes 4x its profile's step: its correction follows.
        for _ in 0..200 {
            d.measure(&a, |m| m.observe(20.0));
        }
        assert!(d.drifted(&a), "calibration should measure it again");
        let p: Vec<u32> = (0..64).collect();
        assert_eq!(place(&d, &[], &p, 50).0.key(), b, "less work meanwhile");
        // A recalibration resets the correction.
        d.set_profile(&a, profile(20.0, 24.0));
        assert!(!d.drifted(&a));
    }

    /// A profile with this prefill throughput and a 5 ms decode step.
    fn prefilling(tokens_per_s: f64) -> Profile {
        Profile {
            prefill_tokens_per_s: tokens_per_s,
            ..profile(5.0, 8.0)
        }
    }

    #[test]
    fn the_cost_model_splits_a_long_prompt_onto_a_much_faster_prefill_worker() {
        let fleet = Arc::new(Registry::default());
        let (gpu, cpu) = (worker(&fleet, "gpu"), worker(&fleet, "cpu"));
        let d = Dispatch::new(fleet.clone())
            .with_weights("latency=1".parse().expect("weights"))
            .with_split(split::SplitMode::Auto, KV_TIMEOUT);
        calibrate(&fleet, &d, &[&gpu], prefilling(100_000.0));
        calibrate(&fleet, &d, &[&cpu], prefilling(500.0));
        let h = house();
        let want = |prompt: &'static [u32], max_tokens| Want {
            model: "m",
            house: &h,
            prompt,
            max_tokens,
            only: None,
        };
        let decode = worker_target(&fleet.list().into_iter().find(|w| w.id == cpu).expect("cpu"));
        static LONG: [u32; 2048] = [7; 2048];
        // 2,048 tokens: 4 s of prefill on the decode worker, 20 ms on the
        // other, and 8 KB of KV (this model's geometry) to move.
        let (colocated, plan) = d.split_for(&want(&LONG, 16), &decode);
        let plan = plan.expect("a split");
        assert_eq!(plan.prefill.key(), gpu);
        assert!((colocated.ttft_ms - 4096.0).abs() < 1.0, "{colocated:?}");
        assert!(plan.estimate.ttft_ms < 25.0, "{:?}", plan.estimate);
        assert_eq!(plan.estimate.kv_bytes, 2048 * 4);
        // A short prompt stays where it is.
        static SHORT: [u32; 20] = [7; 20];
        assert!(d.split_for(&want(&SHORT, 16), &decode).1.is_none());
        // One token to generate: nothing to decode elsewhere.
        assert!(d.split_for(&want(&LONG, 1), &decode).1.is_none());
        // Decoding on the fast one, a slow prefill never pays.
        let fast = worker_target(&fleet.list().into_iter().find(|w| w.id == gpu).expect("gpu"));
        assert!(d.split_for(&want(&LONG, 16), &fast).1.is_none());
        // `never` never splits; `always` does whenever it can.
        let never = Dispatch::new(fleet.clone()).with_split(split::SplitMode::Never, KV_TIMEOUT);
        calibrate(&fleet, &never, &[&gpu, &cpu], prefilling(1_000.0));
        assert!(never.split_for(&want(&LONG, 16), &decode).1.is_none());
        let always = Dispatch::new(fleet.clone()).with_split(split::SplitMode::Always, KV_TIMEOUT);
        calibrate(&fleet, &always, &[&gpu, &cpu], prefilling(1_000.0));
        let plan = always.split_for(&want(&LONG, 16), &fast).1.expect("always");
        assert_eq!(plan.prefill.key(), cpu);
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
            .map(|_| place(&d, &[], &[7; 1], 1).0.key().to_string())
            .collect();
        assert_eq!(got[0], got[2]);
        assert_eq!(got[1], got[3]);
        assert_ne!(got[0], got[1]);
    }
}
