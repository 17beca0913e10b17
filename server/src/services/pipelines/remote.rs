//! The executor of a model served as a pipeline of workers: each engine
//! step goes through the chain the planner published, stage by stage over
//! the worker protocol (`FleetStage`: the input rows as frames, then
//! `stage_step`, answered with the output rows or, from the last stage,
//! the sampled tokens, checked before use). It waits (bounded) for a chain
//! when there is none; when the chain changes, or a stage fails, every
//! sequence's KV is gone from the stages, so it asks the engine to
//! recompute them all (`EngineError::Recompute`) on the next chain, and
//! the failed worker is kept out of the next plan.

use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use engine::error::{EngineError, Result};
use engine::executor::{Executor, Step};
use engine::kv_cache::KvLayout;
use engine::model::llama::PartInput;
use engine::pipeline::{Stage, StageOutput, run_chain};
use engine::request::{RequestId, TokenLogprob};
use engine::sampling::Sampled;
use engine::stage_check::{Tap, Tapped};
use protocol::stage::{StageChunk, StageSampling, hidden_frames};
use protocol::{JobToken, ToWorker, VERSION};

use super::checks::StageChecks;
use crate::fleet::registry::Registry;
use crate::fleet::stage_calls::StageReply;
use crate::services::metering::Credits;

/// One stage of a published chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRef {
    pub worker: String,
    /// The provider it earns for.
    pub provider: String,
    pub layers: Range<u32>,
}

/// The chain a pipeline model runs on now, with a number that changes
/// whenever the chain does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub epoch: u64,
    pub stages: Vec<StageRef>,
}

/// What the planner and the executor of one pipeline model share.
#[derive(Debug, Default)]
pub struct ChainCell {
    chain: RwLock<Option<Chain>>,
    /// The last epoch given: never reused, so a chain published after a
    /// gap without one is still new to the executor.
    epochs: std::sync::atomic::AtomicU64,
    /// Workers whose step failed, and when: out of plans for a while.
    failed: Mutex<Vec<(String, Instant)>>,
    /// Each stage worker's measures (its step's round trip included).
    measures: Mutex<std::collections::HashMap<String, StageMeasure>>,
    /// Where each running sequence's stage work is credited (its
    /// request's), and the work of sequences that ended before their
    /// request said where (a race the next `bill` settles).
    bills: Mutex<Bills>,
}

/// What the server measured of one stage worker's steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct StageMeasure {
    /// Layer-tokens a millisecond (smoothed).
    pub speed: f64,
    /// A step's time, smoothed, and the last one (ms).
    pub step_ms: f64,
    pub last_ms: f64,
    /// Steps it ran, and tokens through its layers.
    pub steps: u64,
    pub tokens: u64,
}

/// One sequence's stage work: (executor, provider, payout share,
/// layer-tokens).
pub type Ran = Vec<(String, String, i64, u64)>;

#[derive(Debug, Default)]
struct Bills {
    open: std::collections::HashMap<RequestId, Credits>,
    early: std::collections::HashMap<RequestId, Ran>,
}

/// How long a worker whose step failed stays out of plans.
pub const FAILED_FOR: Duration = Duration::from_secs(60);

impl ChainCell {
    pub fn get(&self) -> Option<Chain> {
        self.chain.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Publishes `stages` (a new epoch when they differ), or none.
    pub fn set(&self, stages: Option<Vec<StageRef>>) {
        let mut c = self.chain.write().unwrap_or_else(|e| e.into_inner());
        let same = match (&*c, &stages) {
            (Some(old), Some(new)) => &old.stages == new,
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        let epoch = self
            .epochs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        *c = stages.map(|stages| Chain { epoch, stages });
    }

    /// Keeps `worker` out of plans for `FAILED_FOR`, and the chain with it
    /// is withdrawn.
    pub fn fail(&self, worker: &str) {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((worker.to_string(), Instant::now()));
        let holds = self
            .get()
            .is_some_and(|c| c.stages.iter().any(|s| s.worker == worker));
        if holds {
            self.set(None);
        }
    }

    /// Sequence `seq` is a request's: its stages' work goes to `credits`.
    pub fn bill(&self, seq: RequestId, credits: Credits) {
        let mut b = self.bills.lock().unwrap_or_else(|e| e.into_inner());
        match b.early.remove(&seq) {
            Some(ran) => credits.stages(ran),
            None => {
                b.open.insert(seq, credits);
            }
        }
    }

    /// Where sequence `seq`'s stage work is credited, once known.
    pub fn credits_of(&self, seq: RequestId) -> Option<Credits> {
        let b = self.bills.lock().unwrap_or_else(|e| e.into_inner());
        b.open.get(&seq).cloned()
    }

    /// Sequence `seq` ended having run `ran` on the stages; where it was
    /// credited.
    fn credit(&self, seq: RequestId, ran: Ran) -> Option<Credits> {
        let mut b = self.bills.lock().unwrap_or_else(|e| e.into_inner());
        match b.open.remove(&seq) {
            Some(credits) => {
                credits.stages(ran);
                Some(credits)
            }
            None => {
                // Unmetered requests are never billed: keep only a few.
                if b.early.len() >= 1024 {
                    b.early.clear();
                }
                b.early.insert(seq, ran);
                None
            }
        }
    }

    /// Takes one step's time into `worker`'s measures.
    pub fn record(&self, worker: &str, layers: usize, tokens: usize, took: Duration) {
        let ms = took.as_secs_f64() * 1e3;
        let speed = (layers * tokens.max(1)) as f64 / ms.max(1e-3);
        let mut all = self.measures.lock().unwrap_or_else(|e| e.into_inner());
        let m = all.entry(worker.to_string()).or_default();
        if m.steps == 0 {
            (m.speed, m.step_ms) = (speed, ms);
        }
        m.speed += (speed - m.speed) / 8.0;
        m.step_ms += (ms - m.step_ms) / 8.0;
        m.last_ms = ms;
        m.steps += 1;
        m.tokens += tokens as u64;
    }

    /// The workers' measured speeds (layer-tokens a millisecond).
    pub fn speeds(&self) -> std::collections::HashMap<String, f64> {
        let all = self.measures.lock().unwrap_or_else(|e| e.into_inner());
        all.iter().map(|(w, m)| (w.clone(), m.speed)).collect()
    }

    /// What was measured of `worker`'s steps.
    pub fn measure(&self, worker: &str) -> StageMeasure {
        let all = self.measures.lock().unwrap_or_else(|e| e.into_inner());
        all.get(worker).copied().unwrap_or_default()
    }

    /// Whether `worker` failed a step lately.
    pub fn is_failed(&self, worker: &str) -> bool {
        let mut f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        f.retain(|(_, at)| at.elapsed() < FAILED_FOR);
        f.iter().any(|(w, _)| w == worker)
    }
}

/// What a pipeline's executor needs to know of its model.
#[derive(Debug, Clone)]
pub struct PipelineShape {
    pub model: String,
    pub hidden: usize,
    pub vocab: usize,
    pub layout: KvLayout,
    /// How long one stage step may take.
    pub step_timeout: Duration,
    /// How long a step waits for a chain when there is none.
    pub chain_wait: Duration,
    /// A step's batch goes through the chain in at most this many parts
    /// at once (0: as many as stages), so every stage works on one while
    /// the next works on another.
    pub micro_batches: usize,
}

/// The engine's executor for a model served by a pipeline of workers.
pub struct FleetPipeline {
    shape: PipelineShape,
    fleet: Arc<Registry>,
    cell: Arc<ChainCell>,
    rt: tokio::runtime::Handle,
    /// The chain the last step ran on.
    epoch: Option<u64>,
    /// Layer-tokens each stage computed for each running sequence, by
    /// (worker, provider), in steps whose output was used.
    work: std::collections::HashMap<RequestId, std::collections::BTreeMap<(String, String), u64>>,
    /// The stages' spot checks, the tap this executor records through,
    /// and the stages its records are of.
    checks: Option<Arc<StageChecks>>,
    tap: Arc<Mutex<Tap>>,
    stages: Vec<StageRef>,
}

impl FleetPipeline {
    pub fn new(
        shape: PipelineShape,
        fleet: Arc<Registry>,
        cell: Arc<ChainCell>,
        rt: tokio::runtime::Handle,
        checks: Option<Arc<StageChecks>>,
    ) -> Self {
        Self {
            shape,
            fleet,
            cell,
            rt,
            epoch: None,
            work: Default::default(),
            checks,
            tap: StageChecks::tap(),
            stages: Vec::new(),
        }
    }

    /// The tap, when the stages are checked.
    fn tap(&self) -> Option<std::sync::MutexGuard<'_, Tap>> {
        self.checks.as_ref()?;
        Some(self.tap.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Picks the step's new sequences to check, at each stage by its
    /// provider's rate.
    fn watch(&self, chain: &Chain, step: &Step<'_>) {
        let (Some(checks), Some(mut tap)) = (self.checks.as_ref(), self.tap()) else {
            return;
        };
        for c in step.batch.chunks.iter().filter(|c| c.start_pos == 0) {
            if tap.watching(c.seq) {
                continue;
            }
            for (i, s) in chain.stages.iter().enumerate() {
                let jobs = self.fleet.standing.get(&s.provider).jobs_ok;
                let layers = s.layers.start as usize..s.layers.end as usize;
                if checks.pick(jobs) && !tap.watch(c.seq, i, layers, self.shape.hidden) {
                    break;
                }
            }
        }
    }

    /// Hands the tap's finished records to the checker; `ended` is a
    /// sequence that just ended, with where it was credited.
    fn hand_over(&self, ended: Option<(RequestId, Option<Credits>)>) {
        let Some(checks) = &self.checks else {
            return;
        };
        let ready = self.tap().map(|mut t| t.take_ready()).unwrap_or_default();
        if ready.is_empty() {
            return;
        }
        let credits = |seq: RequestId| match &ended {
            Some((s, c)) if *s == seq => c.clone(),
            _ => self.cell.credits_of(seq),
        };
        checks.submit(ready, &self.stages, credits);
    }

    /// Counts a step's work: every token of each chunk through each
    /// stage's layers.
    fn count(&mut self, chain: &Chain, step: &Step<'_>) {
        for c in &step.batch.chunks {
            let per = self.work.entry(c.seq).or_default();
            for s in &chain.stages {
                let n = (c.tokens.len() * s.layers.len()) as u64;
                *per.entry((s.worker.clone(), s.provider.clone()))
                    .or_default() += n;
            }
        }
    }

    /// The chain now, waiting for one up to `chain_wait`.
    fn chain(&self) -> Result<Chain> {
        let deadline = Instant::now() + self.shape.chain_wait;
        loop {
            if let Some(c) = self.cell.get() {
                return Ok(c);
            }
            if Instant::now() >= deadline {
                return Err(EngineError::Unavailable(format!(
                    "no pipeline of workers holds every layer of `{}` now; retry later",
                    self.shape.model
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The chain's stages for one walk through it (tapped when checked).
    fn walk(
        &self,
        chain: &Chain,
        culprit: &Arc<Mutex<Option<String>>>,
        calls: &Arc<Mutex<Vec<Call>>>,
    ) -> Vec<Box<dyn Stage>> {
        let last = chain.stages.len().saturating_sub(1);
        chain
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let stage = Box::new(FleetStage {
                    at: s.clone(),
                    last: i == last,
                    shape: self.shape.clone(),
                    fleet: self.fleet.clone(),
                    rt: self.rt.clone(),
                    culprit: culprit.clone(),
                    calls: calls.clone(),
                }) as Box<dyn Stage>;
                match &self.checks {
                    Some(_) => Box::new(Tapped {
                        inner: stage,
                        index: i,
                        tap: self.tap.clone(),
                    }) as Box<dyn Stage>,
                    None => stage,
                }
            })
            .collect()
    }

    /// Runs `step` through the chain: its batch in micro-batches, each
    /// walking the chain on its own thread, so a stage computes one while
    /// the next computes the one before; the tokens in the batch's order.
    fn through(
        &self,
        chain: &Chain,
        step: &Step<'_>,
        culprit: &Arc<Mutex<Option<String>>>,
        calls: &Arc<Mutex<Vec<Call>>>,
    ) -> Result<Vec<Vec<Sampled>>> {
        let most = match self.shape.micro_batches {
            0 => chain.stages.len(),
            n => n,
        };
        let parts = micro_batches(step, most);
        if parts.len() <= 1 {
            return run_chain(&mut self.walk(chain, culprit, calls), step);
        }
        let outs: Vec<Result<Vec<Vec<Sampled>>>> = std::thread::scope(|scope| {
            let running: Vec<_> = parts
                .iter()
                .map(|idx| {
                    let batch = engine::model::ModelBatch {
                        chunks: idx.iter().map(|&i| step.batch.chunks[i].clone()).collect(),
                    };
                    let sampling = idx.iter().map(|&i| step.sampling[i]).collect();
                    let mut stages = self.walk(chain, culprit, calls);
                    scope.spawn(move || {
                        let sub = Step {
                            batch: &batch,
                            sampling,
                        };
                        run_chain(&mut stages, &sub)
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::Execution(
                            "a micro-batch's walk panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        let mut sampled = vec![Vec::new(); step.batch.chunks.len()];
        for (idx, out) in parts.iter().zip(outs) {
            for (&i, s) in idx.iter().zip(out?) {
                sampled[i] = s;
            }
        }
        Ok(sampled)
    }

    /// Takes each stage worker's fastest call of the step into its
    /// measures (the others waited behind another micro-batch).
    fn measured(&self, calls: &Mutex<Vec<Call>>) {
        let calls = std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()));
        let mut best: std::collections::HashMap<&str, &Call> = Default::default();
        for c in &calls {
            let e = best.entry(c.worker.as_str()).or_insert(c);
            if c.speed() > e.speed() {
                *e = c;
            }
        }
        for c in best.values() {
            self.cell.record(&c.worker, c.layers, c.tokens, c.took);
        }
    }
}

/// One stage call of a step, as the server timed it.
#[derive(Debug, Clone)]
struct Call {
    worker: String,
    layers: usize,
    tokens: usize,
    took: Duration,
}

impl Call {
    fn speed(&self) -> f64 {
        (self.layers * self.tokens.max(1)) as f64 / self.took.as_secs_f64().max(1e-6)
    }
}

/// `step`'s chunks in at most `most` groups of about equal tokens (each
/// chunk to the lightest group so far, largest first), each group's
/// chunks in batch order; one group when there is nothing to split.
fn micro_batches(step: &Step<'_>, most: usize) -> Vec<Vec<usize>> {
    let chunks = &step.batch.chunks;
    let n = most.min(chunks.len()).max(1);
    let mut order: Vec<usize> = (0..chunks.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(chunks[i].tokens.len()));
    let mut groups: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); n];
    for i in order {
        if let Some(g) = groups.iter_mut().min_by_key(|g| g.0) {
            g.0 += chunks[i].tokens.len();
            g.1.push(i);
        }
    }
    groups
        .into_iter()
        .filter(|g| !g.1.is_empty())
        .map(|mut g| {
            g.1.sort_unstable();
            g.1
        })
        .collect()
}

impl Executor for FleetPipeline {
    fn name(&self) -> String {
        format!("pipeline:{}", self.shape.model)
    }

    fn kv_layout(&self) -> KvLayout {
        self.shape.layout
    }

    fn kv_bytes(&self) -> usize {
        0
    }

    fn execute(&mut self, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>> {
        let chain = self.chain()?;
        let before = self.epoch.replace(chain.epoch);
        if before.is_some_and(|e| e != chain.epoch) {
            if let Some(mut t) = self.tap() {
                t.clear();
            }
            return Err(EngineError::Recompute(format!(
                "the pipeline of `{}` changed",
                self.shape.model
            )));
        }
        self.stages.clone_from(&chain.stages);
        self.watch(&chain, step);
        let culprit: Arc<Mutex<Option<String>>> = Arc::default();
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let run = self.through(&chain, step, &culprit, &calls);
        self.measured(&calls);
        match run {
            Ok(s) => {
                self.count(&chain, step);
                self.hand_over(None);
                Ok(s)
            }
            Err(e) => {
                // The sequences are recomputed from the start.
                if let Some(mut t) = self.tap() {
                    t.clear();
                }
                let failed = culprit.lock().unwrap_or_else(|e| e.into_inner()).take();
                // A chain withdrawn meanwhile (re-planned: its workers
                // drop their parts) blames no one.
                let standing = self.cell.get().is_some_and(|c| c.epoch == chain.epoch);
                if let Some(w) = failed.filter(|_| standing) {
                    tracing::warn!(worker = %w, error = %e, "a pipeline stage failed: replanning");
                    self.cell.fail(&w);
                    if let Some(s) = chain.stages.iter().find(|s| s.worker == w) {
                        self.fleet.standing.attempt(&s.provider, true);
                    }
                }
                Err(EngineError::Recompute(e.to_string()))
            }
        }
    }

    fn release(&mut self, seq: RequestId) {
        let work = self.work.remove(&seq).unwrap_or_default();
        // Each stage that computed the sequence completed a job: its
        // provider's standing (and, past the proven count, its lower
        // spot-check rate) follows.
        for (_, provider) in work.keys() {
            self.fleet.standing.attempt(provider, false);
        }
        let ran = work
            .into_iter()
            .map(|((worker, provider), n)| {
                let reputation = self.fleet.standing.get(&provider).reputation_bps();
                let payout = money::market::pricing::payout_bps(reputation);
                (worker, provider, payout, n)
            })
            .collect();
        let credits = self.cell.credit(seq, ran);
        if let Some(mut t) = self.tap() {
            t.finish(seq);
        }
        self.hand_over(Some((seq, credits)));
    }
}

/// One worker's stage for one step.
struct FleetStage {
    at: StageRef,
    last: bool,
    shape: PipelineShape,
    fleet: Arc<Registry>,
    rt: tokio::runtime::Handle,
    /// Where a failed stage names its worker for the executor.
    culprit: Arc<Mutex<Option<String>>>,
    /// Where it times its calls for the executor.
    calls: Arc<Mutex<Vec<Call>>>,
}

impl FleetStage {
    fn call(
        &self,
        step: &Step<'_>,
        input: PartInput<'_>,
    ) -> std::result::Result<StageReply, String> {
        let rows_out = if self.last {
            0
        } else {
            step.batch.num_tokens()
        };
        let worker = &self.at.worker;
        let calls = &self.fleet.stage_calls;
        let (id, answer) = calls.open(worker, self.shape.hidden, rows_out);
        let (frames, rows) = match input {
            PartInput::Hidden(h) => (
                hidden_frames(id, self.shape.hidden, h),
                (h.len() / self.shape.hidden.max(1)) as u32,
            ),
            PartInput::Tokens => (Vec::new(), 0),
        };
        let sampling = if self.last {
            step.sampling
                .iter()
                .map(|s| s.as_ref().map(StageSampling::of))
                .collect()
        } else {
            Vec::new()
        };
        let msg = ToWorker::StageStep {
            v: VERSION,
            step: id,
            model: self.shape.model.clone(),
            chunks: step.batch.chunks.iter().map(StageChunk::of).collect(),
            rows,
            sampling,
        };
        let fleet = self.fleet.clone();
        let sent = self.rt.block_on(async {
            for f in frames {
                if !fleet.send_frame(worker, f).await {
                    return false;
                }
            }
            fleet.send_local(worker, msg).await
        });
        let got = if sent {
            answer
                .recv_timeout(self.shape.step_timeout)
                .map_err(|_| {
                    format!(
                        "stage {worker} did not answer within {:?}",
                        self.shape.step_timeout
                    )
                })
                .and_then(|r| r)
        } else {
            Err(format!("stage {worker} is gone"))
        };
        calls.close(id);
        got
    }
}

impl Stage for FleetStage {
    fn name(&self) -> String {
        self.at.worker.clone()
    }

    fn layers(&self) -> Range<usize> {
        self.at.layers.start as usize..self.at.layers.end as usize
    }

    fn num_blocks(&self) -> usize {
        self.shape.layout.num_blocks
    }

    fn run(&mut self, step: &Step<'_>, input: PartInput<'_>) -> Result<StageOutput> {
        let started = Instant::now();
        let out = self
            .call(step, input)
            .and_then(|reply| match (reply, self.last) {
                (StageReply::Hidden(h), false) => Ok(StageOutput::Hidden(h)),
                (StageReply::Tokens(t), true) => {
                    checked_tokens(step, t, self.shape.vocab).map(StageOutput::Sampled)
                }
                _ => Err(format!("stage {} answered out of turn", self.at.worker)),
            });
        if out.is_ok() {
            let call = Call {
                worker: self.at.worker.clone(),
                layers: self.at.layers.len(),
                tokens: step.batch.num_tokens(),
                took: started.elapsed(),
            };
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(call);
        }
        out.map_err(|why| {
            *self.culprit.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.at.worker.clone());
            EngineError::Execution(why)
        })
    }

    fn release(&mut self, _seq: RequestId) {}
}

/// A last stage's sampled tokens, checked: one list per chunk, none for a
/// chunk without logits, at most its drafts + 1 otherwise, every id in the
/// vocabulary.
fn checked_tokens(
    step: &Step<'_>,
    tokens: Vec<Vec<JobToken>>,
    vocab: usize,
) -> std::result::Result<Vec<Vec<Sampled>>, String> {
    if tokens.len() != step.batch.chunks.len() {
        return Err(format!(
            "{} token lists for {} chunks",
            tokens.len(),
            step.batch.chunks.len()
        ));
    }
    step.batch
        .chunks
        .iter()
        .zip(tokens)
        .map(|(c, ts)| {
            let most = c.num_logits();
            if (most == 0) != ts.is_empty() || ts.len() > most {
                return Err(format!(
                    "{} tokens for a chunk of {most} logits rows",
                    ts.len()
                ));
            }
            ts.into_iter()
                .map(|t| {
                    if t.id as usize >= vocab {
                        return Err(format!("token {} is outside the vocabulary", t.id));
                    }
                    let lp = t.logprob.map(|logprob| TokenLogprob {
                        token: t.id,
                        logprob,
                        top: t.top,
                    });
                    Ok((t.id, lp))
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use engine::model::{ModelBatch, SeqChunk};

    use super::*;

    fn token(id: u32) -> JobToken {
        JobToken {
            id,
            logprob: None,
            top: vec![],
        }
    }

    #[test]
    fn a_last_stages_tokens_are_counted_and_bounded_before_use() {
        let chunk = |want: bool, draft: Vec<u32>| SeqChunk {
            seq: RequestId(1),
            tokens: vec![5; 1 + draft.len()],
            start_pos: 0,
            want_logits: want,
            block_table: vec![0],
            swa_table: vec![],
            draft,
        };
        let batch = ModelBatch {
            chunks: vec![
                chunk(true, vec![]),
                chunk(false, vec![]),
                chunk(true, vec![7, 8]),
            ],
        };
        let step = Step {
            batch: &batch,
            sampling: vec![None, None, None],
        };
        let ok = vec![vec![token(3)], vec![], vec![token(7), token(2)]];
        assert!(checked_tokens(&step, ok, 10).is_ok());
        for bad in [
            vec![vec![token(3)], vec![]],
            vec![vec![], vec![], vec![token(1)]],
            vec![vec![token(3)], vec![token(1)], vec![token(1)]],
            vec![vec![token(3)], vec![], vec![token(1); 4]],
            vec![vec![token(10)], vec![], vec![token(1)]],
        ] {
            assert!(checked_tokens(&step, bad.clone(), 10).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn micro_batches_split_a_step_by_tokens_and_keep_each_groups_batch_order() {
        let chunk = |seq: u64, n: usize| SeqChunk {
            seq: RequestId(seq),
            tokens: vec![5; n],
            start_pos: 0,
            want_logits: true,
            block_table: vec![0],
            swa_table: vec![],
            draft: vec![],
        };
        let batch = ModelBatch {
            chunks: vec![
                chunk(0, 1),
                chunk(1, 100),
                chunk(2, 1),
                chunk(3, 1),
                chunk(4, 50),
            ],
        };
        let step = Step {
            batch: &batch,
            sampling: vec![None; 5],
        };
        assert_eq!(micro_batches(&step, 1), vec![vec![0, 1, 2, 3, 4]]);
        assert_eq!(micro_batches(&step, 2), vec![vec![1], vec![0, 2, 3, 4]]);
        assert_eq!(
            micro_batches(&step, 3),
            vec![vec![1], vec![4], vec![0, 2, 3]]
        );
        let groups = micro_batches(&step, 9);
        assert_eq!(groups.len(), 5);
        let mut all: Vec<usize> = groups.concat();
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_chain_gets_a_new_epoch_only_when_it_changes_and_a_failed_worker_withdraws_it() {
        let cell = ChainCell::default();
        let stage = |w: &str, r: Range<u32>| StageRef {
            worker: w.into(),
            provider: format!("provider:{w}"),
            layers: r,
        };
        cell.set(Some(vec![stage("a", 0..10), stage("b", 10..30)]));
        let first = cell.get().expect("chain").epoch;
        cell.set(Some(vec![stage("a", 0..10), stage("b", 10..30)]));
        assert_eq!(cell.get().expect("chain").epoch, first);
        cell.fail("c");
        assert!(cell.get().is_some(), "a worker outside the chain");
        cell.fail("b");
        assert!(cell.get().is_none() && cell.is_failed("b") && !cell.is_failed("a"));
        // After a gap without a chain, even the same stages are a new
        // chain: the workers' KV may be gone.
        cell.set(Some(vec![stage("a", 0..10), stage("b", 10..30)]));
        let again = cell.get().expect("chain").epoch;
        assert!(again > first, "{again} after {first}");
        cell.set(Some(vec![stage("a", 0..30)]));
        assert!(cell.get().expect("chain").epoch > again);
    }
}
