//! A half-generated sequence moves between executors: its KV blocks are
//! exported from one executor, imported into another at other block ids,
//! and decoding continues there with the same tokens as if it had stayed,
//! greedy and seeded alike (draws depend on the seed and position only).

mod common;

use engine::RequestId;
use engine::executor::{Executor, LocalExecutor, Step};
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};
use engine::sampling::{RowSampling, SamplingSpec};
use engine::{SamplingParams, kv_cache::transfer::KvTransferError};

const BLOCK: usize = 16;

fn executor() -> LocalExecutor {
    let loaded =
        load_gguf(&common::model_path(common::SMOLLM2), &Default::default()).expect("load");
    let layout = loaded.model.config.kv_layout(BLOCK, 64);
    LocalExecutor::new(loaded.model, layout).expect("executor")
}

/// Runs `tokens` (from `start`) on `ex` over `table`, samples one token
/// at output position `position`.
fn step(
    ex: &mut LocalExecutor,
    spec: &SamplingSpec,
    table: &[u32],
    tokens: Vec<u32>,
    start: usize,
    position: u64,
) -> u32 {
    let batch = ModelBatch {
        chunks: vec![SeqChunk {
            seq: RequestId(1),
            tokens,
            start_pos: start,
            want_logits: true,
            block_table: table.to_vec(),
            swa_table: Vec::new(),
            draft: Vec::new(),
        }],
    };
    let sampling = RowSampling {
        spec,
        position,
        penalties: None,
        allowed: None,
    };
    let out = ex
        .execute(&Step {
            batch: &batch,
            sampling: vec![Some(sampling)],
        })
        .expect("step");
    out[0][0].0
}

/// Decodes `n` tokens after `seq` (whose last token is not yet computed).
fn decode(
    ex: &mut LocalExecutor,
    spec: &SamplingSpec,
    table: &[u32],
    seq: &mut Vec<u32>,
    prompt: usize,
    n: usize,
) {
    for _ in 0..n {
        let last = seq.len() - 1;
        let t = step(
            ex,
            spec,
            table,
            vec![seq[last]],
            last,
            (seq.len() - prompt) as u64,
        );
        seq.push(t);
    }
}

fn moved_continuation_matches(params: &SamplingParams) {
    let spec = SamplingSpec::new(params);
    let prompt: Vec<u32> = (0..37).map(|i| 300 + i * 11).collect();
    let (table_a, table_b): (Vec<u32>, Vec<u32>) = ((0..8).collect(), (40..48).collect());
    let mut a = executor();
    let mut seq = prompt.clone();
    let first = step(&mut a, &spec, &table_a, prompt.clone(), 0, 0);
    seq.push(first);
    decode(&mut a, &spec, &table_a, &mut seq, prompt.len(), 6);
    // Half-way: every computed position (all but the last token) moves.
    let used = (seq.len() - 1).div_ceil(BLOCK);
    let bytes = a.export_kv(&table_a[..used]).expect("export");
    let mut b = executor();
    b.import_kv(&table_b[..used], &bytes).expect("import");
    let mut stayed = seq.clone();
    decode(&mut a, &spec, &table_a, &mut stayed, prompt.len(), 10);
    let mut moved = seq.clone();
    decode(&mut b, &spec, &table_b, &mut moved, prompt.len(), 10);
    assert_eq!(moved, stayed, "the moved sequence went another way");
    // Damaged bytes are refused, and a foreign geometry too.
    let mut bad = bytes.clone();
    bad[100] ^= 0x10;
    assert_eq!(
        b.import_kv(&table_b[..used], &bad),
        Err(KvTransferError::Digest)
    );
}

#[test]
fn a_greedy_sequence_continues_the_same_on_another_executor() {
    moved_continuation_matches(&SamplingParams {
        temperature: 0.0,
        ..Default::default()
    });
}

#[test]
fn a_seeded_sequence_continues_the_same_on_another_executor() {
    moved_continuation_matches(&SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(42),
        ..Default::default()
    });
}
