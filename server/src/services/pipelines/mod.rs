//! Models served as pipelines of workers, for models no one worker can
//! hold (`--pipeline-model`). The server reads only the model's metadata
//! and tokenizer and runs the engine (scheduler, KV block tables,
//! sampling's parameters, billing) as for any model; its executor sends
//! each step through a chain of workers, each holding a contiguous layer
//! range (`remote`). The planner here forms the chain from the workers
//! that offer parts of the model: which layers each holds (`plan`), asks
//! them to load their parts, publishes the chain once every part is held,
//! keeps it while it stands, and forms another when a stage leaves or
//! fails.

pub mod checks;
pub mod plan;
pub mod remote;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::chat::TemplateChoice;
use engine::error::EngineError;
use engine::kv_cache::KvDtype;
use engine::loader::load_front;
use engine::pipeline::{PartSizes, part_sizes};
use engine::registry::{ModelKind, ModelRegistry, RegisteredModel, model_version};
use engine::{EngineBuilder, ModelFacts, SchedulerConfig};
use protocol::bus::WorkerInfo;
use protocol::stage::PartOffer;
use protocol::{ToWorker, VERSION};

use crate::fleet::registry::Registry;
use plan::{Candidate, plan};
use remote::{ChainCell, FleetPipeline, PipelineShape, StageRef};

/// How often the planner looks at the fleet.
pub const PLAN_EVERY: Duration = Duration::from_millis(250);
/// How long a worker asked to load a part has before it is asked again.
const ASK_AGAIN: Duration = Duration::from_secs(30);

/// A model to serve as a pipeline.
#[derive(Debug, Clone)]
pub struct PipelineSpec {
    pub name: String,
    pub path: PathBuf,
    /// KV blocks of `block_size` tokens every stage holds for each layer.
    pub blocks: u32,
    pub block_size: u32,
    pub step_timeout: Duration,
    /// Micro-batches a step at most (0: as many as stages; 1: none).
    pub micro_batches: usize,
    /// Layers by measured speed (else the same number each).
    pub measured: bool,
}

impl PipelineSpec {
    /// What its plans minimize: the stages' total time when a step walks
    /// the chain whole, the slowest stage's when micro-batches overlap.
    pub fn objective(&self) -> plan::Objective {
        if self.micro_batches == 1 {
            plan::Objective::Total
        } else {
            plan::Objective::Bottleneck
        }
    }
}

/// A pipeline model being served: its spec, what its parts weigh, and
/// the chain it runs on.
#[derive(Debug)]
pub struct PipelineModel {
    pub spec: PipelineSpec,
    pub sizes: PartSizes,
    pub cell: Arc<ChainCell>,
    /// Parts asked for and when, so a slow load is not asked again and
    /// again.
    asked: Mutex<HashMap<(String, u32, u32), Instant>>,
    /// Whether the planner said it cannot form a chain (said once).
    stuck: Mutex<bool>,
    /// When the chain was last re-planned for speed.
    moved: Mutex<Option<Instant>>,
    /// A re-plan's chain while its parts load (none runs meanwhile: the
    /// workers drop their old parts), and when it was asked for.
    target: Mutex<Option<(Vec<StageRef>, Instant)>>,
}

/// Starts `spec`'s engine over `fleet`'s workers and serves it in
/// `models`; the planner (`run`) forms its chains.
pub fn start(
    spec: PipelineSpec,
    template: &TemplateChoice,
    scheduler: SchedulerConfig,
    fleet: Arc<Registry>,
    spot: Option<Arc<crate::services::dispatch::SpotChecks>>,
    models: &ModelRegistry,
) -> Result<Arc<PipelineModel>, EngineError> {
    let front = load_front(&spec.path, template)?;
    let sizes = part_sizes(&spec.path)?;
    let c = &front.config;
    let layout = engine::kv_cache::KvLayout {
        dtype: KvDtype::F16,
        ..c.kv_layout(spec.block_size as usize, spec.blocks as usize)
    };
    let shape = PipelineShape {
        model: spec.name.clone(),
        hidden: c.hidden,
        vocab: c.vocab_size,
        layout,
        step_timeout: spec.step_timeout,
        chain_wait: spec.step_timeout,
        micro_batches: spec.micro_batches,
    };
    let cell = Arc::new(ChainCell::default());
    let rt = tokio::runtime::Handle::current();
    let check = checks::CheckModel {
        path: spec.path.clone(),
        block_size: spec.block_size as usize,
    };
    let checks = spot.map(|spot| checks::StageChecks::start(check, spot, rt.clone()));
    let executor = FleetPipeline::new(shape, fleet, cell.clone(), rt, checks);
    let facts = ModelFacts {
        architecture: c.architecture.clone(),
        context_length: c.context_length,
        vocab_size: c.vocab_size,
        generation: front.generation,
    };
    let handle = EngineBuilder::new(front.tokenizer, front.template, facts)
        .scheduler(scheduler)
        .executor(Box::new(executor))
        .start()?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    models
        .add(RegisteredModel {
            name: spec.name.clone(),
            created,
            version: model_version(&spec.path),
            kind: ModelKind::Text(handle),
        })
        .map_err(|e| EngineError::Load(e.to_string()))?;
    tracing::info!(model = %spec.name, layers = sizes.n_layer, "serving a model as a pipeline of workers");
    Ok(Arc::new(PipelineModel {
        spec,
        sizes,
        cell,
        asked: Mutex::default(),
        stuck: Mutex::new(false),
        moved: Mutex::default(),
        target: Mutex::default(),
    }))
}

/// Plans every pipeline model's chain, for ever.
pub async fn run(fleet: Arc<Registry>, models: Vec<Arc<PipelineModel>>) {
    let mut tick = tokio::time::interval(PLAN_EVERY);
    loop {
        tick.tick().await;
        for m in &models {
            replan(&fleet, m).await;
        }
    }
}

/// This replica's workers that may hold a part of `m` now, with their
/// offers.
fn candidates(fleet: &Registry, m: &PipelineModel) -> Vec<(WorkerInfo, PartOffer)> {
    let n = m.sizes.n_layer as u32;
    fleet
        .list()
        .into_iter()
        .filter(|w| fleet.is_local(&w.id) && matches!(w.state.as_str(), "active" | "calibrating"))
        .filter(|w| !m.cell.is_failed(&w.id))
        .filter_map(|w| {
            let o = w
                .parts
                .iter()
                .find(|o| {
                    o.model == m.spec.name && o.layers == n && o.hidden as usize == m.sizes.hidden
                })?
                .clone();
            Some((w, o))
        })
        .collect()
}

/// Whether `w` holds `s`'s layers of `m` with its KV.
fn holds(w: &WorkerInfo, m: &PipelineModel, s: &StageRef) -> bool {
    w.holds.iter().any(|h| {
        h.model == m.spec.name
            && (h.first, h.end) == (s.layers.start, s.layers.end)
            && h.blocks == m.spec.blocks
    })
}

/// One look at the fleet for `m`: keep a standing chain, or plan one, ask
/// for its parts and publish it once they are all held.
async fn replan(fleet: &Registry, m: &PipelineModel) {
    let cands = candidates(fleet, m);
    let held = |s: &StageRef| {
        cands
            .iter()
            .any(|(w, _)| w.id == s.worker && holds(w, m, s))
    };
    if let Some(c) = m.cell.get() {
        if c.stages.iter().all(held) {
            if let Some(better) = faster(m, &c, &cands) {
                tracing::info!(model = %m.spec.name, stages = ?better, "re-planning the pipeline for its measured speeds");
                m.cell.set(None);
                for s in &better {
                    ask(fleet, m, s).await;
                }
                *m.target.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((better, Instant::now()));
            }
            return;
        }
        tracing::warn!(model = %m.spec.name, "a pipeline stage left: forming another chain");
        m.cell.set(None);
    }
    let target = m.target.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some((stages, asked)) = target {
        if stages.iter().all(held) {
            tracing::info!(model = %m.spec.name, stages = ?stages, "pipeline re-formed");
            m.cell.set(Some(stages));
            *m.target.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return;
        }
        let gone = stages
            .iter()
            .any(|s| !cands.iter().any(|(w, _)| w.id == s.worker));
        if !gone && asked.elapsed() < ASK_AGAIN {
            return;
        }
        *m.target.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    // Parts already held that make a chain are used as they are: a plan
    // would reload layers for nothing.
    if let Some(stages) = held_chain(&cands, m) {
        tracing::info!(model = %m.spec.name, stages = ?stages, "pipeline formed from the parts held");
        m.cell.set(Some(stages));
        return;
    }
    let Some(placed) = plan(
        m.sizes.n_layer as u32,
        &offered(m, &cands),
        m.spec.objective(),
    ) else {
        let mut stuck = m.stuck.lock().unwrap_or_else(|e| e.into_inner());
        if !*stuck && !cands.is_empty() {
            tracing::warn!(model = %m.spec.name, workers = cands.len(), "the workers offering parts cannot hold every layer together");
        }
        *stuck = true;
        return;
    };
    *m.stuck.lock().unwrap_or_else(|e| e.into_inner()) = false;
    let stages: Vec<StageRef> = placed
        .into_iter()
        .map(|p| StageRef {
            provider: provider_of(&cands, &p.worker),
            worker: p.worker,
            layers: p.layers,
        })
        .collect();
    let mut ready = true;
    for s in &stages {
        if !held(s) {
            ready = false;
            ask(fleet, m, s).await;
        }
    }
    if ready {
        tracing::info!(model = %m.spec.name, stages = ?stages, "pipeline formed");
        m.cell.set(Some(stages.clone()));
        for (w, _) in &cands {
            let in_chain = stages.iter().any(|s| s.worker == w.id);
            if !in_chain && w.holds.iter().any(|h| h.model == m.spec.name) {
                let msg = ToWorker::DropPart {
                    v: VERSION,
                    model: m.spec.name.clone(),
                };
                fleet.send_local(&w.id, msg).await;
            }
        }
    }
}

/// The candidates as the plan sees them: their room and (with measured
/// placement) their measured speeds, a worker not measured yet taken to
/// be as fast as the others.
fn offered(m: &PipelineModel, cands: &[(WorkerInfo, PartOffer)]) -> Vec<Candidate> {
    let blocks = u64::from(m.spec.blocks);
    let speeds = if m.spec.measured {
        m.cell.speeds()
    } else {
        HashMap::new()
    };
    let typical = if speeds.is_empty() {
        1.0
    } else {
        speeds.values().sum::<f64>() / speeds.len() as f64
    };
    cands
        .iter()
        .map(|(w, o)| Candidate {
            id: w.id.clone(),
            mid: o.fits(blocks, false),
            end: o.fits(blocks, true),
            speed: speeds.get(&w.id).copied().unwrap_or(typical),
        })
        .collect()
}

/// Steps each stage must have run before its speed counts.
const MEASURED_STEPS: u64 = 50;
/// The least time between two re-plans for speed.
const MOVE_EVERY: Duration = Duration::from_secs(60);
/// A re-plan must cut the chain's cost by this share.
const MOVE_GAIN: f64 = 0.2;

/// A plan of the same workers whose cost (the stages' times, layers over
/// measured speed, summed or the slowest) is at least `MOVE_GAIN` below
/// standing chain `c`'s, when
/// placement is measured, every stage is measured and the last such
/// re-plan is `MOVE_EVERY` old.
fn faster(
    m: &PipelineModel,
    c: &remote::Chain,
    cands: &[(WorkerInfo, PartOffer)],
) -> Option<Vec<StageRef>> {
    if !m.spec.measured {
        return None;
    }
    let measures: Vec<_> = c.stages.iter().map(|s| m.cell.measure(&s.worker)).collect();
    if measures
        .iter()
        .any(|x| x.steps < MEASURED_STEPS || x.speed <= 0.0)
    {
        return None;
    }
    if m.moved
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some_and(|at| at.elapsed() < MOVE_EVERY)
    {
        return None;
    }
    let objective = m.spec.objective();
    let speed = |w: &str| m.cell.measure(w).speed;
    let now = objective.cost(
        c.stages
            .iter()
            .map(|s| (s.layers.len() as u32, speed(&s.worker))),
    );
    let mine: Vec<_> = cands
        .iter()
        .filter(|(w, _)| c.stages.iter().any(|s| s.worker == w.id))
        .cloned()
        .collect();
    let placed = plan(m.sizes.n_layer as u32, &offered(m, &mine), objective)?;
    let then = objective.cost(
        placed
            .iter()
            .map(|p| (p.layers.len() as u32, speed(&p.worker))),
    );
    if then > now * (1.0 - MOVE_GAIN) {
        return None;
    }
    *m.moved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    Some(
        placed
            .into_iter()
            .map(|p| StageRef {
                provider: provider_of(cands, &p.worker),
                worker: p.worker,
                layers: p.layers,
            })
            .collect(),
    )
}

fn provider_of(cands: &[(WorkerInfo, PartOffer)], worker: &str) -> String {
    cands
        .iter()
        .find(|(w, _)| w.id == worker)
        .map(|(w, _)| w.provider_id.clone())
        .unwrap_or_default()
}

/// A chain of the parts `cands` hold now, from layer 0 to the last, with
/// the fewest stages (each step takes the held part that reaches
/// furthest), if they make one.
fn held_chain(cands: &[(WorkerInfo, PartOffer)], m: &PipelineModel) -> Option<Vec<StageRef>> {
    let n = m.sizes.n_layer as u32;
    let held: Vec<StageRef> = cands
        .iter()
        .flat_map(|(w, _)| {
            w.holds
                .iter()
                .filter(|h| h.model == m.spec.name && h.blocks == m.spec.blocks && h.first < h.end)
                .map(|h| StageRef {
                    worker: w.id.clone(),
                    provider: w.provider_id.clone(),
                    layers: h.first..h.end,
                })
        })
        .collect();
    let mut chain: Vec<StageRef> = Vec::new();
    let mut at = 0;
    while at < n {
        let next = held
            .iter()
            .filter(|s| s.layers.start == at && !chain.iter().any(|c| c.worker == s.worker))
            .max_by(|a, b| (a.layers.end, &b.worker).cmp(&(b.layers.end, &a.worker)))?;
        at = next.layers.end;
        chain.push(next.clone());
    }
    (at == n).then_some(chain)
}

/// Asks `s.worker` to load its part, unless it was asked lately.
async fn ask(fleet: &Registry, m: &PipelineModel, s: &StageRef) {
    let key = (s.worker.clone(), s.layers.start, s.layers.end);
    {
        let mut asked = m.asked.lock().unwrap_or_else(|e| e.into_inner());
        asked.retain(|_, at| at.elapsed() < ASK_AGAIN);
        if asked.contains_key(&key) {
            return;
        }
        asked.insert(key, Instant::now());
    }
    let msg = ToWorker::LoadPart {
        v: VERSION,
        model: m.spec.name.clone(),
        first: s.layers.start,
        end: s.layers.end,
        blocks: m.spec.blocks,
        block_size: m.spec.block_size,
    };
    fleet.send_local(&s.worker, msg).await;
}
