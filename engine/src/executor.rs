//! The executor seam: something that runs model steps over the KV blocks
//! the scheduler assigned. The scheduler only talks to this trait, so
//! remote workers and GPU executors plug in beside the local CPU one.

use crate::error::{EngineError, Result};
use crate::kv_cache::{KvLayout, KvStorage};
use crate::model::ModelBatch;
use crate::model::llama::Llama;
use crate::request::RequestId;

/// Runs forward passes for the engine core.
pub trait Executor: Send {
    /// Runs one step; returns one logits row per chunk with `want_logits`,
    /// in batch order.
    fn execute(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>>;
    /// Forgets a finished sequence (remote executors drop its state; the
    /// local one keeps nothing per sequence beyond the shared blocks).
    fn release(&mut self, seq: RequestId);
}

/// The in-process CPU executor: the model, the paged KV memory, and a
/// thread pool the whole step runs in (so the step's own thread is one of
/// the workers and the many short parallel regions of a decode step do not
/// each wake a sleeping pool).
#[derive(Debug)]
pub struct LocalExecutor {
    model: Llama,
    kv: KvStorage,
    pool: rayon::ThreadPool,
}

impl LocalExecutor {
    pub fn new(model: Llama, layout: KvLayout) -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("synor-compute-{i}"))
            .build()
            .map_err(|e| EngineError::Load(format!("compute threads: {e}")))?;
        Ok(Self {
            model,
            kv: KvStorage::new(layout),
            pool,
        })
    }
}

impl Executor for LocalExecutor {
    fn execute(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        let Self { model, kv, pool } = self;
        pool.install(|| model.forward(batch, kv))
    }

    fn release(&mut self, _seq: RequestId) {}
}
