//! Forward-pass timing on the default model: prefill chunks and batched
//! decode steps of several sizes. Run with
//! `cargo bench -p engine --bench forward` (models fetched by `make models`);
//! `SYNOR_BENCH_MODEL=path.gguf` times another model (the shapes
//! `synor-genmodel` writes, say); `SYNOR_BENCH_PREFILL=128,512` and
//! `SYNOR_BENCH_SEQS=8,16` pick the prompt lengths and batch sizes (empty:
//! none). A single sequence's decode step is also put against the
//! bandwidth limit, measured beside it.

mod common;

use common::model_path;
use std::time::Instant;

use engine::RequestId;
use engine::executor::LocalExecutor;
use engine::gguf::Gguf;
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};
use kernels::cpu::membw::BandwidthProbe;

const BLOCK: usize = 16;
/// Prompt tokens before the decode steps (llama-batched-bench's `-npp 128`).
const PROMPT: usize = 128;
/// Decode steps timed with `-- decode`.
const DECODE_STEPS: usize = 128;
/// Blocks per sequence (enough for 1024 positions).
const BLOCKS_PER_SEQ: usize = 64;

fn chunk(seq: u64, start: usize, n: usize) -> SeqChunk {
    let first = seq as u32 * BLOCKS_PER_SEQ as u32;
    SeqChunk {
        seq: RequestId(seq),
        tokens: (0..n as u32).map(|i| 100 + i).collect(),
        start_pos: start,
        want_logits: true,
        block_table: (first..first + BLOCKS_PER_SEQ as u32).collect(),
        swa_table: Vec::new(),
        draft: Vec::new(),
    }
}

fn main() {
    let loaded = load_gguf(&model_path(), &Default::default()).expect("run `make models`");
    let layout = loaded.model.config.kv_layout(BLOCK, 32 * BLOCKS_PER_SEQ);
    let mut exec = LocalExecutor::new(loaded.model, layout).expect("executor");
    // `cargo bench --bench forward -- decode` runs only the decode part, 128
    // steps after 128-token prompts: the shape of llama-batched-bench's
    // `-npp 128 -ntg 128`.
    let only_decode = std::env::args().any(|a| a == "decode");
    // `SYNOR_BENCH_PREFILL=128,512` times only those prompt lengths.
    let prefill_sizes: Vec<usize> = match std::env::var("SYNOR_BENCH_PREFILL") {
        _ if only_decode => Vec::new(),
        Ok(v) => v.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => vec![1, 16, 128, 512],
    };
    for &n in &prefill_sizes {
        let batch = ModelBatch {
            chunks: vec![chunk(1, 0, n)],
        };
        exec.logits(&batch).expect("warm-up");
        let reps = 3;
        let t = Instant::now();
        for _ in 0..reps {
            exec.logits(&batch).expect("forward");
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
        println!(
            "prefill {n:>4} tokens: {ms:8.1} ms  ({:.0} tok/s)",
            n as f64 / ms * 1e3
        );
    }
    // `SYNOR_BENCH_SEQS=1,8` times only those batch sizes.
    let seqs_list: Vec<usize> = std::env::var("SYNOR_BENCH_SEQS").map_or_else(
        |_| vec![1, 4, 8, 16, 32],
        |v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
    );
    for seqs in seqs_list {
        let prefill = ModelBatch {
            chunks: (0..seqs as u64).map(|s| chunk(s, 0, PROMPT)).collect(),
        };
        exec.logits(&prefill).expect("prefill");
        let steps = if only_decode { DECODE_STEPS } else { 16 };
        let t = Instant::now();
        for step in 0..steps {
            let batch = ModelBatch {
                chunks: (0..seqs as u64)
                    .map(|s| chunk(s, PROMPT + step, 1))
                    .collect(),
            };
            exec.logits(&batch).expect("decode");
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!(
            "decode {seqs:>3} seqs: {ms:8.1} ms/step  ({:.0} tok/s aggregate)",
            seqs as f64 / ms * 1e3
        );
        if seqs == 1 {
            against_bandwidth(ms, &mut |step| {
                let batch = ModelBatch {
                    chunks: vec![chunk(0, PROMPT + step % DECODE_STEPS, 1)],
                };
                exec.logits(&batch).expect("decode");
            });
        }
    }
}

/// Rounds of the interleaved measurement, and decode steps per round.
const ROUNDS: usize = 24;
const STEPS_PER_ROUND: usize = 8;

/// One decode step against its bound, the weights read once at the
/// machine's read bandwidth, measured beside it. A shared host's bandwidth
/// moves from second to second (its two vCPUs land on different parts of
/// the memory system), so the two are interleaved finely: each round probes
/// the bandwidth (best of 3 reads of 256 MiB), then times a few steps, and
/// its ratio uses its own probe. The median round is reported, with the
/// spread.
fn against_bandwidth(first_ms: f64, decode: &mut dyn FnMut(usize)) {
    let bytes = weight_bytes(&model_path()) as f64;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let probe = BandwidthProbe::new(256 << 20);
    let mut rounds: Vec<(f64, f64)> = (0..ROUNDS)
        .map(|r| {
            let gbps = probe.read_gbps(threads, 3);
            let t = Instant::now();
            for s in 0..STEPS_PER_ROUND {
                decode(r * STEPS_PER_ROUND + s);
            }
            let ms = t.elapsed().as_secs_f64() * 1e3 / STEPS_PER_ROUND as f64;
            (gbps, ms)
        })
        .collect();
    let ratio = |&(gbps, ms): &(f64, f64)| bytes / gbps / 1e6 / ms;
    rounds.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let (gbps, ms) = rounds[ROUNDS / 2];
    let q = |i: usize| 100.0 * ratio(&rounds[i]);
    let (lo, hi) = rounds
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), r| (lo.min(r.0), hi.max(r.0)));
    println!(
        "  weights read per token {:.0} MB; {ROUNDS} rounds of (bandwidth, {STEPS_PER_ROUND} steps): \
         median round {ms:.1} ms/step at {gbps:.1} GB/s = {:.0}% of its limit ({:.1} ms); \
         quartiles {:.0}% / {:.0}%; bandwidth {lo:.1}-{hi:.1} GB/s; first loop {first_ms:.1} ms/step",
        bytes / 1e6,
        q(ROUNDS / 2),
        bytes / gbps / 1e6,
        q(ROUNDS / 4),
        q(3 * ROUNDS / 4),
    );
}

/// Bytes of the weights a decode step reads: every tensor of the file
/// except the embedding table, which is read too when it doubles as the
/// output projection (no `output.weight`).
fn weight_bytes(path: &std::path::Path) -> u64 {
    let mut f = std::fs::File::open(path).expect("model file");
    let ct = Gguf::read(&mut f).expect("GGUF");
    let tied = !ct.tensors.contains_key("output.weight");
    ct.tensors
        .iter()
        .filter(|(name, _)| tied || name.as_str() != "token_embd.weight")
        .map(|(_, t)| t.bytes() as u64)
        .sum()
}
