//! The KV cache's dtype, f16 against Q8_0: what it costs in accuracy and
//! what it buys in speed. Run with `cargo bench -p engine --bench kv_cache`
//! (the default model; `SYNOR_BENCH_MODEL=path.gguf` for another).
//!
//! - Accuracy: a text (`SYNOR_KV_TEXT=file`, default the GPL-3 text Debian
//!   ships) teacher-forced through both caches, up to 4096 tokens:
//!   perplexity of each, the mean and largest KL divergence of Q8_0's
//!   next-token distribution from f16's, and how often both pick the same
//!   token (`perplexity --kl-divergence` in llama.cpp).
//! - Speed: 8 sequences whose caches hold 2048 positions; decode steps
//!   timed at several context lengths, f16 and Q8_0 alternating round by
//!   round so the host's noise falls on both alike.

mod common;

#[path = "../tests/common/kv_eval.rs"]
mod kv_eval;

use std::path::PathBuf;

use common::model_path;
use std::time::Instant;

use engine::RequestId;
use engine::executor::LocalExecutor;
use engine::kv_cache::{KvDtype, KvLayout};
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};

const BLOCK: usize = 16;
const SEQS: usize = 8;
/// Positions prefilled per sequence, and the contexts decode is timed at.
const FILLED: usize = 2048;
const CONTEXTS: [usize; 3] = [256, 1024, 2040];
const BLOCKS_PER_SEQ: usize = FILLED / BLOCK + 2;
const ROUNDS: usize = 6;
const STEPS_PER_ROUND: usize = 4;

fn main() {
    let model = model_path();
    accuracy(&model);
    speed(&model);
}

fn accuracy(model: &std::path::Path) {
    let path = std::env::var_os("SYNOR_KV_TEXT").map_or_else(
        || PathBuf::from("/usr/share/common-licenses/GPL-3"),
        PathBuf::from,
    );
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!(
            "accuracy: skipped, no text at {} (SYNOR_KV_TEXT=file)",
            path.display()
        );
        return;
    };
    let c = kv_eval::compare(model, &text, 4096, 256, [KvDtype::F16, KvDtype::Q8_0]);
    println!(
        "accuracy over {} tokens of {}: perplexity f16 {:.4}, q8_0 {:.4} ({:+.2}%); \
         KL(f16 || q8_0) mean {:.5} max {:.4} nats; same top token {:.2}%",
        c.tokens,
        path.display(),
        c.perplexity(0),
        c.perplexity(1),
        100.0 * (c.perplexity(1) / c.perplexity(0) - 1.0),
        c.kl,
        c.kl_max,
        100.0 * c.same_top1_share()
    );
}

fn chunk(seq: usize, start: usize, tokens: Vec<u32>) -> SeqChunk {
    let first = (seq * BLOCKS_PER_SEQ) as u32;
    SeqChunk {
        seq: RequestId(seq as u64),
        tokens,
        start_pos: start,
        want_logits: true,
        block_table: (first..first + BLOCKS_PER_SEQ as u32).collect(),
        swa_table: Vec::new(),
        draft: Vec::new(),
    }
}

/// An executor whose `SEQS` sequences hold `FILLED` positions each.
fn filled(model: &std::path::Path, dtype: KvDtype) -> LocalExecutor {
    let loaded = load_gguf(model, &Default::default()).expect("run `make models`");
    let layout = KvLayout {
        dtype,
        ..loaded.model.config.kv_layout(BLOCK, SEQS * BLOCKS_PER_SEQ)
    };
    let mut exec = LocalExecutor::new(loaded.model, layout).expect("executor");
    for seq in 0..SEQS {
        for start in (0..FILLED).step_by(512) {
            let tokens = (0..512)
                .map(|i| 100 + ((start + i) % 1000) as u32)
                .collect();
            let batch = ModelBatch {
                chunks: vec![chunk(seq, start, tokens)],
            };
            exec.logits(&batch).expect("prefill");
        }
    }
    exec
}

/// Milliseconds per decode step of every sequence at position `pos`.
fn decode_ms(exec: &mut LocalExecutor, pos: usize) -> f64 {
    let t = Instant::now();
    for s in 0..STEPS_PER_ROUND {
        let batch = ModelBatch {
            chunks: (0..SEQS).map(|q| chunk(q, pos + s, vec![200])).collect(),
        };
        exec.logits(&batch).expect("decode");
    }
    t.elapsed().as_secs_f64() * 1e3 / STEPS_PER_ROUND as f64
}

fn speed(model: &std::path::Path) {
    let t = Instant::now();
    let mut execs = [KvDtype::F16, KvDtype::Q8_0].map(|d| filled(model, d));
    println!(
        "speed: {SEQS} sequences, {FILLED} positions each cached ({:.0} s to fill both caches)",
        t.elapsed().as_secs_f64()
    );
    for ctx in CONTEXTS {
        let mut ms = [Vec::new(), Vec::new()];
        for _ in 0..ROUNDS {
            for (i, exec) in execs.iter_mut().enumerate() {
                ms[i].push(decode_ms(exec, ctx - STEPS_PER_ROUND));
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (f, q) = (median(&mut ms[0]), median(&mut ms[1]));
        println!(
            "decode {SEQS} seqs at context {ctx:>4}: f16 {f:7.1} ms/step, q8_0 {q:7.1} ms/step ({:+.0}%)",
            100.0 * (q / f - 1.0)
        );
    }
}
