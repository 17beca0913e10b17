//! The super-block matmul paths (Q4_K, Q5_K, Q6_K, IQ4_XS in their own super-blocks) against
//! the plain-Rust reference, on seeded random super-blocks of every bit
//! pattern (not only those a quantizer writes), for the batch shapes the
//! engine uses and on every SIMD path this CPU has.

mod common;

use common::{random, reference};
use half::f16;
use kernels::cpu::{Isa, matmul_with};
use kernels::iquant::Iq4xsBlock;
use kernels::kquant::{Q4kBlock, Q6kBlock, QK_K};
use kernels::{QMatrix, QuantType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KINDS: [QuantType; 4] = [
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
    QuantType::Iq4Xs,
];

/// `rows x cols` of random super-blocks: random quants, scales and mins,
/// super-block scales of a realistic size (so sums stay finite).
fn random_matrix(rng: &mut StdRng, ty: QuantType, rows: usize, cols: usize) -> QMatrix {
    let f16_bits = |rng: &mut StdRng, hi: f32| f16::from_f32(rng.random_range(0.0..hi)).to_bits();
    let mut ggml = Vec::new();
    for _ in 0..rows * cols / QK_K {
        if ty == QuantType::Iq4Xs {
            let k = Iq4xsBlock {
                d: f16_bits(rng, 0.0005),
                ls: std::array::from_fn(|_| rng.random_range(-32..32)),
                q: std::array::from_fn(|_| rng.random_range(0..16)),
            };
            ggml.extend(k.to_ggml());
        } else if ty != QuantType::Q6K {
            let top = if ty == QuantType::Q4K { 16 } else { 32 };
            let k = Q4kBlock {
                d: f16_bits(rng, 0.002),
                dmin: f16_bits(rng, 0.002),
                sc: std::array::from_fn(|_| rng.random_range(0..64)),
                m: std::array::from_fn(|_| rng.random_range(0..64)),
                q: std::array::from_fn(|_| rng.random_range(0..top)),
            };
            ggml.extend(if ty == QuantType::Q4K {
                k.to_ggml()
            } else {
                k.to_ggml_q5k()
            });
        } else {
            let k = Q6kBlock {
                d: f16_bits(rng, 0.0005),
                sc: std::array::from_fn(|_| rng.random_range(-128..=127)),
                q: std::array::from_fn(|_| rng.random_range(0..64)),
            };
            ggml.extend(k.to_ggml());
        }
    }
    QMatrix::new(ty, rows, cols, &ggml).expect("matrix")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn run(isa: Isa, w: &QMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * w.rows];
    matmul_with(isa, w, x, m, &mut out).expect("matmul");
    out
}

#[test]
fn every_path_matches_the_reference_and_gives_the_same_bits() {
    let mut rng = StdRng::seed_from_u64(41);
    let shapes = [
        (1, 96, 256),
        (2, 33, 512),
        (3, 130, 256),
        (7, 37, 768),
        (9, 48, 256),
        (17, 20, 512),
        (64, 16, 256),
    ];
    for ty in KINDS {
        for &(m, rows, cols) in &shapes {
            let w = random_matrix(&mut rng, ty, rows, cols);
            let x = random(&mut rng, m * cols);
            let want = reference(&w, &x, m);
            let scalar = run(Isa::Scalar, &w, &x, m);
            let scale = want.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
            for isa in Isa::all_supported() {
                let got = run(isa, &w, &x, m);
                assert_eq!(
                    bits(&got),
                    bits(&scalar),
                    "{ty:?} {isa:?} m={m} against scalar"
                );
                let err = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    err <= 2e-5 * scale * (cols as f32).sqrt(),
                    "{ty:?} {isa:?} m={m} {rows}x{cols}: max error {err} (scale {scale})"
                );
            }
        }
    }
}

#[test]
fn a_rows_result_does_not_depend_on_its_batch() {
    let mut rng = StdRng::seed_from_u64(43);
    let (rows, cols) = (40, 512);
    for ty in KINDS {
        let w = random_matrix(&mut rng, ty, rows, cols);
        let x = random(&mut rng, 37 * cols);
        for isa in Isa::all_supported() {
            let alone: Vec<f32> = x
                .chunks_exact(cols)
                .flat_map(|xi| run(isa, &w, xi, 1))
                .collect();
            for m in (2..=9).chain([16, 17, 37]) {
                let got = run(isa, &w, &x[..m * cols], m);
                assert_eq!(
                    bits(&got),
                    bits(&alone[..m * rows]),
                    "{ty:?} {isa:?} batch of {m}"
                );
            }
        }
    }
}

#[test]
fn the_largest_sums_are_exact_on_every_path() {
    // Q6_K quants of 63 (and 0) with the largest scales, against
    // activations of +-127: the 16-bit pair sums reach 2 * 2 * 63 * 127.
    // Q4_K nibbles of 15 (Q5_K quants of 31) with scales and mins of 63.
    let cols = 512;
    let q6 = |q: u8, sc: i8| Q6kBlock {
        d: f16::from_f32(1.0 / 1024.0).to_bits(),
        sc: [sc; 16],
        q: [q; QK_K],
    };
    let q4 = |q: u8| Q4kBlock {
        d: f16::from_f32(1.0 / 512.0).to_bits(),
        dmin: f16::from_f32(1.0 / 512.0).to_bits(),
        sc: [63; 8],
        m: [63; 8],
        q: [q; QK_K],
    };
    // IQ4_XS indices of -127 (0) and 113 (15) with scales of -32 and 31.
    let iq4 = |q: u8, ls: i8| Iq4xsBlock {
        d: f16::from_f32(1.0 / 1024.0).to_bits(),
        ls: [ls; 8],
        q: [q; QK_K],
    };
    let matrices = [
        (
            QuantType::Iq4Xs,
            [iq4(0, -32), iq4(15, 31), iq4(0, 31), iq4(15, -32)]
                .iter()
                .flat_map(|k| [k.to_ggml(), k.to_ggml()].concat())
                .collect::<Vec<u8>>(),
        ),
        (
            QuantType::Q6K,
            [q6(63, 127), q6(0, -128), q6(63, -128), q6(0, 127)]
                .iter()
                .flat_map(|k| [k.to_ggml(), k.to_ggml()].concat())
                .collect::<Vec<u8>>(),
        ),
        (
            QuantType::Q5K,
            [q4(31), q4(0)]
                .iter()
                .flat_map(|k| [k.to_ggml_q5k(), k.to_ggml_q5k()].concat())
                .collect::<Vec<u8>>(),
        ),
        (
            QuantType::Q4K,
            [q4(15), q4(0)]
                .iter()
                .flat_map(|k| [k.to_ggml(), k.to_ggml()].concat())
                .collect::<Vec<u8>>(),
        ),
    ];
    for (ty, ggml) in matrices {
        let rows = ggml.len() / (cols / QK_K * ty.block_bytes());
        let w = QMatrix::new(ty, rows, cols, &ggml).expect("matrix");
        let x = [vec![1.0; cols], vec![-1.0; cols]].concat();
        for m in [2, 10] {
            let x = x.repeat(m / 2);
            let want = reference(&w, &x, m);
            for isa in Isa::all_supported() {
                let got = run(isa, &w, &x, m);
                for (g, e) in got.iter().zip(&want) {
                    assert!(
                        (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                        "{ty:?} {isa:?} m={m}: {got:?} against {want:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn k_quant_rows_stack_and_come_back_as_ggml_bytes() {
    let mut rng = StdRng::seed_from_u64(47);
    for ty in KINDS {
        let a = random_matrix(&mut rng, ty, 17, 512);
        let b = random_matrix(&mut rng, ty, 5, 512);
        let ab = QMatrix::concat(&[&a, &b]).expect("stack");
        assert_eq!(ab.rows, 22);
        assert_eq!(ab.ggml_row(17), b.ggml_row(0));
        assert_eq!(ab.dequantize_row(16), a.dequantize_row(16));
        // The packed size: Q6_K's is GGML's (rows rounded up to 16).
        if ty == QuantType::Q6K {
            assert_eq!(ab.data_len(), 32 * 2 * ty.block_bytes());
        }
    }
}

#[test]
fn widths_that_are_not_whole_super_blocks_are_refused() {
    let err = QMatrix::new(QuantType::Q4K, 1, 96, &[0; 54]).expect_err("96 columns");
    assert_eq!(
        err.to_string(),
        "the column count 96 is not a multiple of 256 (the format's block)"
    );
    assert!(QMatrix::new(QuantType::Q6K, 2, 256, &[0; 210]).is_err());
}
