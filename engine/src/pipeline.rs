//! Layer-sharded pipelines: one model run as a chain of stages, each
//! holding a contiguous range of its layers (`Llama::load_part`) and the KV
//! of those layers only. `PipelineExecutor` is an `Executor` over such a
//! chain: each step goes through the stages in order, the first embedding
//! the batch's tokens, every other one taking the hidden states of the one
//! before it (f32, so a chain computes exactly what one engine does), and
//! the last one sampling. The engine core above it schedules and keeps
//! the block tables as for any executor; every stage lays out its KV by
//! the same block ids. Stages are in-process (`LocalStage`) or elsewhere
//! (the server's fleet stages implement `Stage` over the worker protocol).

use std::ops::Range;
use std::path::Path;

use kernels::cpu::backend::CpuBackend;

use crate::error::{EngineError, Result};
use crate::executor::{Compute, Executor, Step, compute_pool, sample_step_parallel};
use crate::gguf::Gguf;
use crate::kv_cache::{KvDtype, KvLayout, KvStorage};
use crate::model::llama::{Llama, LlamaConfig, PartInput, PartOutput};
use crate::request::RequestId;
use crate::sampling::Sampled;

/// What a stage gives back for a step: the hidden state of every token of
/// the batch (`[tokens, hidden]`, batch order) for the next stage, or, from
/// the last stage, the tokens sampled for each chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum StageOutput {
    Hidden(Vec<f32>),
    Sampled(Vec<Vec<Sampled>>),
}

/// One stage of a pipeline.
pub trait Stage: Send {
    /// A short name for logs and usage records (a worker's id).
    fn name(&self) -> String;
    /// The layers it computes.
    fn layers(&self) -> Range<usize>;
    /// KV blocks it holds for each of its layers.
    fn num_blocks(&self) -> usize;
    /// Runs its layers over the step's batch from `input` (the tokens on
    /// the first stage); the last stage samples with the step's sampling.
    fn run(&mut self, step: &Step<'_>, input: PartInput<'_>) -> Result<StageOutput>;
    /// Forgets a finished sequence.
    fn release(&mut self, seq: RequestId);
}

/// A stage in this process: a part of the model, its KV and the compute
/// threads it runs on.
pub struct LocalStage {
    model: Llama,
    kv: KvStorage,
    pool: Compute,
}

impl std::fmt::Debug for LocalStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalStage")
            .field("layers", &self.model.layer_range())
            .finish_non_exhaustive()
    }
}

impl LocalStage {
    /// A stage over `model` (a part or the whole) with `num_blocks` KV
    /// blocks of `block_size` tokens for each of its layers.
    pub fn new(model: Llama, block_size: usize, num_blocks: usize, dtype: KvDtype) -> Result<Self> {
        let layout = KvLayout {
            dtype,
            ..model.part_kv_layout(block_size, num_blocks)
        };
        Ok(Self {
            kv: KvStorage::new(layout),
            model,
            pool: compute_pool()?,
        })
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.kv.layout.block_size
    }

    /// The forward pass of its layers alone (tests compare these).
    pub fn forward(
        &mut self,
        batch: &crate::model::ModelBatch,
        input: PartInput<'_>,
    ) -> Result<PartOutput> {
        let Self { model, kv, pool } = self;
        pool.install(|| model.forward_part(batch, input, kv))
    }
}

impl Stage for LocalStage {
    fn name(&self) -> String {
        let r = self.model.layer_range();
        format!("cpu[{}..{}]", r.start, r.end)
    }

    fn layers(&self) -> Range<usize> {
        self.model.layer_range()
    }

    fn num_blocks(&self) -> usize {
        self.kv.layout.num_blocks
    }

    fn run(&mut self, step: &Step<'_>, input: PartInput<'_>) -> Result<StageOutput> {
        match self.forward(step.batch, input)? {
            PartOutput::Hidden(h) => Ok(StageOutput::Hidden(h)),
            PartOutput::Logits(rows) => Ok(StageOutput::Sampled(
                self.pool.install(|| sample_step_parallel(step, &rows)),
            )),
        }
    }

    fn release(&mut self, _seq: RequestId) {}
}

/// An executor over a chain of stages that covers a model's layers.
pub struct PipelineExecutor {
    stages: Vec<Box<dyn Stage>>,
    layout: KvLayout,
}

impl std::fmt::Debug for PipelineExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineExecutor")
            .field("stages", &self.name())
            .finish_non_exhaustive()
    }
}

impl PipelineExecutor {
    /// The chain `stages`, in order; their layers must follow each other
    /// from 0 to the model's last (`model`'s KV geometry: `layout`, whose
    /// block count is capped by the stage holding the fewest).
    pub fn new(stages: Vec<Box<dyn Stage>>, layout: KvLayout) -> Result<Self> {
        check_chain(&stages, layout.n_layer)?;
        let fewest = stages.iter().map(|s| s.num_blocks()).min().unwrap_or(0);
        let layout = KvLayout {
            num_blocks: layout.num_blocks.min(fewest),
            sliding: None,
            ..layout
        };
        Ok(Self { stages, layout })
    }

    /// The stages, in order.
    pub fn stages(&self) -> &[Box<dyn Stage>] {
        &self.stages
    }
}

/// The stages' layers follow each other from 0 to `n_layer`.
fn check_chain(stages: &[Box<dyn Stage>], n_layer: usize) -> Result<()> {
    let mut next = 0;
    for s in stages {
        let r = s.layers();
        if r.start != next || r.is_empty() {
            return Err(EngineError::Load(format!(
                "stage {} holds layers {r:?}; the chain needs layer {next} next",
                s.name()
            )));
        }
        next = r.end;
    }
    if next != n_layer || stages.is_empty() {
        return Err(EngineError::Load(format!(
            "the stages cover layers 0..{next} of {n_layer}"
        )));
    }
    Ok(())
}

impl Executor for PipelineExecutor {
    fn name(&self) -> String {
        let names: Vec<String> = self.stages.iter().map(|s| s.name()).collect();
        names.join(">")
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout
    }

    fn kv_bytes(&self) -> usize {
        0
    }

    fn execute(&mut self, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>> {
        run_chain(&mut self.stages, step)
    }

    fn release(&mut self, seq: RequestId) {
        for s in &mut self.stages {
            s.release(seq);
        }
    }
}

/// What a model file's parts weigh, read from its tensor table alone (no
/// weights are read): what a worker offers to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSizes {
    pub n_layer: usize,
    pub hidden: usize,
    /// Bytes of the heaviest layer's weights.
    pub layer_bytes: u64,
    /// Bytes of the token embeddings, the final norm and the output head.
    pub ends_bytes: u64,
    /// Bytes of one token's f16 K and V in one layer.
    pub kv_bytes_per_token: u64,
}

/// The sizes of `path`'s parts.
pub fn part_sizes(path: &Path) -> Result<PartSizes> {
    let (ct, _) = open_gguf(path)?;
    let c = LlamaConfig::from_gguf(&ct)?;
    let bytes = |prefix: &str| -> u64 {
        ct.tensors
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, t)| t.bytes() as u64)
            .sum()
    };
    let layer_bytes = (0..c.n_layer)
        .map(|i| bytes(&format!("blk.{i}.")))
        .max()
        .unwrap_or(0);
    let ends_bytes = ["token_embd.", "output.", "output_norm."]
        .iter()
        .map(|p| bytes(p))
        .sum();
    Ok(PartSizes {
        n_layer: c.n_layer,
        hidden: c.hidden,
        layer_bytes,
        ends_bytes,
        kv_bytes_per_token: KvLayout::bytes_per_token(1, c.n_kv_head, c.head_dim, KvDtype::F16)
            as u64,
    })
}

/// Loads layers `layers` of the GGUF file at `path` (only their tensors,
/// with the ends the first and the last part hold).
pub fn load_part_file(path: &Path, layers: Range<usize>) -> Result<Llama> {
    let (ct, mut reader) = open_gguf(path)?;
    Llama::load_part(CpuBackend, &ct, &mut reader, layers)
}

fn open_gguf(path: &Path) -> Result<(Gguf, std::io::BufReader<std::fs::File>)> {
    let file = std::fs::File::open(path)
        .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?;
    let mut reader = std::io::BufReader::new(file);
    let ct = Gguf::read(&mut reader)
        .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?;
    Ok((ct, reader))
}

/// Runs one step through `stages` in order: the first from the tokens,
/// each next from the hidden states of the one before, the last sampling.
pub fn run_chain(stages: &mut [Box<dyn Stage>], step: &Step<'_>) -> Result<Vec<Vec<Sampled>>> {
    let mut hidden: Option<Vec<f32>> = None;
    let last = stages.len().saturating_sub(1);
    for (i, stage) in stages.iter_mut().enumerate() {
        let input = hidden
            .as_deref()
            .map_or(PartInput::Tokens, PartInput::Hidden);
        match (stage.run(step, input)?, i == last) {
            (StageOutput::Hidden(h), false) => hidden = Some(h),
            (StageOutput::Sampled(s), true) => return Ok(s),
            (_, is_last) => {
                let what = if is_last {
                    "hidden states where the last stage samples"
                } else {
                    "samples where hidden states go on"
                };
                return Err(EngineError::Execution(format!(
                    "stage {i} ({}) gave {what}",
                    stage.name()
                )));
            }
        }
    }
    Err(EngineError::Execution("a pipeline without stages".into()))
}

/// `n_layer` layers split into `parts` contiguous ranges as even as can be
/// (the earlier ones one layer longer).
pub fn even_split(n_layer: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n_layer.max(1));
    let (each, extra) = (n_layer / parts, n_layer % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = each + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_even_split_covers_every_layer_once() {
        assert_eq!(even_split(30, 3), vec![0..10, 10..20, 20..30]);
        assert_eq!(even_split(8, 3), vec![0..3, 3..6, 6..8]);
        assert_eq!(even_split(2, 5), vec![0..1, 1..2]);
        for n in 1..40 {
            for k in 1..8 {
                let parts = even_split(n, k);
                assert_eq!(parts.first().map(|r| r.start), Some(0));
                assert_eq!(parts.last().map(|r| r.end), Some(n));
                assert!(parts.windows(2).all(|w| w[0].end == w[1].start));
                assert!(parts.iter().all(|r| !r.is_empty()));
            }
        }
    }
}
