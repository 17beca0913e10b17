//! Quantized matmul throughput on SmolLM2-135M's shapes, for each
//! instruction set and batch size, and on Llama-3.2-1B's (Q4_0) with the
//! weight bytes streamed per second: at m=1 a matmul is bound by memory
//! bandwidth, so GB/s against the machine's read bandwidth says how close
//! a decode step is to its limit. Run with
//! `cargo bench -p kernels --bench matmul` (`-- 1b`: the 1B shapes only;
//! `-- cold`: the 1B shapes from memory, not cache, as in a decode step;
//! `-- bandwidth`: the machine's read bandwidth with 1 and 2 threads, the
//! bound of a decode step: bytes of weights / bandwidth; `-- paths`: every
//! SIMD path on one thread, alternating, on a weight held in L2;
//! `-- kquant`: Qwen2.5-1.5B's Q4_K_M shapes streamed from memory, read
//! natively (Q4_K, Q6_K) and as the earlier transcodings (Q4_1, Q8_0),
//! alternating; `-- iq4`: the same shapes in Q4_0, IQ4_NL, Q4_K and
//! IQ4_XS, alternating; `-- 4b`: Qwen3-4B's and Gemma-3-4B's shapes in
//! Q4_K and Q6_K from memory, alternating, to set a decode step's matrices
//! beside each other; `-- moe`: a Qwen3-30B-A3B layer's chosen experts
//! (Q4_K, from memory) as one `matmul` per projection against one
//! `matmul_many` for all, alternating).

use std::time::Instant;

use kernels::cpu::membw::BandwidthProbe;
use kernels::cpu::{Isa, Product, matmul_many, matmul_with};
use kernels::{QMatrix, QuantType};

const SMOL: [(&str, usize, usize); 4] = [
    ("q/o 576x576", 576, 576),
    ("up 1536x576", 1536, 576),
    ("down 576x1536", 576, 1536),
    ("lm_head 49152x576", 49152, 576),
];

const LLAMA_1B: [(&str, usize, usize); 4] = [
    ("1b o 2048x2048", 2048, 2048),
    ("1b gate+up 16384x2048", 16384, 2048),
    ("1b down 2048x8192", 2048, 8192),
    ("1b lm_head 128256x2048", 128_256, 2048),
];

fn main() {
    if std::env::args().any(|a| a == "bandwidth") {
        bandwidth();
        return;
    }
    if std::env::args().any(|a| a == "paths") {
        paths();
        return;
    }
    if std::env::args().any(|a| a == "iq4") {
        iq4();
        return;
    }
    if std::env::args().any(|a| a == "kquant") {
        kquant();
        return;
    }
    if std::env::args().any(|a| a == "4b") {
        four_b();
        return;
    }
    if std::env::args().any(|a| a == "geglu") {
        geglu();
        return;
    }
    if std::env::args().any(|a| a == "moe") {
        // On a pool's thread, as the engine's executor runs a step.
        let pool = rayon::ThreadPoolBuilder::new().build().expect("pool");
        pool.install(moe);
        return;
    }
    let only_1b = std::env::args().any(|a| a == "1b");
    let cold = std::env::args().any(|a| a == "cold");
    if !only_1b {
        for (ty, label) in [(QuantType::Q4_1, "Q4_1"), (QuantType::Q8_0, "Q8_0")] {
            for &(name, rows, cols) in &SMOL {
                if ty == QuantType::Q8_0 && rows != 49152 {
                    continue;
                }
                run(
                    ty,
                    label,
                    (name, rows, cols),
                    &[1, 16, 128],
                    &Isa::all_supported(),
                    false,
                );
            }
        }
    }
    // AMX hosts: the VNNI path beside it (batched rows are where they differ).
    let isas = if Isa::detect() == Isa::Amx {
        vec![Isa::Avx512Vnni, Isa::Amx]
    } else {
        vec![Isa::detect()]
    };
    for &(name, rows, cols) in &LLAMA_1B {
        run(
            QuantType::Q4_0,
            "Q4_0",
            (name, rows, cols),
            &[1, 8, 16, 128, 512],
            &isas,
            cold,
        );
    }
}

/// Bytes of weight copies a cold run cycles through (past the LLC).
const COLD_BYTES: usize = 512 << 20;

fn run(
    ty: QuantType,
    label: &str,
    (name, rows, cols): (&str, usize, usize),
    ms: &[usize],
    isas: &[Isa],
    cold: bool,
) {
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
        .collect();
    let w = QMatrix::quantize(ty, rows, cols, &w).expect("quantize");
    let bytes = w.data_len() as f64;
    // Cold: copies past any last-level cache, cycled, so every call streams
    // its weights from memory as a decode step does.
    let copies = if cold {
        COLD_BYTES.div_ceil(w.data_len()).max(2)
    } else {
        1
    };
    // Copies of their own: a `QMatrix` clone shares its buffer.
    let ws: Vec<QMatrix> = (0..copies).map(|_| w.copy()).collect();
    let label = if cold {
        format!("{label} cold")
    } else {
        label.to_string()
    };
    for &m in ms {
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
            .collect();
        let mut out = vec![0.0; m * rows];
        for &isa in isas {
            matmul_with(isa, &ws[0], &x, m, &mut out).expect("warm-up");
            let reps = (2_000_000_000 / (rows * cols * m)).clamp(4 * copies, 2000);
            let t = Instant::now();
            for r in 0..reps {
                matmul_with(isa, &ws[r % copies], &x, m, &mut out).expect("matmul");
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

/// Every path on one thread, alternating, on weights that stay in L2
/// (the kernels' own speed, not memory's): best of seven rounds.
fn paths() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let shapes = [
        (
            QuantType::Q4_0,
            "Q4_0",
            512,
            2048,
            &[16, 32, 48, 64, 128, 256][..],
        ),
        (QuantType::Q4_1, "Q4_1", 1536, 576, &[64, 128][..]),
    ];
    for (ty, label, rows, cols, ms) in shapes {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
            .collect();
        let w = QMatrix::quantize(ty, rows, cols, &w).expect("quantize");
        for &m in ms {
            let x: Vec<f32> = (0..m * cols)
                .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
                .collect();
            let mut out = vec![0.0; m * rows];
            let isas: Vec<Isa> = Isa::all_supported()
                .into_iter()
                .filter(|&i| i >= Isa::Avx2)
                .collect();
            let mut best = vec![f64::MAX; isas.len()];
            for _ in 0..7 {
                for (k, &isa) in isas.iter().enumerate() {
                    let reps = 20;
                    let t = Instant::now();
                    pool.install(|| {
                        for _ in 0..reps {
                            matmul_with(isa, &w, &x, m, &mut out).expect("matmul");
                        }
                    });
                    best[k] = best[k].min(t.elapsed().as_secs_f64() / reps as f64);
                }
            }
            for (isa, s) in isas.iter().zip(best) {
                let gmacs = (rows * cols * m) as f64 / s / 1e9;
                println!(
                    "{label} {rows}x{cols} m={m:<4} {isa:<11?} 1 thread {:>8.3} ms {gmacs:>7.1} GMAC/s",
                    s * 1e3
                );
            }
        }
    }
}

/// Qwen2.5-Coder-1.5B's matrices in its Q4_K_M file (half the `down`
/// projections are Q6_K, half Q4_K).
const QWEN_1_5B: [(&str, usize, usize, QuantType); 5] = [
    ("qkv 2048x1536", 2048, 1536, QuantType::Q4K),
    ("o 1536x1536", 1536, 1536, QuantType::Q4K),
    ("gate+up 17920x1536", 17920, 1536, QuantType::Q4K),
    ("down 1536x8960", 1536, 8960, QuantType::Q6K),
    ("lm_head 151936x1536", 151_936, 1536, QuantType::Q6K),
];

/// Each K-quant shape from memory (copies past the LLC, cycled), native
/// against the earlier transcoding (Q4_K as Q4_1, Q6_K as Q8_0), the two
/// alternating: best of five rounds.
fn kquant() {
    for (name, rows, cols, ty) in QWEN_1_5B {
        let native =
            QMatrix::quantize(ty, rows, cols, &bench_weights(rows, cols)).expect("quantize");
        let old_ty = if ty == QuantType::Q4K {
            QuantType::Q4_1
        } else {
            QuantType::Q8_0
        };
        let old = native.requantize(old_ty).expect("requantize");
        for (m, best) in alternate(&[old, native]) {
            let (o, n) = (best[0], best[1]);
            println!(
                "{name:<20} m={m:<3} {old_ty:?} {:>8.3} ms {:>5.1} GB/s | {ty:?} {:>8.3} ms {:>5.1} GB/s | native {:.2}x",
                o.0 * 1e3,
                o.1,
                n.0 * 1e3,
                n.1,
                o.0 / n.0
            );
        }
    }
}

/// Qwen3-4B's and Gemma-3-4B's matrices (a layer's, and the tied output).
const FOUR_B: [(&str, usize, usize); 9] = [
    ("qwen3 q 4096x2560", 4096, 2560),
    ("qwen3 o 2560x4096", 2560, 4096),
    ("qwen3 gate+up 19456x2560", 19_456, 2560),
    ("qwen3 down 2560x9728", 2560, 9728),
    ("qwen3 out 151936x2560", 151_936, 2560),
    ("gemma3 o 2560x2048", 2560, 2048),
    ("gemma3 gate+up 20480x2560", 20_480, 2560),
    ("gemma3 down 2560x10240", 2560, 10_240),
    ("gemma3 out 262144x2560", 262_144, 2560),
];

/// GeGLU at Gemma-3-4B's FFN width (10,240), one token and sixteen: the
/// GELU from its f16 table against its definition per element (the
/// earlier path), alternating, best of five.
fn geglu() {
    use kernels::cpu::ops::{geglu_with, gelu_f16_lookup, gelu_tanh_f16};
    let n = 10_240;
    for m in [1usize, 16] {
        let gu: Vec<f32> = (0..m * 2 * n)
            .map(|i| ((i * 7919) % 2003) as f32 / 200.0 - 5.0)
            .collect();
        let mut best = [f64::MAX; 2];
        for _ in 0..5 {
            for (k, gelu) in [gelu_tanh_f16 as fn(f32) -> f32, gelu_f16_lookup]
                .into_iter()
                .enumerate()
            {
                let reps = 200;
                let t = Instant::now();
                for _ in 0..reps {
                    std::hint::black_box(geglu_with(std::hint::black_box(&gu), n, gelu));
                }
                best[k] = best[k].min(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        println!(
            "geglu {n} m={m:<3} definition {:>8.1} us | table {:>8.1} us | {:.2}x",
            best[0] * 1e6,
            best[1] * 1e6,
            best[0] / best[1]
        );
    }
}

/// Experts in the bench's layer (`moe`), and their widths.
const EXPERTS: usize = 128;
const EXPERT_FF: usize = 768;
const EXPERT_HIDDEN: usize = 2048;

/// An expert's gate-up and down projections.
type Expert = [QMatrix; 2];

/// A case of `moe`: what it stands for, the experts it uses, and the rows
/// of expert `i`.
type MoeCase = (&'static str, usize, fn(usize) -> usize);

/// A Qwen3-30B-A3B layer's experts (gate-up 1536x2048 and down 2048x768,
/// Q4_K), 128 of them (340 MB: from memory), as a step uses them: one
/// token's 8, eight tokens' 51 (64 picks), a 128-token prefill's 128 with 8
/// rows each. Alternating, the best of seven rounds: each expert's two
/// projections as their own `matmul` calls (the old MoE layer) against
/// each projection of all the experts in one `matmul_many`; then
/// `matmul_many` on experts packed one by one (each its own allocation, on
/// 4 KiB pages) against experts split from one stack per projection (one
/// buffer, on 2 MiB pages: `cpu::pages`), as the engine now loads them.
fn moe() {
    let (ff, hidden) = (EXPERT_FF, EXPERT_HIDDEN);
    let apart: Vec<Expert> = (0..EXPERTS)
        .map(|e| {
            [
                expert_matrix(2 * ff, hidden, &expert_values(2 * ff, hidden, e)),
                expert_matrix(hidden, ff, &expert_values(hidden, ff, e)),
            ]
        })
        .collect();
    let stack = |rows, cols| {
        let w: Vec<f32> = (0..EXPERTS)
            .flat_map(|e| expert_values(rows, cols, e))
            .collect();
        expert_matrix(EXPERTS * rows, cols, &w)
            .split_groups(rows)
            .expect("split")
    };
    let stacked: Vec<Expert> = stack(2 * ff, hidden)
        .into_iter()
        .zip(stack(hidden, ff))
        .map(|(g, d)| [g, d])
        .collect();
    // 64 picks over 51 experts is 13 of 2 rows.
    let cases: [MoeCase; 3] = [
        ("1 token, 8 experts", 8, |_| 1),
        ("8 tokens, 51 experts", 51, |i| 1 + usize::from(i < 13)),
        ("128 tokens, 128 experts", 128, |_| 8),
    ];
    let bytes_each = stacked[0][0].data_len() + stacked[0][1].data_len();
    for (what, n, rows) in cases {
        let best = moe_case(n, rows, [&stacked, &apart]);
        let cell = |s: f64| {
            let gbs = (n * bytes_each) as f64 / s / 1e9;
            format!("{:>7.3} ms {gbs:>5.1} GB/s", s * 1e3)
        };
        println!(
            "moe {what:<24} one by one {} | matmul_many {} | experts apart {} | in one stack {}",
            cell(best[0]),
            cell(best[2]),
            cell(best[1]),
            cell(best[2]),
        );
    }
}

fn expert_values(rows: usize, cols: usize, e: usize) -> Vec<f32> {
    bench_weights(rows, cols)
        .iter()
        .map(|v| v * (1.0 + e as f32 / 1e3))
        .collect()
}

fn expert_matrix(rows: usize, cols: usize, w: &[f32]) -> QMatrix {
    QMatrix::quantize(QuantType::Q4K, rows, cols, w).expect("quantize")
}

/// Seconds of one pass over `n` experts of `rows(i)` rows each, the best
/// of seven rounds: the stacked experts one matmul at a time, the experts
/// apart in `matmul_many`, the stacked ones in `matmul_many`.
fn moe_case(n: usize, rows: fn(usize) -> usize, [stacked, apart]: [&[Expert]; 2]) -> [f64; 3] {
    let input = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
            .collect()
    };
    let (ff, hidden) = (EXPERT_FF, EXPERT_HIDDEN);
    let xs: Vec<[Vec<f32>; 2]> = (0..n)
        .map(|i| [input(rows(i) * hidden), input(rows(i) * ff)])
        .collect();
    let mut outs: Vec<[Vec<f32>; 2]> = (0..n)
        .map(|i| [vec![0.0; rows(i) * 2 * ff], vec![0.0; rows(i) * hidden]])
        .collect();
    let mut best = [f64::MAX; 3];
    let mut start = 0;
    for _ in 0..7 {
        for (k, b) in best.iter_mut().enumerate() {
            let experts = if k == 1 { apart } else { stacked };
            let reps = 20;
            let t = Instant::now();
            for _ in 0..reps {
                // Different experts each time: weights from memory.
                start = (start + n) % EXPERTS;
                let chosen: Vec<&Expert> =
                    (0..n).map(|i| &experts[(start + i) % EXPERTS]).collect();
                moe_pass(&chosen, rows, &xs, &mut outs, k > 0);
            }
            *b = b.min(t.elapsed().as_secs_f64() / reps as f64);
        }
    }
    best
}

/// Both projections of the `chosen` experts: in one `matmul_many` each
/// (`many`), or one `matmul` per expert and projection.
fn moe_pass(
    chosen: &[&Expert],
    rows: fn(usize) -> usize,
    xs: &[[Vec<f32>; 2]],
    outs: &mut [[Vec<f32>; 2]],
    many: bool,
) {
    for p in 0..2 {
        if !many {
            for (i, (x, out)) in xs.iter().zip(outs.iter_mut()).enumerate() {
                matmul_with(Isa::detect(), &chosen[i][p], &x[p], rows(i), &mut out[p])
                    .expect("matmul");
            }
            continue;
        }
        let mut ps: Vec<Product<'_>> = (xs.iter().zip(outs.iter_mut()))
            .enumerate()
            .map(|(i, (x, out))| Product {
                w: &chosen[i][p],
                x: &x[p],
                m: rows(i),
                out: &mut out[p],
            })
            .collect();
        matmul_many(&mut ps).expect("matmul_many");
    }
}

/// `FOUR_B` in Q4_K and Q6_K from memory, alternating: GB/s per shape.
fn four_b() {
    for (name, rows, cols) in FOUR_B {
        let w = bench_weights(rows, cols);
        let mats: Vec<QMatrix> = [QuantType::Q4K, QuantType::Q6K]
            .iter()
            .map(|&t| QMatrix::quantize(t, rows, cols, &w).expect("quantize"))
            .collect();
        for (m, best) in alternate(&mats) {
            let [(a, ga), (b, gb)] = [best[0], best[1]];
            println!(
                "{name:<26} m={m:<3} Q4_K {:>8.3} ms {ga:>5.1} GB/s | Q6_K {:>8.3} ms {gb:>5.1} GB/s",
                a * 1e3,
                b * 1e3
            );
        }
    }
}

/// The 4-bit formats on Qwen2.5-1.5B's shapes from memory, alternating:
/// Q4_0 (the fastest 4.5-bit format), IQ4_NL (the same size, a table),
/// Q4_K and IQ4_XS (4.25 bits).
fn iq4() {
    let types = [
        QuantType::Q4_0,
        QuantType::Iq4Nl,
        QuantType::Q4K,
        QuantType::Iq4Xs,
    ];
    for (name, rows, cols, _) in QWEN_1_5B {
        let w = bench_weights(rows, cols);
        let mats: Vec<QMatrix> = types
            .iter()
            .map(|&t| QMatrix::quantize(t, rows, cols, &w).expect("quantize"))
            .collect();
        for (m, best) in alternate(&mats) {
            let cells: Vec<String> = types
                .iter()
                .zip(&best)
                .map(|(t, (s, gbs))| format!("{t:?} {:>7.3} ms {gbs:>5.1} GB/s", s * 1e3))
                .collect();
            println!("{name:<20} m={m:<3} {}", cells.join(" | "));
        }
    }
}

fn bench_weights(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
        .collect()
}

/// Each of `mats` (one shape) streamed from memory (copies past the LLC,
/// cycled) at m = 1, 8 and 64, the matrices alternating: the best of five
/// rounds of each, as (seconds, GB/s of weights).
fn alternate(mats: &[QMatrix]) -> Vec<(usize, Vec<(f64, f64)>)> {
    let (rows, cols) = (mats[0].rows, mats[0].cols);
    let sets: Vec<Vec<QMatrix>> = mats
        .iter()
        .map(|w| {
            let copies = COLD_BYTES.div_ceil(w.data_len()).max(2);
            (0..copies).map(|_| w.copy()).collect()
        })
        .collect();
    let mut rows_out = Vec::new();
    for m in [1, 8, 64] {
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0)
            .collect();
        let mut out = vec![0.0; m * rows];
        let mut best = vec![f64::MAX; sets.len()];
        for _ in 0..5 {
            for (k, ws) in sets.iter().enumerate() {
                let reps = (1_000_000_000 / (rows * cols * m)).max(2 * ws.len());
                let t = Instant::now();
                for r in 0..reps {
                    matmul_with(Isa::detect(), &ws[r % ws.len()], &x, m, &mut out).expect("matmul");
                }
                best[k] = best[k].min(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        let got = best
            .iter()
            .zip(&sets)
            .map(|(&b, ws)| (b, ws[0].data_len() as f64 / b / 1e9))
            .collect();
        rows_out.push((m, got));
    }
    rows_out
}

/// Best of five passes summing a 1 GiB buffer, split over 1 and 2 threads.
fn bandwidth() {
    let probe = BandwidthProbe::new(1 << 30);
    for threads in [1usize, 2] {
        println!(
            "read bandwidth, {threads} thread(s): {:.1} GB/s",
            probe.read_gbps(threads, 5)
        );
    }
}
