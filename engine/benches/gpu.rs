//! The default model on a GPU backend: prefill tokens/s and decode
//! tokens/s at batch 1, 16 and 64, against the device's memory-bandwidth
//! limit (a decode step reads every weight once, so the limit is
//! bandwidth / weight bytes steps a second). Runs unchanged on any
//! adapter wgpu finds, or on a CUDA device:
//!
//!     cargo bench -p engine --features wgpu,cuda --bench gpu -- [wgpu|cuda:N] [GB/s]
//!
//! `SYNOR_BENCH_MODEL` names another GGUF (a `synor-genmodel` shape).
//! With `SYNOR_CUDA_PROFILE=1` the CUDA run adds one profiled decode step
//! at each batch size: its wall time, the kernels' GPU time by kernel, and
//! the launches, allocations and uploads it made.
//!
//! The optional number is the device's memory bandwidth (GB/s, from its
//! data sheet) for the limit column. On lavapipe (Mesa's CPU Vulkan) the
//! numbers measure correctness plumbing, not speed.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn main() {
    bench::run();
}

#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
fn main() {
    eprintln!("build with --features wgpu or cuda");
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod common;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod bench {
    use super::common::model_path;
    use std::time::Instant;

    use engine::RequestId;
    use engine::gguf::Gguf;
    use engine::model::llama::Llama;
    use engine::model::{ModelBatch, SeqChunk};
    use kernels::backend::Backend;

    const BLOCK: usize = 16;
    /// Blocks of each decoding sequence (its prompt and the steps).
    const DECODE_BLOCKS: usize = 9;
    /// Blocks of the prefill runs' sequence (512 positions).
    const PREFILL_BLOCKS: usize = 32;
    const MAX_BATCH: usize = 64;

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
            swa_table: Vec::new(),
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
        let args: Vec<String> = std::env::args().skip(1).collect();
        let gbps: Option<f64> = args.iter().find_map(|a| a.parse().ok());
        let device = args
            .iter()
            .find(|a| a.starts_with("cuda") || *a == "wgpu")
            .map_or("wgpu", String::as_str);
        match device.strip_prefix("cuda") {
            Some(n) => cuda(n.trim_start_matches(':').parse().unwrap_or(0), gbps),
            None => wgpu(gbps),
        }
    }

    #[cfg(feature = "wgpu")]
    fn wgpu(gbps: Option<f64>) {
        let backend = kernels::wgpu::WgpuBackend::new().expect("a wgpu adapter");
        let a = backend.adapter().clone();
        println!("adapter: {} ({}, {})", a.name, a.kind, a.driver);
        // A software adapter (lavapipe) gets short prompts and no 512-token
        // prefill: its numbers are about correctness, not speed.
        measure(backend, a.kind == "cpu", gbps, None);
    }

    #[cfg(not(feature = "wgpu"))]
    fn wgpu(_: Option<f64>) {
        eprintln!("build with --features wgpu");
    }

    #[cfg(feature = "cuda")]
    fn cuda(index: u32, gbps: Option<f64>) {
        let backend = kernels::cuda::CudaBackend::new(index).unwrap_or_else(|e| panic!("{e}"));
        let d = backend.device().clone();
        println!(
            "device: cuda:{index} {} (sm_{}{}, {:.0} GiB)",
            d.name,
            d.capability.0,
            d.capability.1,
            d.memory_bytes as f64 / (1u64 << 30) as f64
        );
        let probe = backend.clone();
        let report = move |step: Option<(&str, f64)>| {
            let Some(p) = probe.take_profile() else {
                return;
            };
            if let Some((label, wall)) = step {
                print_profile(label, wall, &p);
            }
        };
        // The backend says whether SYNOR_CUDA_PROFILE turned its profiler on.
        let profiling = backend.take_profile().is_some();
        measure(backend, false, gbps, profiling.then_some(&report));
    }

    #[cfg(feature = "cuda")]
    fn print_profile(label: &str, wall: f64, p: &kernels::cuda::Profile) {
        let gpu = p.gpu_ms();
        println!(
            "  profile, {label}: wall {:.2} ms, kernels {gpu:.2} ms on the GPU ({:.0}%), \
             {} launches, {} allocations, {} uploads",
            wall * 1e3,
            100.0 * gpu / (wall * 1e3),
            p.launches(),
            p.allocations,
            p.uploads
        );
        for k in &p.kernels {
            println!(
                "    {:<24} {:>5} launches {:>9.3} ms  {:>7.1} us each",
                k.name,
                k.launches,
                k.gpu_ms,
                1e3 * k.gpu_ms / k.launches as f64
            );
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_: u32, _: Option<f64>) {
        eprintln!("build with --features cuda");
    }

    /// Called with `None` to start a profiled step and with its label and
    /// wall seconds after it (see the module's header).
    type Report<'a> = &'a dyn Fn(Option<(&str, f64)>);

    fn measure<B: Backend>(backend: B, software: bool, gbps: Option<f64>, report: Option<Report>) {
        let path = model_path();
        let weight_bytes = std::fs::metadata(&path).map_or(0, |m| m.len()) as f64;
        let mut reader = std::io::BufReader::new(std::fs::File::open(&path).expect("make models"));
        let ct = Gguf::read(&mut reader).expect("gguf");
        let (prefills, prompt): (&[usize], usize) = if software {
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
            if let Some(report) = report {
                report(None);
                let t = Instant::now();
                model.forward(&b, &mut kv).expect("prefill");
                report(Some((&format!("prefill {n}"), t.elapsed().as_secs_f64())));
            }
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
            if let Some(report) = report {
                report(None);
                let t = Instant::now();
                model.forward(&step, &mut kv).expect("decode");
                report(Some((
                    &format!("decode batch {batch}"),
                    t.elapsed().as_secs_f64(),
                )));
            }
        }
    }
}
