//! The executor seam, in the vLLM v1 worker shape: the engine core sends a
//! step (the scheduled chunks over their KV blocks, and how to sample each
//! sequence) and gets back sampled token ids (with log-probabilities when
//! asked), never logits, so a remote or GPU executor ships a few bytes per
//! token. Sampling is a pure function of what the step carries (see
//! `sampling`), so any executor continues a sequence the same way, and a
//! sequence's KV blocks can be exported from one executor and imported
//! into another (`kv_cache::transfer`).

use kernels::cpu::backend::CpuBackend;

use crate::error::{EngineError, Result};
use crate::kv_cache::transfer::{self, KvRows, KvTransferError};
use crate::kv_cache::{KvLayout, KvStorage};
use crate::model::ModelBatch;
use crate::model::llama::Llama;
use crate::request::RequestId;
use crate::sampling::{RowSampling, Sampled, sample_chunk};

/// One step as an executor sees it.
#[derive(Debug)]
pub struct Step<'a> {
    pub batch: &'a ModelBatch,
    /// One entry per chunk of the batch: how to sample its rows (`None`
    /// for chunks that produce no logits).
    pub sampling: Vec<Option<RowSampling<'a>>>,
}

/// A sequence's block tables: `full` for every layer, or with `swa`
/// non-empty, for the full-attention layers only (`SeqChunk::swa_table`).
#[derive(Debug, Clone, Copy)]
pub struct Tables<'a> {
    pub full: &'a [u32],
    pub swa: &'a [u32],
}

impl<'a> Tables<'a> {
    /// One table for every layer.
    pub fn plain(full: &'a [u32]) -> Self {
        Self { full, swa: &[] }
    }

    /// The tables of a chunk.
    pub fn of(chunk: &'a crate::model::SeqChunk) -> Self {
        Self {
            full: &chunk.block_table,
            swa: &chunk.swa_table,
        }
    }
}

/// Runs model steps for the engine core.
pub trait Executor: Send {
    /// A short name for usage records and logs (`cpu`, `wgpu:0`, a
    /// worker's id).
    fn name(&self) -> String;
    /// The geometry of this executor's KV memory (the engine sizes its
    /// block tables from it).
    fn kv_layout(&self) -> KvLayout;
    /// Bytes of KV memory held: every layer's pool of blocks
    /// (`KvLayout::layer_blocks`) unless the executor allocates blocks as
    /// they are first written.
    fn kv_bytes(&self) -> usize {
        let l = self.kv_layout();
        let per_token = KvLayout::bytes_per_token(1, l.n_kv_head, l.head_dim, l.dtype);
        l.layer_blocks() * l.block_size * per_token
    }
    /// The longest sequence this executor computes correctly, where that
    /// is less than its KV holds (a software GPU adapter's attention
    /// shader); the engine serves no longer context.
    fn max_positions(&self) -> Option<usize> {
        None
    }
    /// Runs one step; returns, per chunk of the batch, the tokens sampled
    /// for it in order (empty for chunks without logits; with drafts, the
    /// accepted drafts then the correction).
    fn execute(&mut self, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>>;
    /// Forgets a finished sequence (remote executors drop its state; the
    /// local one keeps nothing per sequence beyond the shared blocks).
    fn release(&mut self, seq: RequestId);
    /// The KV of `blocks`, as checksummed bytes (an executor that keeps
    /// no KV of its own says `NotKv`).
    fn export_kv(&self, _blocks: &[u32]) -> std::result::Result<Vec<u8>, KvTransferError> {
        Err(KvTransferError::NotKv)
    }
    /// Writes exported KV into `blocks` (the same count), after checking
    /// the bytes; refused bytes change nothing.
    fn import_kv(
        &mut self,
        _blocks: &[u32],
        _bytes: &[u8],
    ) -> std::result::Result<(), KvTransferError> {
        Err(KvTransferError::NotKv)
    }
    /// The forward pass alone: one logits row per row the batch asks for
    /// (scoring a continuation); an executor that cannot says so.
    fn logits(&mut self, _batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        Err(EngineError::Execution(format!(
            "executor {} cannot score",
            self.name()
        )))
    }
    /// The KV of positions `first..first + count` of the sequence over
    /// `tables` (an executor that cannot read its KV says `NotKv`); rows
    /// a sliding layer released read as zeros.
    fn read_rows(
        &self,
        _tables: Tables<'_>,
        _first: usize,
        _count: usize,
    ) -> std::result::Result<KvRows, KvTransferError> {
        Err(KvTransferError::NotKv)
    }
    /// Writes `rows` from position `from` on into the blocks of `tables`
    /// (skipping rows a sliding layer released).
    fn write_rows(
        &mut self,
        _tables: Tables<'_>,
        _rows: &KvRows,
        _from: usize,
    ) -> std::result::Result<(), KvTransferError> {
        Err(KvTransferError::NotKv)
    }
}

/// The in-process CPU executor: the model, the paged KV memory, and a
/// thread pool the whole step runs in (so the step's own thread is one of
/// the workers and the many short parallel regions of a decode step do not
/// each wake a sleeping pool).
#[derive(Debug)]
pub struct LocalExecutor {
    model: Llama,
    kv: KvStorage,
    pool: Compute,
}

impl LocalExecutor {
    pub fn new(model: Llama, layout: KvLayout) -> Result<Self> {
        Ok(Self {
            model,
            kv: KvStorage::new(layout),
            pool: compute_pool()?,
        })
    }

    /// The forward pass alone: one logits row per row the batch asks for,
    /// in batch order (tests and benchmarks compare these).
    pub fn logits(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        let Self { model, kv, pool } = self;
        pool.install(|| model.forward(batch, kv))
    }
}

/// Where a step's parallel regions run: a thread pool over every core, or
/// in WebAssembly (a browser tab, no threads) none: rayon's global pool,
/// which is the caller's thread alone there, shared by every engine the
/// tab loads (a pool of its own would claim the thread for good).
#[derive(Debug)]
pub(crate) struct Compute(Option<rayon::ThreadPool>);

impl Compute {
    /// Runs `f` where the step's parallel regions belong.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.0 {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

/// The compute threads (`Compute`).
pub(crate) fn compute_pool() -> Result<Compute> {
    if cfg!(target_family = "wasm") {
        return Ok(Compute(None));
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("synor-compute-{i}"))
        .build()
        .map(|pool| Compute(Some(pool)))
        .map_err(|e| EngineError::Load(format!("compute threads: {e}")))
}

/// Samples each chunk's rows of a forward pass's `logits`.
pub fn sample_step(step: &Step<'_>, logits: &[Vec<f32>]) -> Vec<Vec<Sampled>> {
    step_rows(step, logits)
        .into_iter()
        .map(|(sampling, rows, draft)| sample_rows(sampling, rows, draft))
        .collect()
}

/// `sample_step` with the sequences sampled in parallel on the current
/// rayon pool when more than one draws at random (a draw over a 128k
/// vocabulary costs a few hundred microseconds, against a greedy pick's
/// tens; the results are the same either way).
pub fn sample_step_parallel(step: &Step<'_>, logits: &[Vec<f32>]) -> Vec<Vec<Sampled>> {
    use rayon::prelude::*;
    let random = step
        .sampling
        .iter()
        .flatten()
        .filter(|s| !s.spec.greedy())
        .count();
    if random < 2 {
        return sample_step(step, logits);
    }
    step_rows(step, logits)
        .into_par_iter()
        .map(|(sampling, rows, draft)| sample_rows(sampling, rows, draft))
        .collect()
}

/// One chunk's sampling, its logits rows and its draft.
type ChunkRows<'s, 'l> = (Option<&'s RowSampling<'s>>, Vec<&'l [f32]>, &'s [u32]);

/// Each chunk with its own rows of `logits`.
fn step_rows<'s, 'l>(step: &'s Step<'s>, logits: &'l [Vec<f32>]) -> Vec<ChunkRows<'s, 'l>> {
    let mut rows = logits.iter();
    step.batch
        .chunks
        .iter()
        .zip(&step.sampling)
        .map(|(chunk, sampling)| {
            // Collected first: verification may stop early, and the next
            // chunk's rows must still start after all of this one's.
            let chunk_rows: Vec<&[f32]> = rows
                .by_ref()
                .take(chunk.num_logits())
                .map(Vec::as_slice)
                .collect();
            (sampling.as_ref(), chunk_rows, chunk.draft.as_slice())
        })
        .collect()
}

fn sample_rows(
    sampling: Option<&RowSampling<'_>>,
    rows: Vec<&[f32]>,
    draft: &[u32],
) -> Vec<Sampled> {
    match sampling {
        Some(s) => sample_chunk(s, rows, draft),
        None => Vec::new(),
    }
}

impl Executor for LocalExecutor {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn kv_layout(&self) -> KvLayout {
        self.kv.layout
    }

    fn kv_bytes(&self) -> usize {
        self.kv.allocated_bytes()
    }

    fn execute(&mut self, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>> {
        let logits = self.logits(step.batch)?;
        Ok(self.pool.install(|| sample_step_parallel(step, &logits)))
    }

    fn release(&mut self, _seq: RequestId) {}

    fn logits(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<f32>>> {
        LocalExecutor::logits(self, batch)
    }

    fn export_kv(&self, blocks: &[u32]) -> std::result::Result<Vec<u8>, KvTransferError> {
        transfer::export(&self.kv, blocks)
    }

    fn import_kv(
        &mut self,
        blocks: &[u32],
        bytes: &[u8],
    ) -> std::result::Result<(), KvTransferError> {
        transfer::import(&mut self.kv, blocks, bytes)
    }

    fn read_rows(
        &self,
        t: Tables<'_>,
        first: usize,
        count: usize,
    ) -> std::result::Result<KvRows, KvTransferError> {
        let tables = self.model.config.layer_tables(t.full, t.swa);
        transfer::read_rows_on(&CpuBackend, &self.kv, &tables, first, count)
    }

    fn write_rows(
        &mut self,
        t: Tables<'_>,
        rows: &KvRows,
        from: usize,
    ) -> std::result::Result<(), KvTransferError> {
        let tables = self.model.config.layer_tables(t.full, t.swa);
        transfer::write_rows_on(&CpuBackend, &mut self.kv, &tables, rows, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SeqChunk;
    use crate::request::SamplingParams;
    use crate::sampling::SamplingSpec;

    fn chunk(seq: u64, draft: Vec<u32>) -> SeqChunk {
        SeqChunk {
            seq: RequestId(seq),
            tokens: std::iter::once(1).chain(draft.iter().copied()).collect(),
            start_pos: 4,
            want_logits: true,
            block_table: vec![0],
            swa_table: Vec::new(),
            draft,
        }
    }

    /// A row whose argmax is `t`.
    fn row(t: usize) -> Vec<f32> {
        let mut r = vec![0.0; 8];
        r[t] = 5.0;
        r
    }

    #[test]
    fn a_rejected_draft_leaves_the_next_chunks_rows_in_place() {
        let greedy = SamplingSpec::new(&SamplingParams {
            temperature: 0.0,
            ..Default::default()
        });
        let batch = ModelBatch {
            chunks: vec![chunk(1, vec![6, 6, 6]), chunk(2, Vec::new())],
        };
        let s = RowSampling {
            spec: &greedy,
            position: 0,
            penalties: None,
            allowed: None,
        };
        let step = Step {
            batch: &batch,
            sampling: vec![Some(s), Some(s)],
        };
        // The first chunk's first row already rejects its draft (2 != 6).
        let logits = vec![row(2), row(6), row(6), row(6), row(5)];
        let out = sample_step(&step, &logits);
        let ids: Vec<Vec<u32>> = out
            .iter()
            .map(|c| c.iter().map(|t| t.0).collect())
            .collect();
        assert_eq!(ids, vec![vec![2], vec![5]]);
    }

    #[test]
    fn sampling_in_parallel_gives_what_sampling_in_turn_gives() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let specs: Vec<SamplingSpec> = (0..6u64)
            .map(|i| {
                SamplingSpec::new(&SamplingParams {
                    temperature: [0.0, 0.7, 1.0][i as usize % 3],
                    top_p: [1.0, 0.9][i as usize % 2],
                    seed: Some(i),
                    ..Default::default()
                })
            })
            .collect();
        let drafts = [vec![], vec![3, 1], vec![], vec![2], vec![], vec![7, 7]];
        let batch = ModelBatch {
            chunks: (0..6u64)
                .map(|i| chunk(i, drafts[i as usize].clone()))
                .collect(),
        };
        let step = Step {
            batch: &batch,
            sampling: specs
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    (i != 4).then_some(RowSampling {
                        spec,
                        position: i as u64,
                        penalties: None,
                        allowed: None,
                    })
                })
                .collect(),
        };
        let rows: usize = batch.chunks.iter().map(SeqChunk::num_logits).sum();
        let logits: Vec<Vec<f32>> = (0..rows)
            .map(|_| (0..64).map(|_| rng.random::<f32>() * 4.0).collect())
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        let ids = |out: Vec<Vec<Sampled>>| -> Vec<Vec<u32>> {
            out.iter()
                .map(|c| c.iter().map(|t| t.0).collect())
                .collect()
        };
        let parallel = ids(pool.install(|| sample_step_parallel(&step, &logits)));
        assert_eq!(parallel, ids(sample_step(&step, &logits)));
        assert!(
            parallel[4].is_empty(),
            "a chunk without sampling draws nothing"
        );
    }
}
