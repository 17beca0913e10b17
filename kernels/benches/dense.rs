//! f32 matmul throughput (`cpu::dense`, the weight packed once as at load)
//! on MiniLM's and a tiny model's shapes, against a plain parallel dot
//! product (the CPU backend's first dense path). Run with
//! `cargo bench -p kernels --bench dense`; `-- half`: a 1B model's
//! projection (2048x8192) streamed from memory in f32, f16 and bf16,
//! alternating (what an F16 or BF16 GGUF file's decode step reads).

use std::time::Instant;

use kernels::cpu::dense::{Packed, matmul_packed};
use rayon::prelude::*;

/// The baseline: one dot product per output, parallel over weight rows.
fn plain(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let mut out_t = vec![0.0f32; n * m];
    out_t.par_chunks_mut(m).enumerate().for_each(|(r, o)| {
        let wr = &w[r * k..(r + 1) * k];
        for (i, o) in o.iter_mut().enumerate() {
            *o = wr
                .iter()
                .zip(&x[i * k..(i + 1) * k])
                .map(|(a, b)| a * b)
                .sum();
        }
    });
    let mut out = vec![0.0f32; m * n];
    for r in 0..n {
        for i in 0..m {
            out[i * n + r] = out_t[r * m + i];
        }
    }
    out
}

fn time(reps: usize, f: &dyn Fn() -> Vec<f32>) -> f64 {
    std::hint::black_box(f());
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    t.elapsed().as_secs_f64() / reps as f64
}

/// The 1B `down` projection in f32, f16 and bf16, copies past the LLC
/// cycled, the three alternating: best of five (ms and GB/s of weights).
fn half() {
    let (n, k) = (2048, 8192);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
        .collect();
    let f16: Vec<u16> = w
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let bf16: Vec<u16> = w
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let copies = 8;
    let sets: Vec<(&str, Vec<Packed>)> = vec![
        ("f32", vec![Packed::new(&w, n, k); copies]),
        ("f16", vec![Packed::new_half(&f16, false, n, k); copies]),
        ("bf16", vec![Packed::new_half(&bf16, true, n, k); copies]),
    ];
    for m in [1usize, 8] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
            .collect();
        let mut best = vec![f64::MAX; sets.len()];
        for _ in 0..5 {
            for (b, (_, ws)) in best.iter_mut().zip(&sets) {
                let t = Instant::now();
                for p in ws {
                    std::hint::black_box(matmul_packed(p, &x, m));
                }
                *b = b.min(t.elapsed().as_secs_f64() / copies as f64);
            }
        }
        let cells: Vec<String> = sets
            .iter()
            .zip(&best)
            .map(|((name, ws), s)| {
                let gbs = ws[0].bytes() as f64 / s / 1e9;
                format!("{name} {:7.3} ms {gbs:5.1} GB/s", s * 1e3)
            })
            .collect();
        println!("1b down 2048x8192 m={m}: {}", cells.join(" | "));
    }
}

fn main() {
    if std::env::args().any(|a| a == "half") {
        half();
        return;
    }
    let shapes = [
        ("minilm qkv 1152x384", 1152, 384),
        ("minilm up 1536x384", 1536, 384),
        ("minilm down 384x1536", 384, 1536),
        ("tiny lm_head 32000x16", 32000, 16),
    ];
    for &(name, n, k) in &shapes {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
            .collect();
        let packed = Packed::new(&w, n, k);
        for m in [1usize, 16, 64, 256] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
                .collect();
            let reps = (1_000_000_000 / (n * k * m)).clamp(2, 500);
            let old = time(reps, &|| plain(&w, n, k, &x, m));
            let new = time(reps, &|| matmul_packed(&packed, &x, m));
            let g = |s: f64| (n * k * m) as f64 / s / 1e9;
            println!(
                "{name:24} m={m:3}: plain {:7.3} ms ({:5.1} GMAC/s), packed {:7.3} ms ({:5.1} GMAC/s)",
                old * 1e3,
                g(old),
                new * 1e3,
                g(new)
            );
        }
    }
}
