//! The executor seam: something that runs model steps over the KV blocks
//! the scheduler assigned. The scheduler only talks to this trait, so
//! remote workers and GPU executors plug in beside the local CPU one.

use crate::error::Result;
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

/// The in-process CPU executor: the model and the paged KV memory.
#[derive(Debug)]
pub struct LocalExecutor {
    model: Llama,
    kv: KvStorage,
}

impl LocalExecutor {
    pub fn new(model: Llama, layout: KvLayout) -> Self {
        Self { model, kv: KvStorage::new(layout) }
    }
}

impl Executor for LocalExecutor {
    fn execute(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        self.model.forward(batch, &mut self.kv)
    }

    fn release(&mut self, _seq: RequestId) {}
}
