//! The executor seam: something that runs model steps and owns the KV state
//! of the sequences it has seen. The scheduler only talks to this trait, so
//! remote workers and GPU executors plug in beside the local CPU one.

use crate::error::Result;
use crate::model::llama::Llama;
use crate::model::{KvStore, ModelBatch};
use crate::request::RequestId;

/// Runs forward passes for the engine core.
pub trait Executor: Send {
    /// Runs one step; returns one logits row per chunk with `want_logits`,
    /// in batch order.
    fn execute(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>>;
    /// Forgets a sequence and frees its KV.
    fn release(&mut self, seq: RequestId);
    /// Number of sequences whose KV is held.
    fn live_sequences(&self) -> usize;
}

/// The in-process CPU executor.
#[derive(Debug)]
pub struct LocalExecutor {
    model: Llama,
    kv: KvStore,
}

impl LocalExecutor {
    pub fn new(model: Llama) -> Self {
        Self {
            model,
            kv: KvStore::new(),
        }
    }
}

impl Executor for LocalExecutor {
    fn execute(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        let logits = self.model.forward(batch, &mut self.kv)?;
        Ok(logits.to_vec2::<f32>()?)
    }

    fn release(&mut self, seq: RequestId) {
        self.kv.remove(&seq);
    }

    fn live_sequences(&self) -> usize {
        self.kv.len()
    }
}
