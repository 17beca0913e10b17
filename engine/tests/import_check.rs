//! The check of imported KV (`import_check`) on the real model: rows an
//! honest executor computed pass at every position, with a wide margin
//! under the tolerance, whatever the chunking; forgeries of every kind a
//! prefill worker could send (random bytes, zeros, another prompt's rows,
//! one deep layer, one position) fail when a forged position is picked.

mod common;

use engine::RequestId;
use engine::executor::{Executor, LocalExecutor, Tables};
use engine::import_check::{ImportCheckError, TOLERANCE, verify};
use engine::kv_cache::transfer::KvRows;
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};
use rand::{Rng, SeedableRng, rngs::StdRng};

const BLOCK: usize = 16;
const LEN: usize = 80;

fn executor() -> LocalExecutor {
    let loaded =
        load_gguf(&common::model_path(common::SMOLLM2), &Default::default()).expect("load");
    let layout = loaded.model.config.kv_layout(BLOCK, 64);
    LocalExecutor::new(loaded.model, layout).expect("executor")
}

fn prompt(seed: u32) -> Vec<u32> {
    (0..LEN as u32)
        .map(|i| 300 + (i * 7 + seed * 13) % 4000)
        .collect()
}

/// Prefills `tokens` over `table` in chunks of `chunk` tokens.
fn prefill(ex: &mut LocalExecutor, table: &[u32], tokens: &[u32], chunk: usize) {
    for start in (0..tokens.len()).step_by(chunk) {
        let end = (start + chunk).min(tokens.len());
        let batch = ModelBatch {
            chunks: vec![SeqChunk {
                seq: RequestId(1),
                tokens: tokens[start..end].to_vec(),
                start_pos: start,
                want_logits: true,
                block_table: table.to_vec(),
                swa_table: Vec::new(),
                draft: Vec::new(),
            }],
        };
        ex.logits(&batch).expect("prefill");
    }
}

/// Rows of `tokens` as an honest executor computes them.
fn honest(ex: &mut LocalExecutor, tokens: &[u32], chunk: usize) -> KvRows {
    let table: Vec<u32> = (0..5).collect();
    prefill(ex, &table, tokens, chunk);
    ex.read_rows(Tables::plain(&table), 0, LEN).expect("read")
}

/// Writes `rows` into fresh blocks and checks `positions` of them.
fn check(
    ex: &mut LocalExecutor,
    tokens: &[u32],
    rows: &KvRows,
    positions: &[usize],
) -> Result<f32, ImportCheckError> {
    let table: Vec<u32> = (10..15).collect();
    ex.write_rows(Tables::plain(&table), rows, 0)
        .expect("write");
    verify(ex, Tables::plain(&table), tokens, rows, positions)
}

#[test]
fn honest_rows_pass_everywhere_with_a_margin_and_forgeries_fail() {
    let mut ex = executor();
    let tokens = prompt(0);
    let all: Vec<usize> = (0..LEN).collect();
    // Computed in one chunk, checked one position at a time over them.
    let rows = honest(&mut ex, &tokens, LEN);
    let worst = check(&mut ex, &tokens, &rows, &all).expect("honest rows pass");
    // Computed in other chunks: another order of sums.
    let rows7 = honest(&mut ex, &tokens, 7);
    let worst7 = check(&mut ex, &tokens, &rows7, &all).expect("honest rows pass");
    eprintln!(
        "honest relative error: {worst:.5} (one chunk), {worst7:.5} (chunks of 7); tolerance {TOLERANCE}"
    );
    assert!(worst.max(worst7) < TOLERANCE / 5.0, "{worst} {worst7}");

    let mut rng = StdRng::seed_from_u64(41);
    let mut forgeries: Vec<(&str, KvRows)> = Vec::new();
    let mut random = rows.clone();
    random.layers.iter_mut().for_each(|l| rng.fill(&mut l[..]));
    forgeries.push(("random bytes", random));
    let mut zeros = rows.clone();
    zeros.layers.iter_mut().for_each(|l| l.fill(0));
    forgeries.push(("zeros", zeros));
    forgeries.push(("another prompt's rows", honest(&mut ex, &prompt(1), LEN)));
    let mut deep = rows.clone();
    let last = deep.layers.len() - 1;
    let (a, b) = deep.layers[last].split_at_mut(LEN * 3 * 64 * 2);
    a.swap_with_slice(b);
    forgeries.push(("keys and values of the last layer swapped", deep));
    for (what, forged) in &forgeries {
        for p in [0, 33, LEN - 1] {
            let got = check(&mut ex, &tokens, forged, &[p]);
            assert!(
                matches!(got, Err(ImportCheckError::Mismatch { .. })),
                "{what} at {p}: {got:?}"
            );
        }
    }
    // One forged position: caught where it is picked, not elsewhere.
    let mut one = rows.clone();
    for l in &mut one.layers {
        let at = 50 * 3 * 64 * 2;
        l[at..at + 64]
            .iter_mut()
            .for_each(|b| *b = b.wrapping_add(0x11));
    }
    assert!(check(&mut ex, &tokens, &one, &[50]).is_err());
    assert!(check(&mut ex, &tokens, &one, &[10, 20]).is_ok());
}
