//! Models served as pipelines of workers, for models no one worker can
//! hold (`--pipeline-model`). The server reads only the model's metadata
//! and tokenizer and runs engines (scheduler, KV block tables, sampling's
//! parameters, billing) as for any model; their executors send each step
//! through a chain of workers, each holding a contiguous layer range
//! (`remote`). A model has lanes, each an engine with a chain of its own
//! (workers apart), so a fleet with workers enough serves it on several
//! chains at once; each request goes to the lane whose chain is expected
//! to serve it soonest. The planner (`planner`) forms each lane's chain
//! from the workers that offer parts of the model and no earlier lane
//! uses: which layers each holds (`plan`), asks them to load their
//! parts, publishes the chain once every part is held, keeps it while it
//! stands, and forms another when a stage leaves or fails.

pub mod checks;
pub mod plan;
mod planner;
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
use engine::{EngineBuilder, EngineHandle, ModelFacts, SchedulerConfig};

use crate::fleet::registry::Registry;
use remote::{ChainCell, FleetPipeline, PipelineShape, StageRef};

/// How often the planner looks at the fleet.
pub const PLAN_EVERY: Duration = Duration::from_millis(250);

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
    /// Lanes at most: engines, each on a chain of its own.
    pub lanes: usize,
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

/// One lane of a pipeline model: an engine and the chain it runs on.
#[derive(Debug)]
pub struct Lane {
    pub engine: EngineHandle,
    pub cell: Arc<ChainCell>,
    /// Whether the planner said it cannot form a chain (said once).
    stuck: Mutex<bool>,
    /// When the chain was last re-planned for speed.
    moved: Mutex<Option<Instant>>,
    /// A planned chain while its parts load (for a re-plan none runs
    /// meanwhile: the workers drop their old parts), and when it was
    /// asked for.
    target: Mutex<Option<(Vec<StageRef>, Instant)>>,
}

impl Lane {
    /// The workers it runs on or is loading parts on.
    fn workers(&self) -> Vec<String> {
        let chain = self.cell.get().map(|c| c.stages).unwrap_or_default();
        let target = self.target.lock().unwrap_or_else(|e| e.into_inner());
        let pending = target.iter().flat_map(|(t, _)| t.iter());
        chain
            .iter()
            .chain(pending)
            .map(|s| s.worker.clone())
            .collect()
    }

    /// The time a new request is expected to wait on it: its chain's
    /// step (the stages' measured steps, summed) for each sequence ahead
    /// of it and its own; `None` without a chain.
    pub fn expected_ms(&self) -> Option<f64> {
        let chain = self.cell.get()?;
        let step: f64 = chain
            .stages
            .iter()
            .map(|s| self.cell.measure(&s.worker).step_ms.max(1.0))
            .sum();
        let stats = self.engine.stats();
        Some(step * (stats.num_running + stats.num_waiting + 1) as f64)
    }
}

/// A pipeline model being served: its spec, what its parts weigh, and
/// its lanes.
#[derive(Debug)]
pub struct PipelineModel {
    pub spec: PipelineSpec,
    pub sizes: PartSizes,
    pub lanes: Vec<Arc<Lane>>,
    /// Parts asked for and when, so a slow load is not asked again and
    /// again.
    asked: Mutex<HashMap<(String, u32, u32), Instant>>,
}

/// Request ids of lane `i` start here (the lanes' stage checks and bills
/// meet in one place).
const LANE_IDS: u64 = 1 << 40;

/// Starts `spec`'s lanes over `fleet`'s workers and serves the first in
/// `models` (the dispatcher routes among them); the planner (`run`)
/// forms their chains.
pub fn start(
    spec: PipelineSpec,
    template: &TemplateChoice,
    scheduler: SchedulerConfig,
    fleet: Arc<Registry>,
    spot: Option<Arc<dyn checks::Sanctions>>,
    models: &ModelRegistry,
) -> Result<Arc<PipelineModel>, EngineError> {
    let sizes = part_sizes(&spec.path)?;
    let rt = tokio::runtime::Handle::current();
    let check = checks::CheckModel {
        path: spec.path.clone(),
        block_size: spec.block_size as usize,
    };
    let checks = spot.map(|spot| checks::StageChecks::start(check, spot, rt.clone()));
    let mut lanes = Vec::new();
    for i in 0..spec.lanes.max(1) {
        let front = load_front(&spec.path, template)?;
        let c = &front.config;
        let shape = PipelineShape {
            model: spec.name.clone(),
            hidden: c.hidden,
            vocab: c.vocab_size,
            layout: engine::kv_cache::KvLayout {
                dtype: KvDtype::F16,
                ..c.kv_layout(spec.block_size as usize, spec.blocks as usize)
            },
            step_timeout: spec.step_timeout,
            chain_wait: spec.step_timeout,
            micro_batches: spec.micro_batches,
        };
        let cell = Arc::new(ChainCell::default());
        let executor = FleetPipeline::new(
            shape,
            fleet.clone(),
            cell.clone(),
            rt.clone(),
            checks.clone(),
        );
        let facts = ModelFacts {
            architecture: c.architecture.clone(),
            context_length: c.context_length,
            vocab_size: c.vocab_size,
            generation: front.generation,
        };
        let engine = EngineBuilder::new(front.tokenizer, front.template, facts)
            .scheduler(scheduler.clone())
            .first_id(i as u64 * LANE_IDS + 1)
            .executor(Box::new(executor))
            .start()?;
        lanes.push(Arc::new(Lane {
            engine,
            cell,
            stuck: Mutex::new(false),
            moved: Mutex::default(),
            target: Mutex::default(),
        }));
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    models
        .add(RegisteredModel {
            name: spec.name.clone(),
            created,
            version: model_version(&spec.path),
            kind: ModelKind::Text(lanes[0].engine.clone()),
            path: None,
        })
        .map_err(|e| EngineError::Load(e.to_string()))?;
    tracing::info!(model = %spec.name, layers = sizes.n_layer, lanes = lanes.len(), "serving a model as a pipeline of workers");
    Ok(Arc::new(PipelineModel {
        spec,
        sizes,
        lanes,
        asked: Mutex::default(),
    }))
}

/// Plans every pipeline model's chains, for ever.
pub async fn run(fleet: Arc<Registry>, models: Vec<Arc<PipelineModel>>) {
    let mut tick = tokio::time::interval(PLAN_EVERY);
    loop {
        tick.tick().await;
        for m in &models {
            planner::replan(&fleet, m).await;
        }
    }
}
