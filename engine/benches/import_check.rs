//! What checking imported KV costs the decode worker (`import_check`):
//! the recomputation of its four random positions against the prefill
//! the import saves, at several prompt lengths. Run with
//! `cargo bench -p engine --bench import_check` (the default model;
//! `SYNOR_BENCH_MODEL=path.gguf` for another). Prefill and check
//! alternate round by round so the host's noise falls on both alike.

mod common;

use std::time::{Duration, Instant};

use engine::RequestId;
use engine::executor::{Executor, LocalExecutor, Tables};
use engine::import_check::{POSITIONS, pick, verify};
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};

const BLOCK: usize = 16;
const LENGTHS: [usize; 3] = [128, 512, 2048];
const CHUNK: usize = 512;
const ROUNDS: usize = 5;

fn main() {
    let loaded = load_gguf(&common::model_path(), &Default::default()).expect("load");
    let blocks = 2 * (LENGTHS[2] / BLOCK + 1);
    let layout = loaded.model.config.kv_layout(BLOCK, blocks);
    let mut ex = LocalExecutor::new(loaded.model, layout).expect("executor");
    println!("import check: {POSITIONS} positions recomputed; best of {ROUNDS} rounds");
    for len in LENGTHS {
        let tokens: Vec<u32> = (0..len as u32).map(|i| 300 + (i * 7) % 4000).collect();
        let a: Vec<u32> = (0..(len / BLOCK + 1) as u32).collect();
        let b: Vec<u32> = a.iter().map(|x| x + a.len() as u32).collect();
        let (mut prefill, mut check) = (Duration::MAX, Duration::MAX);
        for _ in 0..ROUNDS {
            let t = Instant::now();
            run_prefill(&mut ex, &a, &tokens);
            prefill = prefill.min(t.elapsed());
            let rows = ex.read_rows(Tables::plain(&a), 0, len - 1).expect("rows");
            ex.write_rows(Tables::plain(&b), &rows, 0).expect("write");
            let picks = pick(0, len - 1, POSITIONS);
            let t = Instant::now();
            verify(&mut ex, Tables::plain(&b), &tokens, &rows, &picks).expect("honest rows pass");
            check = check.min(t.elapsed());
        }
        println!(
            "  prompt {len:>5}: prefill {:>8.1} ms, check {:>6.1} ms ({:.2}% of the prefill it saves)",
            ms(prefill),
            ms(check),
            100.0 * ms(check) / ms(prefill)
        );
    }
}

fn run_prefill(ex: &mut LocalExecutor, table: &[u32], tokens: &[u32]) {
    for start in (0..tokens.len()).step_by(CHUNK) {
        let end = (start + CHUNK).min(tokens.len());
        let batch = ModelBatch {
            chunks: vec![SeqChunk {
                seq: RequestId(1),
                tokens: tokens[start..end].to_vec(),
                start_pos: start,
                want_logits: end == tokens.len(),
                block_table: table.to_vec(),
                swa_table: Vec::new(),
                draft: Vec::new(),
            }],
        };
        ex.logits(&batch).expect("prefill");
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
