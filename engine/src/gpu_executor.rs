//! `GpuExecutor` (features `wgpu`, `cuda`): the executor on a GPU backend
//! (wgpu or CUDA). The model's weights and the paged KV live on the
//! device; a step's logits come back to the host for sampling. Its KV
//! blocks and rows move to and from other executors (a split's prefill or
//! decode side) in the same bytes as the CPU's (`kv_cache::transfer`).

use kernels::backend::{Backend, KvLayout};

use crate::error::{EngineError, Result};
use crate::executor::{Executor, Step, Tables, sample_step};
use crate::kv_cache::transfer::{self, KvRows, KvTransferError};
use crate::model::ModelBatch;
use crate::model::llama::Llama;
use crate::request::RequestId;
use crate::sampling::Sampled;

/// The model and its KV on one GPU.
pub struct GpuExecutor<B: Backend> {
    model: Llama<B>,
    kv: B::Kv,
    name: String,
    /// See `Executor::max_positions`.
    max_positions: Option<usize>,
}

impl<B: Backend> std::fmt::Debug for GpuExecutor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuExecutor")
            .field("name", &self.name)
            .finish()
    }
}

/// The adapter `--device wgpu` runs on (opening it to ask).
#[cfg(feature = "wgpu")]
pub fn adapter() -> std::result::Result<kernels::wgpu::AdapterInfo, kernels::KernelError> {
    Ok(kernels::wgpu::WgpuBackend::new()?.adapter().clone())
}

/// The device `--device cuda:N` runs on (opening it to ask).
#[cfg(feature = "cuda")]
pub fn cuda_device(
    index: u32,
) -> std::result::Result<kernels::cuda::CudaDeviceInfo, kernels::KernelError> {
    Ok(kernels::cuda::CudaBackend::new(index)?.device().clone())
}

fn load_error(e: kernels::KernelError) -> EngineError {
    EngineError::Load(e.to_string())
}

/// The executor of `model` on the first wgpu adapter. Each layer's keys
/// (and values) are one buffer the attention shader binds whole: the KV
/// cache gets at most what one binding holds (the engine sizes its block
/// tables from the executor).
#[cfg(feature = "wgpu")]
pub fn on_wgpu(model: Llama, mut layout: KvLayout) -> Result<Box<dyn Executor>> {
    let backend = kernels::wgpu::WgpuBackend::new().map_err(load_error)?;
    let per_block = (layout.block_len() * 2) as u64;
    let fit = (backend.adapter().max_binding / per_block.max(1)) as usize;
    layout = cap_blocks(layout, fit, usize::MAX, "one GPU binding per layer")?;
    let name = format!("wgpu:{}", backend.adapter().name);
    let cap = backend.adapter().max_attention_positions(layout.head_dim);
    if let Some(cap) = cap {
        tracing::warn!(
            positions = cap,
            "a software adapter attends over this many positions at most: contexts capped"
        );
    }
    let model = model.onto(backend)?;
    announce(&name, &layout);
    let mut executor = GpuExecutor::new(model, layout, name);
    executor.max_positions = cap;
    Ok(Box::new(executor))
}

/// Device memory left free for activations and the allocator after the
/// weights and the KV cache are in.
#[cfg(feature = "cuda")]
const CUDA_HEADROOM: u64 = 512 << 20;

/// The executor of `model` on CUDA device `index`. The KV cache gets at
/// most the device memory the weights leave (less `CUDA_HEADROOM`), and
/// at most what the kernels' 32-bit offsets reach per layer.
#[cfg(feature = "cuda")]
pub fn on_cuda(index: u32, model: Llama, mut layout: KvLayout) -> Result<Box<dyn Executor>> {
    let backend = kernels::cuda::CudaBackend::new(index).map_err(load_error)?;
    let name = format!("cuda:{index}:{}", backend.device().name);
    let model = model.onto(backend)?;
    let (free, _) = model.backend().memory().map_err(load_error)?;
    // One block of one layer's keys and values.
    let per_block = (layout.block_len() * 2 * 2) as u64;
    let fit = (free.saturating_sub(CUDA_HEADROOM) / per_block.max(1)) as usize;
    layout = cap_blocks(layout, usize::MAX, fit, "the device's free memory")?;
    let offsets = (u32::MAX as usize) / layout.block_len().max(1);
    layout = cap_blocks(layout, offsets, usize::MAX, "32-bit offsets per layer")?;
    announce(&name, &layout);
    Ok(Box::new(GpuExecutor::new(model, layout, name)))
}

/// Says in the log which device serves and how much KV cache it holds
/// (nothing else tells an operator that `--device` took effect).
fn announce(device: &str, layout: &KvLayout) {
    tracing::info!(
        device,
        kv_blocks = layout.num_blocks,
        sliding_blocks = layout
            .sliding
            .map_or(0, |s| layout.num_blocks - s.first as usize),
        block_size = layout.block_size,
        "the model is on the GPU"
    );
}

/// Caps the KV cache at `per_layer` blocks in one layer and `total` over
/// all layers (`KvLayout::capped`), with a warning, or fails when not one
/// block fits.
fn cap_blocks(layout: KvLayout, per_layer: usize, total: usize, limit: &str) -> Result<KvLayout> {
    let capped = layout
        .capped(per_layer, total)
        .ok_or_else(|| EngineError::Load(format!("not one KV block fits the GPU ({limit})")))?;
    if capped != layout {
        tracing::warn!(
            blocks = layout.num_blocks,
            fit = capped.num_blocks,
            sliding_pool = capped.sliding.is_some(),
            limit,
            "the KV cache is larger than the GPU holds: capped"
        );
    }
    Ok(capped)
}

impl<B: Backend> GpuExecutor<B> {
    /// The executor of `model` with a KV of `layout`, named `name`
    /// (`wgpu:<adapter>`, `cuda:0:<device>`).
    pub fn new(model: Llama<B>, layout: KvLayout, name: String) -> Self {
        let kv = model.backend().kv(layout);
        Self {
            model,
            kv,
            name,
            max_positions: None,
        }
    }
}

impl<B: Backend + 'static> Executor for GpuExecutor<B> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn kv_layout(&self) -> KvLayout {
        self.model.backend().kv_layout(&self.kv)
    }

    fn max_positions(&self) -> Option<usize> {
        self.max_positions
    }

    fn execute(&mut self, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>> {
        let logits = self.model.forward(step.batch, &mut self.kv)?;
        Ok(sample_step(step, &logits))
    }

    fn release(&mut self, _seq: RequestId) {}

    fn logits(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        self.model.forward(batch, &mut self.kv)
    }

    fn export_kv(&self, blocks: &[u32]) -> std::result::Result<Vec<u8>, KvTransferError> {
        transfer::export_on(self.model.backend(), &self.kv, blocks)
    }

    fn import_kv(
        &mut self,
        blocks: &[u32],
        bytes: &[u8],
    ) -> std::result::Result<(), KvTransferError> {
        transfer::import_on(self.model.backend(), &mut self.kv, blocks, bytes)
    }

    fn read_rows(
        &self,
        t: Tables<'_>,
        first: usize,
        count: usize,
    ) -> std::result::Result<KvRows, KvTransferError> {
        let tables = self.model.config.layer_tables(t.full, t.swa);
        transfer::read_rows_on(self.model.backend(), &self.kv, &tables, first, count)
    }

    fn write_rows(
        &mut self,
        t: Tables<'_>,
        rows: &KvRows,
        from: usize,
    ) -> std::result::Result<(), KvTransferError> {
        let tables = self.model.config.layer_tables(t.full, t.swa);
        transfer::write_rows_on(self.model.backend(), &mut self.kv, &tables, rows, from)
    }
}
