//! Spot checks of a pipeline model's stages: for a sample of new
//! sequences (each stage's provider at its spot-check rate) the executor
//! records what the stage was given and answered (`engine::stage_check`'s
//! tap); a finished record is recomputed here in one prefill, off the
//! response path, on the house's own copy of that stage's layers (read
//! from the model file, one part held at a time), and judged. A stage
//! that fails is quarantined and what it was paid for that request is
//! clawed back (through `Sanctions`, which the dispatcher's spot checks
//! carry out); the other stages keep theirs.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use engine::kv_cache::KvDtype;
use engine::pipeline::{LocalStage, load_part_file};
use engine::stage_check::{StageRecord, StageVerdict, Tap, Tolerance, check};

use super::remote::StageRef;
use crate::services::metering::Credits;
use crate::services::spotcheck::{SpotCheck, Verdict, Who};

/// What the stage checks judge with and how a failed stage is sanctioned
/// (the dispatcher's spot checks: their rates and records, the quarantine
/// and the clawback).
pub trait Sanctions: Send + Sync {
    /// The checker: its rates, records and metrics.
    fn checker(&self) -> &SpotCheck;
    /// Stage `worker` of `provider` failed a check of a sequence of the
    /// request `credits` bills: quarantine it and claw back what it was
    /// paid for that request.
    fn stage_caught(
        self: Arc<Self>,
        worker: String,
        provider: String,
        why: String,
        credits: Option<Credits>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

/// Positions a record holds at most (the checking stage's KV).
pub const CHECK_POSITIONS: usize = 256;
/// Records open at once, and finished ones waiting for the checker.
const MAX_OPEN: usize = 64;
const QUEUE: usize = 16;

/// One finished record with whose stage it was and who paid for it.
struct Job {
    record: StageRecord,
    stage: StageRef,
    credits: Option<Credits>,
}

/// A pipeline model's stage checks: the checker its lanes' executors hand
/// their taps' records to.
pub struct StageChecks {
    spot: Arc<dyn Sanctions>,
    jobs: SyncSender<Job>,
}

impl std::fmt::Debug for StageChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageChecks").finish_non_exhaustive()
    }
}

/// Where the checker finds the model and how it lays out its KV.
#[derive(Debug, Clone)]
pub struct CheckModel {
    pub path: PathBuf,
    pub block_size: usize,
}

impl StageChecks {
    /// Checks for the model at `model`, judged and sanctioned through
    /// `spot`; the checker runs on its own thread.
    pub fn start(
        model: CheckModel,
        spot: Arc<dyn Sanctions>,
        rt: tokio::runtime::Handle,
    ) -> Arc<Self> {
        let (jobs, rx) = sync_channel(QUEUE);
        let me = Arc::new(Self {
            spot: spot.clone(),
            jobs,
        });
        let spawned = std::thread::Builder::new()
            .name("stage-checks".into())
            .spawn(move || checker(model, spot, rt, rx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "the stage checker could not start: stages go unchecked");
        }
        me
    }

    /// A tap for one lane's executor to record through.
    pub fn tap() -> Arc<Mutex<Tap>> {
        Arc::new(Mutex::new(Tap::new(CHECK_POSITIONS, MAX_OPEN)))
    }

    /// Whether to check a new sequence at a stage of `provider`.
    pub fn pick(&self, jobs_ok: u64) -> bool {
        self.spot.checker().pick(jobs_ok)
    }

    /// Hands finished records to the checker (dropped, and counted as
    /// skipped, when it is behind).
    pub fn submit(
        &self,
        records: Vec<StageRecord>,
        stages: &[StageRef],
        credits: impl Fn(engine::RequestId) -> Option<Credits>,
    ) {
        for record in records {
            let Some(stage) = stages.get(record.stage).cloned() else {
                continue;
            };
            let job = Job {
                credits: credits(record.seq),
                record,
                stage,
            };
            match self.jobs.try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.spot.checker().skipped();
                }
            }
        }
    }
}

/// The checker's loop: one record at a time, the part it needs loaded
/// (and the one before dropped first).
fn checker(
    model: CheckModel,
    spot: Arc<dyn Sanctions>,
    rt: tokio::runtime::Handle,
    rx: Receiver<Job>,
) {
    let mut held: Option<LocalStage> = None;
    while let Ok(job) = rx.recv() {
        let started = Instant::now();
        let stage = match part(&model, &mut held, job.record.layers.clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "a stage check could not load its layers");
                spot.checker().skipped();
                continue;
            }
        };
        let verdict = match check(stage, &job.record, &Tolerance::default()) {
            Ok(StageVerdict::Pass { worst, .. }) => Verdict::Pass(worst),
            Ok(StageVerdict::Fail(why)) => {
                Verdict::Fail(format!("layers {:?}: {why}", job.record.layers))
            }
            Err(e) => {
                tracing::warn!(error = %e, "a stage check could not run");
                spot.checker().skipped();
                continue;
            }
        };
        let who = Who {
            worker: &job.stage.worker,
            provider: &job.stage.provider,
        };
        let positions = job.record.positions() as u64;
        spot.checker()
            .judged(who, &verdict, started.elapsed().as_secs_f64(), positions);
        if let Verdict::Fail(why) = verdict {
            tracing::warn!(worker = %job.stage.worker, reason = %why, "a pipeline stage failed its spot check");
            let s = job.stage;
            rt.spawn(
                spot.clone()
                    .stage_caught(s.worker, s.provider, why, job.credits),
            );
        }
    }
}

/// The checking stage for `layers`, loaded unless it is the one held.
fn part<'a>(
    model: &CheckModel,
    held: &'a mut Option<LocalStage>,
    layers: Range<usize>,
) -> engine::error::Result<&'a mut LocalStage> {
    if held.as_ref().is_some_and(|s| {
        use engine::pipeline::Stage;
        s.layers() != layers
    }) {
        *held = None;
    }
    if held.is_none() {
        let blocks = CHECK_POSITIONS.div_ceil(model.block_size.max(1));
        let m = load_part_file(&model.path, layers)?;
        *held = Some(LocalStage::new(m, model.block_size, blocks, KvDtype::F16)?);
    }
    held.as_mut()
        .ok_or_else(|| engine::EngineError::Execution("no checking stage".into()))
}
