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
//! `Dispatch` holds what this server observed of each executor and hands
//! the decisions to parts with one job each:
//!
//! - `decide`: a choice's `Decision`, made once from a snapshot of plain
//!   numbers by the placement policy (`services::placement`): where it
//!   runs, on what terms, whether its prompt prefills elsewhere. The
//!   generation service decides a request's first choice and passes the
//!   decision down; a relay decides its replays.
//! - `admission`: the queue of choices waiting while every executor worth
//!   using is at its batch cap.
//! - `relay`: one choice's attempt loop (the split attempt its child).
//! - `checks`: spot checks of workers' attempts and what a failed one
//!   costs (quarantine, and a clawback the ledger makes once the request
//!   has settled).
//! - `encode`: embeddings on workers; `stages`, `utilization`, `stats`:
//!   what `/metrics` reads.
//!
//! A request is billed at the terms of the executor its first choice is
//! placed on; each attempt's provider is credited for its accepted work at
//! its own prices.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::{EngineError, EngineHandle, RequestId, RequestStream, ValidRequest};
use tokio::sync::{mpsc, watch};

use crate::fleet::registry::{Profile, Registry, WorkerInfo};
use crate::services::ServiceError;
use crate::services::metering::{Billing, Credits};
use crate::services::placement::{
    Affinity, Measure, Policy, PolicyKind, SplitMode, Weights, prefix_hashes,
};
use crate::services::served::{Executor, executor};
use crate::services::spotcheck::SpotConfig;
use money::ledger::HOUSE_PROVIDER;

mod admission;
mod checks;
mod decide;
pub mod encode;
mod relay;
pub mod stages;
pub mod stats;
pub mod utilization;

pub use checks::SpotChecks;
pub use decide::{Decision, SplitPlan, Target};
pub use stats::{DispatchStats, PlanAccuracy, SplitStats};

use decide::Want;

/// Attempts of one choice before it fails.
pub const MAX_ATTEMPTS: u32 = 3;
/// How long a cancelled attempt has to confirm before the relay ends it.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// The house engine's key in the per-executor measures.
const HOUSE: &str = "house";

/// How dispatch places, waits and gives up (`--placement*`, `--fleet-*`,
/// `--spot-check-*`); the defaults are the flags'.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// How choices are placed (`--placement`).
    pub policy: PolicyKind,
    /// How the cost model weighs price, time, reputation and load.
    pub weights: Weights,
    /// Weight of the house engine's expected wait (`--placement-house-factor`).
    pub house_factor: f64,
    /// How long an attempt may go without a token (`--fleet-progress-timeout`).
    pub progress: Duration,
    /// The decode step a choice should see, in ms: the batch caps.
    pub step_target_ms: f64,
    /// At most this many choices wait for room, each for at most
    /// `queue_timeout` (`--fleet-max-queue`, `--fleet-queue-timeout`).
    pub max_queue: usize,
    pub queue_timeout: Duration,
    /// A choice a worker has not started after this long goes to an idle
    /// worker (`--fleet-steal-after-ms`).
    pub steal_after: Duration,
    /// Whether prompts may prefill on another worker (`--fleet-split`),
    /// and how long a KV transfer may take before the decode side
    /// recomputes (`--fleet-kv-timeout`).
    pub split: SplitMode,
    pub kv_timeout: Duration,
    /// How often workers' output is checked.
    pub spot: SpotConfig,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            policy: PolicyKind::default(),
            weights: Weights::default(),
            house_factor: 1.0,
            progress: Duration::from_secs(30),
            step_target_ms: 100.0,
            max_queue: 256,
            queue_timeout: Duration::from_secs(30),
            steal_after: Duration::from_secs(1),
            split: SplitMode::default(),
            kv_timeout: Duration::from_secs(10),
            spot: SpotConfig::default(),
        }
    }
}

/// Placement and relays over the fleet.
pub struct Dispatch {
    fleet: Arc<Registry>,
    config: DispatchConfig,
    policy: Box<dyn Policy>,
    /// Prices the house and the workers (`None`: an unmetered server,
    /// where every executor costs the same).
    billing: Option<Arc<Billing>>,
    /// What this server observed of each executor.
    measures: Mutex<HashMap<String, Measure>>,
    /// Which prompt prefixes each executor ran lately.
    affinity: Mutex<Affinity>,
    /// KV transfers open on each executor (sending or receiving).
    kv_open: Mutex<HashMap<String, u32>>,
    admission: admission::Admission,
    /// Spot checks of workers' output.
    pub spot: Arc<SpotChecks>,
    /// Each executor's embedding measures.
    encoders: encode::Encoders,
    /// What `/metrics` and the fleet's admin routes read.
    pub stats: DispatchStats,
    /// The models served as pipelines of workers, by name: their stages
    /// are credited with the work of the requests they run.
    pipelines: std::sync::RwLock<HashMap<String, Arc<crate::services::pipelines::PipelineModel>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Dispatch {
    /// Dispatch over `fleet`, pricing from `billing` (`None`: unmetered).
    pub fn new(
        fleet: Arc<Registry>,
        config: DispatchConfig,
        billing: Option<Arc<Billing>>,
    ) -> Self {
        let ledger = billing.as_ref().map(|b| b.ledger.clone());
        let spot = Arc::new(SpotChecks::new(config.spot, fleet.clone(), ledger));
        Self {
            policy: crate::services::placement::policy(config.policy, config.weights),
            admission: admission::Admission::new(config.max_queue, config.queue_timeout),
            fleet,
            config,
            billing,
            measures: Mutex::default(),
            affinity: Mutex::default(),
            kv_open: Mutex::default(),
            spot,
            encoders: encode::Encoders::default(),
            stats: DispatchStats::default(),
            pipelines: Default::default(),
        }
    }

    /// `model` is served as pipeline `m`.
    pub fn add_pipeline(&self, model: &str, m: Arc<crate::services::pipelines::PipelineModel>) {
        self.pipelines
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(model.to_string(), m);
    }

    /// The models served as pipelines, by name.
    pub fn pipelines(&self) -> Vec<(String, Arc<crate::services::pipelines::PipelineModel>)> {
        let p = self.pipelines.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = p.iter().map(|(m, c)| (m.clone(), c.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The lane of pipeline model `model` a request goes to now: the one
    /// whose chain is expected to serve it soonest (the first lane when
    /// none has a chain; it waits for one).
    fn pipeline_lane(&self, model: &str) -> Option<Arc<crate::services::pipelines::Lane>> {
        let m = self
            .pipelines
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(model)
            .cloned()?;
        let soonest = m
            .lanes
            .iter()
            .filter_map(|l| l.expected_ms().map(|t| (t, l)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, l)| l.clone());
        soonest.or_else(|| m.lanes.first().cloned())
    }

    /// Submits every request's choices, flattened in order, and waits until
    /// each is admitted (an overloaded engine answers before any response
    /// starts; if one is refused the others are dropped). `planned` is
    /// the first choice's decision (`plan`).
    pub async fn submit_all(
        self: &Arc<Self>,
        model: &str,
        house: &EngineHandle,
        requests: Vec<ValidRequest>,
        credits: Option<Credits>,
        mut planned: Option<Decision>,
    ) -> Result<Vec<(RequestStream, Executor)>, ServiceError> {
        let remote = !self.fleet.serving(model).is_empty();
        let waits = planned.as_ref().is_some_and(|d| self.must_wait(d));
        if remote && self.admission.queue_full() && waits {
            return Err(EngineError::Overloaded {
                waiting: self.queued(),
            }
            .into());
        }
        let mut all = Vec::new();
        let here = executor(&house.info().executor);
        for r in requests {
            if let Some(lane) = self.pipeline_lane(model) {
                let streams = lane.engine.submit_n(r)?;
                if let Some(c) = &credits {
                    streams
                        .iter()
                        .for_each(|s| lane.cell.bill(s.id(), c.clone()));
                }
                all.extend(streams.into_iter().map(|s| (s, here.clone())));
                continue;
            }
            if !remote || r.params.grammar.is_some() {
                // Structured output stays here: its matcher cannot resume.
                let streams = house.submit_n(r)?;
                all.extend(streams.into_iter().map(|s| (s, here.clone())));
                continue;
            }
            for i in 0..r.params.n {
                let first = planned.take();
                all.push(self.relay(model, house, &r, i, credits.clone(), first));
            }
        }
        for (s, _) in &mut all {
            s.admitted().await?;
        }
        Ok(all)
    }

    /// Starts the relay of choice `i` of `r` and returns its stream, with
    /// where its attempt runs.
    fn relay(
        self: &Arc<Self>,
        model: &str,
        house: &EngineHandle,
        r: &ValidRequest,
        i: usize,
        credits: Option<Credits>,
        first: Option<Decision>,
    ) -> (RequestStream, Executor) {
        let on = executor(&house.info().executor);
        let (request, stop) = r.choice(i, rand::random());
        let job = self.fleet.jobs.next_id();
        let (tx, rx) = mpsc::unbounded_channel();
        let (abort_tx, abort) = watch::channel(false);
        let tokenizer = house.shared_tokenizer();
        let mut ends: BTreeSet<u32> = tokenizer.eog_ids().clone();
        ends.extend(tokenizer.special().eos);
        let choice = relay::Choice {
            model: model.to_string(),
            job,
            request,
            ends,
            on: on.clone(),
        };
        let client = relay::Client::new(tx, abort);
        let relay = relay::Relay::new(self.clone(), house.clone(), choice, client, credits, first);
        tokio::spawn(relay.run());
        let stream = RequestStream::relay(
            RequestId(u64::MAX - job),
            tokenizer,
            &r.prompt_tokens,
            stop,
            rx,
            Box::new(move || {
                let _ = abort_tx.send(true);
            }),
        );
        (stream, on)
    }

    /// Where the first choice of a request for `model` runs and on what
    /// terms, when workers serve it (`None`: the house engine alone, as
    /// without a fleet, or structured output, which stays here). The
    /// request is priced at its terms; the decision goes on to its relay.
    pub fn plan(
        &self,
        model: &str,
        house: &EngineHandle,
        first: &ValidRequest,
        only: Option<&str>,
    ) -> Option<Decision> {
        if self.fleet.serving(model).is_empty() || first.params.grammar.is_some() {
            return None;
        }
        let house = self.house_terms(model, house);
        // Its prefix is remembered where it runs once the relay knows
        // whether it splits (the split's cost model reads what was there).
        Some(self.decide(&Want::of(model, &house, first, only), &[], true))
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

    /// Records an executor's calibrated profile (`house` for this
    /// process's engine); a recalibration resets the correction.
    pub fn set_profile(&self, key: &str, p: Profile) {
        let target = self.config.step_target_ms;
        self.measure(key, |m| {
            let fresh = Measure::calibrated(p, target);
            m.profile = fresh.profile;
            m.correction = fresh.correction;
            m.cap = fresh.cap;
        });
    }

    /// Whether executor `key`'s observed steps have drifted from its
    /// calibrated profile (the learned correction is past 2x either way):
    /// it gets less work meanwhile, and calibration measures it again.
    pub fn drifted(&self, key: &str) -> bool {
        lock(&self.measures)
            .get(key)
            .is_some_and(|m| m.profile.is_some() && !(0.5..=2.0).contains(&m.correction))
    }

    /// Quarantines worker `id` of `provider`, caught cheating.
    pub async fn quarantine(&self, id: &str, provider: &str, why: &str) {
        self.spot.quarantine(id, provider, why).await;
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

    /// Changes executor `key`'s measure; its running count goes to the
    /// utilization clocks.
    fn measure(&self, key: &str, f: impl FnOnce(&mut Measure)) {
        let running = {
            let mut m = lock(&self.measures);
            let m = m.entry(key.to_string()).or_default();
            let before = m.outstanding;
            f(m);
            (m.outstanding != before).then_some(m.outstanding)
        };
        if let Some(n) = running {
            self.stats.utilization.running(key, n);
        }
    }

    /// An attempt started on `key` (`prefills`: its prompt runs there).
    fn started(&self, key: &str, prefills: bool) {
        self.measure(key, |m| {
            m.outstanding += 1;
            m.prefilling += u32::from(prefills);
        });
    }

    /// An attempt on `key` ended: it has room again.
    fn ended(&self, key: &str) {
        self.measure(key, |m| m.outstanding = m.outstanding.saturating_sub(1));
        self.admission.room_made();
    }

    /// Error backoff: a lost job doubles `key`'s time per token.
    fn lost_on(&self, key: &str) {
        self.measure(key, |m| {
            m.ms_per_token *= 2.0;
            m.correction = (m.correction * 2.0).min(16.0);
        });
    }

    /// One decode step observed on `key`: the correction and its cap
    /// follow.
    fn stepped(&self, key: &str, ms: f64) {
        let target = self.config.step_target_ms;
        self.measure(key, |m| {
            m.observe(ms);
            m.adapt(ms, target);
        });
    }

    /// One more (`delta` 1) or one fewer (-1) KV transfer open on `key`.
    fn kv_transfers(&self, key: &str, delta: i32) {
        let n = {
            let mut m = lock(&self.kv_open);
            let n = m.entry(key.to_string()).or_default();
            *n = n.saturating_add_signed(delta);
            *n
        };
        self.stats.utilization.transferring(key, n);
    }

    /// Remembers `key` as holding `prompt`'s prefix blocks.
    fn ran_prefix(&self, key: &str, prompt: &[u32]) {
        lock(&self.affinity).record(key, &prefix_hashes(prompt));
    }
}

#[cfg(test)]
mod tests;
