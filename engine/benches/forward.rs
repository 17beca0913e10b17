//! Forward-pass timing on the default model: prefill chunks and batched
//! decode steps of several sizes. Run with
//! `cargo bench -p engine --bench forward` (models fetched by `make models`);
//! `SYNOR_BENCH_MODEL=path.gguf` times another model (the shapes
//! `synor-genmodel` writes, say). A single sequence's decode step is also
//! put against the bandwidth limit, measured beside it.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use engine::RequestId;
use engine::executor::LocalExecutor;
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

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SYNOR_BENCH_MODEL") {
        return PathBuf::from(p);
    }
    std::env::var_os("SYNOR_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"))
        .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn chunk(seq: u64, start: usize, n: usize) -> SeqChunk {
    let first = seq as u32 * BLOCKS_PER_SEQ as u32;
    SeqChunk {
        seq: RequestId(seq),
        tokens: (0..n as u32).map(|i| 100 + i).collect(),
        start_pos: start,
        want_logits: true,
        block_table: (first..first + BLOCKS_PER_SEQ as u32).collect(),
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
    let prefill_sizes: &[usize] = if only_decode { &[] } else { &[1, 16, 128, 512] };
    for &n in prefill_sizes {
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
            against_bandwidth(ms, steps, &mut || {
                for step in 0..steps {
                    let batch = ModelBatch {
                        chunks: vec![chunk(0, PROMPT + step, 1)],
                    };
                    exec.logits(&batch).expect("decode");
                }
            });
        }
    }
}

/// One decode step against its bound, the weights read once at the
/// machine's read bandwidth, measured beside it: bandwidth, the decode
/// loop again, bandwidth, with the best bandwidth as the limit (the host's
/// moves from minute to minute, so only numbers taken together compare).
fn against_bandwidth(first_ms: f64, steps: usize, decode: &mut dyn FnMut()) {
    let bytes = weight_bytes(&model_path());
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let probe = BandwidthProbe::new(1 << 30);
    let before = probe.read_gbps(threads, 3);
    let t = Instant::now();
    decode();
    let again = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
    let after = probe.read_gbps(threads, 3);
    let best = before.max(after);
    let limit_ms = bytes as f64 / best / 1e6;
    let ms = first_ms.min(again);
    println!(
        "  weights read per token {:.0} MB; read bandwidth {before:.1} / {after:.1} GB/s \
         (before / after); limit {limit_ms:.1} ms/token; best step {ms:.1} ms = {:.0}% of the limit",
        bytes as f64 / 1e6,
        100.0 * limit_ms / ms
    );
}

/// Bytes of the weights a decode step reads: every tensor of the file
/// except the embedding table, which is read too when it doubles as the
/// output projection (no `output.weight`).
fn weight_bytes(path: &std::path::Path) -> u64 {
    let mut f = std::fs::File::open(path).expect("model file");
    let ct = gguf_file::Content::read(&mut f).expect("GGUF");
    let tied = !ct.tensor_infos.contains_key("output.weight");
    ct.tensor_infos
        .iter()
        .filter(|(name, _)| tied || name.as_str() != "token_embd.weight")
        .map(|(_, t)| {
            let d = t.ggml_dtype;
            (t.shape.elem_count() / d.block_size() * d.type_size()) as u64
        })
        .sum()
}
