//! The default model on the wgpu backend: prefill tokens/s and decode
//! tokens/s at batch 1, 16 and 64, against the device's memory-bandwidth
//! limit (a decode step reads every weight once, so the limit is
//! bandwidth / weight bytes steps a second). Runs unchanged on any
//! adapter wgpu finds:
//!
//!     cargo bench -p engine --features wgpu --bench gpu -- [GB/s]
//!
//! The optional argument is the device's memory bandwidth (GB/s, from its
//! data sheet) for the limit column. On lavapipe (Mesa's CPU Vulkan) the
//! numbers measure correctness plumbing, not speed.

#[cfg(feature = "wgpu")]
fn main() {
    bench::run();
}

#[cfg(not(feature = "wgpu"))]
fn main() {
    eprintln!("build with --features wgpu");
}

#[cfg(feature = "wgpu")]
mod bench {
    use std::path::PathBuf;
    use std::time::Instant;

    use candle_core::quantized::gguf_file;
    use engine::RequestId;
    use engine::model::llama::Llama;
    use engine::model::{ModelBatch, SeqChunk};
    use kernels::backend::Backend;
    use kernels::wgpu::WgpuBackend;

    const BLOCK: usize = 16;
    /// Blocks of each decoding sequence (its prompt and the steps).
    const DECODE_BLOCKS: usize = 9;
    /// Blocks of the prefill runs' sequence (512 positions).
    const PREFILL_BLOCKS: usize = 32;
    const MAX_BATCH: usize = 64;

    fn model_path() -> PathBuf {
        std::env::var_os("SYNOR_MODELS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"))
            .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
    }

    /// Sequence `seq`'s chunk; sequence `MAX_BATCH` is the prefill runs'.
    fn chunk(seq: usize, start: usize, n: usize) -> SeqChunk {
        let (first, len) = if seq == MAX_BATCH {
            (MAX_BATCH * DECODE_BLOCKS, PREFILL_BLOCKS)
        } else {
            (seq * DECODE_BLOCKS, DECODE_BLOCKS)
        };
        SeqChunk {
            seq: RequestId(seq as u64),
            tokens: (0..n as u32).map(|i| 100 + i).collect(),
            start_pos: start,
            want_logits: true,
            block_table: (first as u32..(first + len) as u32).collect(),
            draft: Vec::new(),
        }
    }

    /// Seconds a run takes: after a warm-up, the mean of three, or the
    /// warm-up alone when it took over two seconds (a software adapter).
    fn timed(mut f: impl FnMut()) -> f64 {
        let t = Instant::now();
        f();
        let warm = t.elapsed().as_secs_f64();
        if warm > 2.0 {
            return warm;
        }
        let reps = 3;
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() / reps as f64
    }

    pub fn run() {
        let path = model_path();
        let weight_bytes = std::fs::metadata(&path).map_or(0, |m| m.len()) as f64;
        let gbps: Option<f64> = std::env::args().skip(1).find_map(|a| a.parse().ok());
        let mut reader = std::io::BufReader::new(std::fs::File::open(&path).expect("make models"));
        let ct = gguf_file::Content::read(&mut reader).expect("gguf");
        let backend = WgpuBackend::new().expect("a wgpu adapter");
        let a = backend.adapter().clone();
        println!("adapter: {} ({}, {})", a.name, a.kind, a.driver);
        // A software adapter (lavapipe) gets short prompts and no 512-token
        // prefill: its numbers are about correctness, not speed.
        let (prefills, prompt): (&[usize], usize) = if a.kind == "cpu" {
            (&[128], 16)
        } else {
            (&[128, 512], 128)
        };
        let model = Llama::load_on(backend, &ct, &mut reader).expect("load");
        let blocks = MAX_BATCH * DECODE_BLOCKS + PREFILL_BLOCKS;
        let mut kv = model.backend().kv(model.config.kv_layout(BLOCK, blocks));
        for &n in prefills {
            let b = ModelBatch {
                chunks: vec![chunk(MAX_BATCH, 0, n)],
            };
            let s = timed(|| {
                model.forward(&b, &mut kv).expect("prefill");
            });
            println!(
                "prefill {n:>4} tokens: {:8.1} ms  {:8.1} tok/s",
                s * 1e3,
                n as f64 / s
            );
        }
        for batch in [1, 16, MAX_BATCH] {
            let prompts = ModelBatch {
                chunks: (0..batch).map(|q| chunk(q, 0, prompt)).collect(),
            };
            model.forward(&prompts, &mut kv).expect("prompts");
            let step = ModelBatch {
                chunks: (0..batch).map(|q| chunk(q, prompt, 1)).collect(),
            };
            let s = timed(|| {
                model.forward(&step, &mut kv).expect("decode");
            });
            let limit = gbps.map_or(String::new(), |g| {
                let steps = g * 1e9 / weight_bytes;
                format!("  limit {steps:.0} steps/s, at {:.0}%", 100.0 / s / steps)
            });
            println!(
                "decode batch {batch:>2} (context {prompt}): {:8.1} ms a step  {:8.1} tok/s{limit}",
                s * 1e3,
                batch as f64 / s
            );
        }
    }
}
