//! Quantized matmul throughput on SmolLM2-135M's shapes, for each
//! instruction set and batch size, and on Llama-3.2-1B's (Q4_0) with the
//! weight bytes streamed per second: at m=1 a matmul is bound by memory
//! bandwidth, so GB/s against the machine's read bandwidth says how close
//! a decode step is to its limit. Run with
//! `cargo bench -p kernels --bench matmul` (`-- 1b`: the 1B shapes only;
//! `-- bandwidth`: the machine's read bandwidth with 1 and 2 threads, the
//! bound of a decode step: bytes of weights / bandwidth).

use std::time::Instant;

use kernels::cpu::{Isa, matmul_with};
use kernels::{QMatrix, QuantType};

const SMOL: [(&str, usize, usize); 4] = [
    ("q/o 576x576", 576, 576),
    ("up 1536x576", 1536, 576),
    ("down 576x1536", 576, 1536),
    ("lm_head 49152x576", 49152, 576),
];

const LLAMA_1B: [(&str, usize, usize); 3] = [
    ("1b gate+up 16384x2048", 16384, 2048),
    ("1b down 2048x8192", 2048, 8192),
    ("1b lm_head 128256x2048", 128_256, 2048),
];

fn main() {
    if std::env::args().any(|a| a == "bandwidth") {
        bandwidth();
        return;
    }
    let only_1b = std::env::args().any(|a| a == "1b");
    if !only_1b {
        for (ty, label) in [(QuantType::Q4_1, "Q4_1"), (QuantType::Q8_0, "Q8_0")] {
            for &(name, rows, cols) in &SMOL {
                if ty == QuantType::Q8_0 && rows != 49152 {
                    continue;
                }
                run(
                    ty,
                    label,
                    name,
                    rows,
                    cols,
                    &[1, 16, 128],
                    &Isa::all_supported(),
                );
            }
        }
    }
    for &(name, rows, cols) in &LLAMA_1B {
        run(
            QuantType::Q4_0,
            "Q4_0",
            name,
            rows,
            cols,
            &[1, 8],
            &[Isa::detect()],
        );
    }
}

fn run(
    ty: QuantType,
    label: &str,
    name: &str,
    rows: usize,
    cols: usize,
    ms: &[usize],
    isas: &[Isa],
) {
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
        .collect();
    let w = QMatrix::quantize(ty, rows, cols, &w).expect("quantize");
    let bytes = w.data_len() as f64;
    for &m in ms {
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
            .collect();
        let mut out = vec![0.0; m * rows];
        for &isa in isas {
            matmul_with(isa, &w, &x, m, &mut out).expect("warm-up");
            let reps = (2_000_000_000 / (rows * cols * m)).clamp(4, 2000);
            let t = Instant::now();
            for _ in 0..reps {
                matmul_with(isa, &w, &x, m, &mut out).expect("matmul");
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            let gmacs = (rows * cols * m) as f64 / s / 1e9;
            println!(
                "{label} {name:<22} m={m:<4} {isa:<11?} {:>9.3} ms  {gmacs:>7.1} GMAC/s  {:>5.1} GB/s of weights",
                s * 1e3,
                bytes / s / 1e9
            );
        }
    }
}

/// Best of five passes summing a 1 GiB buffer, split over 1 and 2 threads
/// (512-bit loads where the CPU has them, like the kernels).
fn bandwidth() {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    for threads in [1usize, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            let sum: u64 = pool.install(|| {
                use rayon::prelude::*;
                buf.par_chunks(words / threads)
                    .map(sum_words)
                    .reduce(|| 0, u64::wrapping_add)
            });
            best = best.min(t.elapsed().as_secs_f64());
            std::hint::black_box(sum);
        }
        println!(
            "read bandwidth, {threads} thread(s): {:.1} GB/s",
            (words * 8) as f64 / best / 1e9
        );
    }
}

fn sum_words(c: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above).
        #[allow(unsafe_code)]
        return unsafe { sum_avx512(c) };
    }
    c.iter().fold(0u64, |s, x| s.wrapping_add(*x))
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(c: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut blocks = c.chunks_exact(32);
    for b in &mut blocks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `b` holds 32 words, so words 8k..8k + 8 are in bounds.
            let v = unsafe { _mm512_loadu_si512(b.as_ptr().add(8 * k).cast()) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let total = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    let tail = blocks
        .remainder()
        .iter()
        .fold(0u64, |s, x| s.wrapping_add(*x));
    (_mm512_reduce_add_epi64(total) as u64).wrapping_add(tail)
}
