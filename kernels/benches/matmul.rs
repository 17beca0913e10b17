//! Quantized matmul throughput on SmolLM2-135M's shapes, for each
//! instruction set and batch size. Run with
//! `cargo bench -p kernels --bench matmul`.

use std::time::Instant;

use kernels::cpu::{Isa, matmul_with};
use kernels::{QMatrix, QuantType};

fn main() {
    let shapes = [
        ("q/o 576x576", 576, 576),
        ("up 1536x576", 1536, 576),
        ("down 576x1536", 576, 1536),
        ("lm_head 49152x576", 49152, 576),
    ];
    for (ty, label) in [(QuantType::Q4_1, "Q4_1"), (QuantType::Q8_0, "Q8_0")] {
        for &(name, rows, cols) in &shapes {
            if ty == QuantType::Q8_0 && rows != 49152 {
                continue;
            }
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
                .collect();
            let w = QMatrix::quantize(ty, rows, cols, &w).expect("quantize");
            for m in [1usize, 16, 128] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
                    .collect();
                let mut out = vec![0.0; m * rows];
                for isa in Isa::all_supported() {
                    matmul_with(isa, &w, &x, m, &mut out).expect("warm-up");
                    let reps = (2_000_000_000 / (rows * cols * m)).clamp(2, 2000);
                    let t = Instant::now();
                    for _ in 0..reps {
                        matmul_with(isa, &w, &x, m, &mut out).expect("matmul");
                    }
                    let s = t.elapsed().as_secs_f64() / reps as f64;
                    let gmacs = (rows * cols * m) as f64 / s / 1e9;
                    println!(
                        "{label} {name:<18} m={m:<4} {isa:<11?} {:>9.3} ms  {gmacs:>7.1} GMAC/s",
                        s * 1e3
                    );
                }
            }
        }
    }
}
