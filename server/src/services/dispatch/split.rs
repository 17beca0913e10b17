//! Prefill/decode disaggregation across workers: the cost model that
//! decides per choice whether its prompt runs on another worker than its
//! decode (`Dispatch::split_for`), and the split attempt itself
//! (`Relay::on_split`).
//!
//! The model: colocated on the decode worker D, the prompt costs D's
//! prefill time, and every choice D runs stalls for it (D's outstanding
//! choices x that time). Split, the prompt runs on P (P's prefill time,
//! P's choices stall), then its KV moves (bytes from the model's geometry
//! for the positions D's cache lacks, over the link bandwidth measured on
//! earlier transfers, plus both links' round trips, pinged), and D
//! decodes. Times come from each worker's calibrated profile and
//! production correction; prices from their terms. The plan with the
//! lower weighted log-score of time and price wins (`auto`); `always`
//! splits whenever a second worker can prefill; `never` never does.
//!
//! The attempt: D is assigned the choice with a transfer; it answers
//! which prompt positions it lacks (`kv_want`); P is told to prefill and
//! stream them. The first token comes from P with `kv_end`, which goes
//! on to D with the digest. A prefill that fails, is lost, or does not end
//! within `--fleet-kv-timeout` ends the transfer (`kv_abort`): D then
//! recomputes the prompt, so the client sees the same tokens either way.
//! P is paid for the prompt only when D used its KV.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use engine::core::CoreEvent;
use engine::{FinishReason, TokenLogprob};
use tokio::sync::mpsc;

use super::relay::{Attempt, Relay, cancel, job_params};
use super::stages::Timing;
use super::{Dispatch, Target, Want, lock, worker_target};
use crate::fleet::assignments::JobEvent;
use crate::fleet::transfers::TransferEvent;
use crate::services::placement::{Measure, Terms};
use protocol::{KvIncoming, ToWorker, VERSION};

/// Whether choices may prefill on another worker (`--fleet-split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitMode {
    Never,
    #[default]
    Auto,
    Always,
}

impl std::str::FromStr for SplitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "never" => Ok(Self::Never),
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            _ => Err(format!("`{s}`: expected never, auto or always")),
        }
    }
}

/// What the cost model expects of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Estimate {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    /// Moving the KV (0 colocated).
    pub transfer_ms: f64,
    pub kv_bytes: u64,
}

/// A split: where the prompt runs, on what terms, and what is expected.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    pub prefill: Target,
    pub terms: Terms,
    pub estimate: Estimate,
}

/// Link bandwidth assumed before a transfer measured it (bytes/s).
const DEFAULT_BANDWIDTH: f64 = 500e6;
/// The smallest prompt (uncached on the decode worker) worth moving.
const MIN_SPLIT_TOKENS: usize = 32;
/// Estimates kept per plan for the predicted-vs-measured report.
const KEEP: usize = 256;

/// One finished choice: its estimate, and its measured TTFT and TPOT (ms).
type Sample = (Estimate, f64, f64);

/// Counters of plans and transfers, for `/metrics` and the benchmark.
#[derive(Debug, Default)]
pub struct SplitStats {
    pub colocated: AtomicU64,
    pub split: AtomicU64,
    pub imported: AtomicU64,
    pub recomputed: AtomicU64,
    pub aborted: AtomicU64,
    /// Per plan (`false` colocated, `true` split): recent (estimated,
    /// measured) TTFT and TPOT in ms.
    samples: Mutex<HashMap<bool, VecDeque<Sample>>>,
    /// Measured bandwidth of each worker's link (bytes/s, smoothed).
    links: Mutex<HashMap<String, f64>>,
}

/// Mean estimated and measured TTFT and TPOT of one plan's recent choices.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, utoipa::ToSchema)]
pub struct PlanAccuracy {
    pub choices: usize,
    pub estimated_ttft_ms: f64,
    pub measured_ttft_ms: f64,
    pub estimated_tpot_ms: f64,
    pub measured_tpot_ms: f64,
}

impl SplitStats {
    /// Records a finished choice's estimate against what it measured.
    pub fn observe(&self, split: bool, e: Estimate, ttft_ms: f64, tpot_ms: f64) {
        let mut s = lock(&self.samples);
        let q = s.entry(split).or_default();
        q.push_back((e, ttft_ms, tpot_ms));
        if q.len() > KEEP {
            q.pop_front();
        }
    }

    /// The recent accuracy of one plan's estimates.
    pub fn accuracy(&self, split: bool) -> PlanAccuracy {
        let s = lock(&self.samples);
        let Some(q) = s.get(&split).filter(|q| !q.is_empty()) else {
            return PlanAccuracy::default();
        };
        let n = q.len() as f64;
        let mean = |f: &dyn Fn(&Sample) -> f64| q.iter().map(f).sum::<f64>() / n;
        PlanAccuracy {
            choices: q.len(),
            estimated_ttft_ms: mean(&|x| x.0.ttft_ms),
            measured_ttft_ms: mean(&|x| x.1),
            estimated_tpot_ms: mean(&|x| x.0.tpot_ms),
            measured_tpot_ms: mean(&|x| x.2),
        }
    }

    /// Takes a transfer's measured throughput into its link's.
    fn measured_link(&self, worker: &str, bytes: u64, span: Duration) {
        if bytes < 256 * 1024 || span < Duration::from_millis(1) {
            return; // too small to say anything about bandwidth
        }
        let bw = bytes as f64 / span.as_secs_f64();
        let mut l = lock(&self.links);
        let e = l.entry(worker.to_string()).or_insert(bw);
        *e += (bw - *e) / 4.0;
    }

    fn bandwidth(&self, worker: &str) -> f64 {
        lock(&self.links)
            .get(worker)
            .copied()
            .unwrap_or(DEFAULT_BANDWIDTH)
    }
}

/// Expected ms to prefill `tokens` on an executor (its profile's: the
/// correction is learned from decode steps, which other choices' prefill
/// chunks slow down; it says nothing of a prefill's own speed).
fn prefill_ms(m: &Measure, tokens: usize) -> Option<f64> {
    Some(m.profile?.prefill_ms(tokens))
}

/// Expected decode step with one more choice.
fn tpot_ms(m: &Measure) -> Option<f64> {
    Some(m.profile?.step_ms(m.outstanding + 1) * m.correction)
}

impl Dispatch {
    /// The colocated estimate of a choice on `decode`, and the split
    /// plan when the cost model (or `--fleet-split always`) picks one.
    pub(super) fn split_for(
        &self,
        want: &Want<'_>,
        decode: &Target,
    ) -> (Estimate, Option<SplitPlan>) {
        let none = (Estimate::default(), None);
        let Target::Worker { worker: d, .. } = decode else {
            return none;
        };
        let workers = self.fleet.serving(want.model);
        let Some(geometry) = workers
            .iter()
            .find(|w| &w.id == d)
            .and_then(|w| w.models.iter().find(|m| m.name == want.model))
        else {
            return none;
        };
        let per_token = u64::from(geometry.layers) * geometry.kv_bytes_per_token();
        let hashes = crate::services::placement::prefix_hashes(want.prompt);
        let measures = lock(&self.measures).clone();
        let cached = |key: &str| lock(&self.affinity).cached_tokens(key, &hashes);
        let rtt = |id: &str| {
            workers
                .iter()
                .find(|w| w.id == id)
                .map_or(0.0, |w| w.rtt_ms)
        };
        let dm = measures.get(d.as_str()).copied().unwrap_or_default();
        let prompt = want.prompt.len();
        let uncached_d = prompt - cached(d).min(prompt);
        let (Some(pre_d), Some(tpot)) = (prefill_ms(&dm, uncached_d), tpot_ms(&dm)) else {
            return none;
        };
        // Prefills already on D share its steps (on average half done,
        // each taken as long as this one).
        let queued = |m: &Measure| 1.0 + 0.5 * f64::from(m.prefilling);
        let colocated = Estimate {
            ttft_ms: pre_d * queued(&dm) + rtt(d),
            tpot_ms: tpot,
            transfer_ms: 0.0,
            kv_bytes: 0,
        };
        if self.split_mode == SplitMode::Never
            || want.max_tokens < 2
            || uncached_d < MIN_SPLIT_TOKENS
            || !self.fleet.is_local(d)
        {
            return (colocated, None);
        }
        let decode_terms = self.worker_terms_by_id(&workers, d, want);
        let max = want.max_tokens as f64;
        let time_c = colocated.ttft_ms + max * tpot + f64::from(dm.outstanding) * pre_d;
        let mut best: Option<(f64, SplitPlan)> = None;
        for w in workers
            .iter()
            .filter(|w| &w.id != d && self.fleet.is_local(&w.id))
        {
            let pm = measures.get(w.id.as_str()).copied().unwrap_or_default();
            let cached_p = cached(&w.id).min(prompt);
            let Some(pre_p) = prefill_ms(&pm, prompt - cached_p) else {
                continue;
            };
            // A full worker is no prefill candidate, unless told to always split.
            if pm.full() && self.split_mode != SplitMode::Always {
                continue;
            }
            let bytes = per_token * uncached_d as u64;
            let transfer = bytes as f64 * 1e3 / self.split.bandwidth(&w.id) + rtt(&w.id) + rtt(d);
            let estimate = Estimate {
                ttft_ms: pre_p * queued(&pm) + rtt(&w.id),
                tpot_ms: tpot,
                transfer_ms: transfer,
                kv_bytes: bytes,
            };
            let time_s = estimate.ttft_ms
                + transfer
                + (max - 1.0) * tpot
                + f64::from(pm.outstanding) * pre_p;
            let terms = self.worker_terms(w, want.model, want.house);
            let price = |t: &Terms, computed: usize, cached: usize, out: usize| {
                let p = &t.prices;
                (computed as f64 * p.input as f64
                    + cached as f64 * p.cached_input as f64
                    + out as f64 * p.output as f64)
                    .max(1.0)
            };
            let cost_s = price(&terms, prompt - cached_p, cached_p, 0)
                + price(&decode_terms, 0, 0, want.max_tokens);
            let cost_c = price(
                &decode_terms,
                uncached_d,
                prompt - uncached_d,
                want.max_tokens,
            );
            let wt = self.weights.latency + self.weights.load;
            let score = wt * (time_s / time_c).ln() + self.weights.cost * (cost_s / cost_c).ln();
            let score = if self.split_mode == SplitMode::Always {
                time_s
            } else {
                score
            };
            if best.as_ref().is_none_or(|(s, _)| score < *s) {
                let plan = SplitPlan {
                    prefill: worker_target(w),
                    terms,
                    estimate,
                };
                best = Some((score, plan));
            }
        }
        let pick = match self.split_mode {
            SplitMode::Always => best.map(|(_, p)| p),
            // A split must win by a margin: moving KV is a new way to fail.
            SplitMode::Auto | SplitMode::Never => best.filter(|(s, _)| *s < -0.05).map(|(_, p)| p),
        };
        (colocated, pick)
    }

    /// The terms of worker `id` among `workers`.
    fn worker_terms_by_id(
        &self,
        workers: &[crate::fleet::registry::WorkerInfo],
        id: &str,
        want: &Want<'_>,
    ) -> Terms {
        match workers.iter().find(|w| w.id == id) {
            Some(w) => self.worker_terms(w, want.model, want.house),
            None => want.house.clone(),
        }
    }
}

/// Counts a transfer as open on both its executors until dropped.
struct KvClock {
    dispatch: std::sync::Arc<Dispatch>,
    keys: [String; 2],
}

impl KvClock {
    fn open(dispatch: &std::sync::Arc<Dispatch>, p: &str, d: &str) -> Self {
        let keys = [p.to_string(), d.to_string()];
        for k in &keys {
            dispatch.kv_transfers(k, 1);
        }
        Self {
            dispatch: dispatch.clone(),
            keys,
        }
    }
}

impl Drop for KvClock {
    fn drop(&mut self) {
        for k in &self.keys {
            self.dispatch.kv_transfers(k, -1);
        }
    }
}

/// How a split attempt's prefill went, for pay and standing.
#[derive(Debug, Clone, Default)]
pub(super) struct Prefilled {
    /// Prompt tokens P computed and had cached, once it ended.
    pub(super) counts: Option<(usize, usize)>,
    /// Whether D used P's KV (`None`: not known yet).
    pub(super) imported: Option<bool>,
    /// P failed, was lost or timed out.
    pub(super) failed: bool,
    /// When P was told to prefill, and when its first token came.
    pub(super) timing: Option<Timing>,
}

impl Relay {
    /// Runs attempt `attempt` split: prefill on `plan.prefill`, decode on
    /// worker `d`; the prefill's outcome is left in `self.prefilled`.
    pub(super) async fn on_split(&mut self, d: &str, plan: &SplitPlan, attempt: u32) -> Attempt {
        let fleet = self.dispatch.fleet.clone();
        let Target::Worker { worker: p, .. } = &plan.prefill else {
            return self.on_worker(d, attempt).await;
        };
        let transfer = fleet.jobs.next_id();
        let (ttx, mut trx) = mpsc::unbounded_channel();
        fleet.transfers.open(transfer, p, d, ttx);
        let (jtx, mut jrx) = mpsc::unbounded_channel();
        fleet.jobs.place(self.job, d, attempt, jtx);
        self.prefilled = Some(Prefilled::default());
        let kv = Some(KvIncoming { transfer });
        let assign = self.assignment(attempt, job_params(&self.params, d), kv);
        let outcome = if fleet.send(d, assign).await {
            self.split_loop(d, p, transfer, &mut trx, &mut jrx).await
        } else {
            Attempt::Lost("the worker is gone".into())
        };
        if let Some(moved) = fleet.transfers.close(transfer)
            && let Some(span) = moved.span
        {
            self.dispatch.split.measured_link(p, moved.bytes, span);
        }
        outcome
    }

    async fn split_loop(
        &mut self,
        d: &str,
        p: &str,
        transfer: u64,
        trx: &mut mpsc::UnboundedReceiver<TransferEvent>,
        jrx: &mut mpsc::UnboundedReceiver<JobEvent>,
    ) -> Attempt {
        let fleet = self.dispatch.fleet.clone();
        let mut arrivals = VecDeque::new();
        let mut deadline = tokio::time::Instant::now() + self.dispatch.progress;
        // The whole attempt: the transfer, then from its end the decode's
        // allowance.
        let started = tokio::time::Instant::now();
        let allowance = self.allowance(d);
        let mut hard_end = started + self.dispatch.kv_timeout + allowance;
        let (mut asked, mut decided) = (false, false);
        // The KV moves from the prefill's start to its end (or failure).
        let mut _clock: Option<KvClock> = None;
        loop {
            if decided && _clock.is_some() {
                _clock = None;
                hard_end = hard_end.min(tokio::time::Instant::now() + allowance);
            }
            tokio::select! {
                ev = trx.recv() => match ev {
                    Some(TransferEvent::Want { from }) if !asked && !decided && from as usize >= self.prompt.len() => {
                        // Nothing to send past the prompt: a broken answer.
                        decided = true;
                        self.end_prefill(d, p, transfer, "the decode worker asked past the prompt", false).await;
                    }
                    Some(TransferEvent::Want { from }) if !asked && !decided => {
                        asked = true;
                        deadline = tokio::time::Instant::now() + self.dispatch.kv_timeout;
                        self.set_prefill(|s| s.timing = Some(Timing::start()));
                        self.dispatch.measure(p, |m| {
                            m.outstanding += 1;
                            m.prefilling += 1;
                        });
                        _clock = Some(KvClock::open(&self.dispatch, p, d));
                        let prefill = ToWorker::Prefill {
                            v: VERSION,
                            transfer,
                            model: self.model.clone(),
                            prompt: self.prompt.clone(),
                            params: job_params(&self.params, p),
                            from,
                        };
                        if !fleet.send(p, prefill).await {
                            decided = true;
                            self.end_prefill(d, p, transfer, "the prefill worker is gone", true).await;
                        }
                    }
                    Some(TransferEvent::End { tokens, digest, first, cached_tokens }) if asked && !decided => {
                        decided = true;
                        self.dispatch.measure(p, Measure::prefill_done);
                        // The prompt is this server's count, never the
                        // worker's; its cache can only lower its pay.
                        let prompt = self.prompt.len();
                        self.set_prefill(|s| {
                            s.counts = Some((prompt, (cached_tokens as usize).min(prompt)));
                            if let Some(t) = &mut s.timing { t.token(); }
                        });
                        let end = ToWorker::KvEnd { v: VERSION, transfer, tokens, digest, first: first.clone() };
                        fleet.send(d, end).await;
                        let logprob = first.logprob.map(|logprob| TokenLogprob { token: first.id, logprob, top: first.top });
                        if let Some(done) = self.forward(CoreEvent::Token { id: first.id, logprob }, p, &mut arrivals) {
                            return done;
                        }
                        if let Some(reason) = self.already_over() {
                            cancel(&fleet, d, self.job).await;
                            self.finish(reason, cached_tokens as usize);
                            return Attempt::Over;
                        }
                    }
                    Some(TransferEvent::Failed(why) | TransferEvent::Lost(why)) if !decided => {
                        decided = true;
                        self.end_prefill(d, p, transfer, &why, asked).await;
                    }
                    Some(TransferEvent::Result { imported, reason }) => {
                        let c = &self.dispatch.split;
                        if imported { c.imported.fetch_add(1, Relaxed); } else { c.recomputed.fetch_add(1, Relaxed); }
                        if !imported {
                            tracing::warn!(job = self.job, transfer, reason = %reason, "the decode worker recomputed the prompt");
                        }
                        self.set_prefill(|s| s.imported = Some(imported));
                    }
                    _ => {}
                },
                ev = jrx.recv() => match ev {
                    Some(JobEvent::Core(ev)) => {
                        if matches!(ev, CoreEvent::Token { .. }) {
                            deadline = deadline.max(tokio::time::Instant::now() + self.dispatch.progress);
                        }
                        let ev = match self.vet(ev, false) {
                            Ok(ev) => ev,
                            Err(end) => {
                                cancel(&fleet, d, self.job).await;
                                if !decided { cancel(&fleet, p, transfer).await; }
                                return end;
                            }
                        };
                        if let Some(done) = self.forward(ev, d, &mut arrivals) {
                            if !decided { cancel(&fleet, p, transfer).await; }
                            return done;
                        }
                    }
                    Some(JobEvent::Lost(why)) => {
                        if !decided { cancel(&fleet, p, transfer).await; }
                        return Attempt::Lost(why);
                    }
                    Some(JobEvent::Embedded(_)) => {
                        if !decided { cancel(&fleet, p, transfer).await; }
                        return Attempt::Lost("the worker answered a generation with vectors".into());
                    }
                    None => return Attempt::Lost("the worker is gone".into()),
                },
                _ = tokio::time::sleep_until(deadline.min(hard_end)) => {
                    if tokio::time::Instant::now() >= hard_end {
                        cancel(&fleet, d, self.job).await;
                        if !decided { cancel(&fleet, p, transfer).await; }
                        let s = hard_end.duration_since(started).as_secs_f64();
                        return Attempt::Lost(format!("past the attempt's deadline of {s:.1} s"));
                    }
                    if asked && !decided {
                        decided = true;
                        deadline = tokio::time::Instant::now() + self.dispatch.progress;
                        self.end_prefill(d, p, transfer, "the KV transfer timed out", true).await;
                    } else {
                        cancel(&fleet, d, self.job).await;
                        if !decided { cancel(&fleet, p, transfer).await; }
                        let s = self.dispatch.progress.as_secs_f64();
                        return Attempt::Lost(format!("no progress for {s} s"));
                    }
                }
                r = self.abort.changed() => {
                    if r.is_err() || *self.abort.borrow() {
                        cancel(&fleet, d, self.job).await;
                        if !decided { cancel(&fleet, p, transfer).await; }
                        self.finish(FinishReason::Abort, 0);
                        return Attempt::Over;
                    }
                }
            }
        }
    }

    fn set_prefill(&mut self, f: impl FnOnce(&mut Prefilled)) {
        if let Some(s) = &mut self.prefilled {
            f(s);
        }
    }

    /// The prefill failed (or P was lost before it was `asked`): D
    /// recomputes, P is stopped and counted lost.
    async fn end_prefill(&mut self, d: &str, p: &str, transfer: u64, why: &str, asked: bool) {
        let fleet = self.dispatch.fleet.clone();
        tracing::warn!(job = self.job, transfer, prefill = %p, reason = %why, "KV transfer ended; the decode worker recomputes");
        self.dispatch.split.aborted.fetch_add(1, Relaxed);
        // Only a prefill that was started can have failed on P's side.
        if asked {
            self.dispatch.measure(p, Measure::prefill_done);
            self.set_prefill(|s| s.failed = true);
        }
        let abort = ToWorker::KvAbort {
            v: VERSION,
            transfer,
            reason: why.to_string(),
        };
        fleet.send(d, abort).await;
        cancel(&fleet, p, transfer).await;
    }
}
