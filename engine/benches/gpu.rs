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
    const BLOCKS_PER_SEQ: usize = 16;
    const PROMPT: usize = 128;

    fn model_path() -> PathBuf {
        std::env::var_os("SYNOR_MODELS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"))
            .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
    }

    fn chunk(seq: usize, start: usize, n: usize) -> SeqChunk {
        let first = (seq * BLOCKS_PER_SEQ) as u32;
        SeqChunk {
            seq: RequestId(seq as u64),
            tokens: (0..n as u32).map(|i| 100 + i).collect(),
            start_pos: start,
            want_logits: true,
            block_table: (first..first + BLOCKS_PER_SEQ as u32).collect(),
            draft: Vec::new(),
        }
    }

    fn timed(f: impl FnMut()) -> f64 {
        let mut f = f;
        f();
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
        let model = Llama::load_on(backend, &ct, &mut reader).expect("load");
        let mut kv = model
            .backend()
            .kv(model.config.kv_layout(BLOCK, 64 * BLOCKS_PER_SEQ));
        for n in [128, 512] {
            let s = timed(|| {
                let b = ModelBatch {
                    chunks: vec![chunk(0, 0, n)],
                };
                model.forward(&b, &mut kv).expect("prefill");
            });
            println!(
                "prefill {n:>4} tokens: {:8.1} ms  {:8.0} tok/s",
                s * 1e3,
                n as f64 / s
            );
        }
        for batch in [1, 16, 64] {
            let prompts = ModelBatch {
                chunks: (0..batch).map(|q| chunk(q, 0, PROMPT)).collect(),
            };
            model.forward(&prompts, &mut kv).expect("prompts");
            let step = ModelBatch {
                chunks: (0..batch).map(|q| chunk(q, PROMPT, 1)).collect(),
            };
            let s = timed(|| {
                model.forward(&step, &mut kv).expect("decode");
            });
            let limit = gbps.map_or(String::new(), |g| {
                let steps = g * 1e9 / weight_bytes;
                format!("  limit {:.0} steps/s, at {:.0}%", steps, 100.0 / s / steps)
            });
            println!(
                "decode batch {batch:>2}: {:8.1} ms a step  {:8.0} tok/s{limit}",
                s * 1e3,
                batch as f64 / s
            );
        }
    }
}
