//! `GpuExecutor` (feature `wgpu`): the executor on a GPU through the wgpu
//! backend. The model's weights and the paged KV live on the device; a
//! step's logits come back to the host for sampling. Moving KV rows to or
//! from another executor (a split's prefill or decode side) is not
//! supported on it yet: it says `NotKv`, and the fleet recomputes.

use kernels::backend::{Backend, KvLayout};
use kernels::wgpu::{GpuKv, WgpuBackend};

use crate::error::Result;
use crate::executor::{Executor, Step, sample_step};
use crate::kv_cache::transfer::KvTransferError;
use crate::model::ModelBatch;
use crate::model::llama::Llama;
use crate::request::RequestId;
use crate::sampling::Sampled;

/// The model and its KV on one wgpu device.
pub struct GpuExecutor {
    model: Llama<WgpuBackend>,
    kv: GpuKv,
    name: String,
}

impl std::fmt::Debug for GpuExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuExecutor")
            .field("name", &self.name)
            .finish()
    }
}

/// The adapter `--device wgpu` runs on (opening it to ask).
pub fn adapter() -> std::result::Result<kernels::wgpu::AdapterInfo, kernels::KernelError> {
    Ok(WgpuBackend::new()?.adapter().clone())
}

impl GpuExecutor {
    pub fn new(model: Llama<WgpuBackend>, layout: KvLayout) -> Self {
        let kv = model.backend().kv(layout);
        let a = model.backend().adapter();
        let name = format!("wgpu:{}", a.name);
        Self { model, kv, name }
    }
}

impl Executor for GpuExecutor {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn kv_layout(&self) -> KvLayout {
        self.model.backend().kv_layout(&self.kv)
    }

    fn execute(&mut self, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>> {
        let logits = self.model.forward(step.batch, &mut self.kv)?;
        Ok(sample_step(step, &logits))
    }

    fn release(&mut self, _seq: RequestId) {}

    fn logits(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        self.model.forward(batch, &mut self.kv)
    }

    fn export_kv(&self, _blocks: &[u32]) -> std::result::Result<Vec<u8>, KvTransferError> {
        Err(KvTransferError::NotKv)
    }

    fn import_kv(
        &mut self,
        _blocks: &[u32],
        _bytes: &[u8],
    ) -> std::result::Result<(), KvTransferError> {
        Err(KvTransferError::NotKv)
    }
}
