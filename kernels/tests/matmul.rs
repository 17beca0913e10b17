//! Every quantized-matmul path against the plain-Rust reference on seeded
//! random inputs, for every format and for the batch shapes the engine uses.

mod common;

use common::{random, reference};
use kernels::cpu::{Isa, Product, matmul_many_with, matmul_with};
use kernels::quant::{QK, quantize_activations};
use kernels::{QMatrix, QuantType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The 32-weight formats (the super-block ones: `tests/kquant.rs`).
const FORMATS: [QuantType; 6] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q8_0,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Iq4Nl,
];

#[test]
fn every_path_matches_the_reference_for_every_format_and_batch() {
    let mut rng = StdRng::seed_from_u64(11);
    let shapes = [
        (1, 96, 64),
        (3, 130, 96),
        (4, 64, 576),
        (7, 37, 128),
        (16, 200, 64),
        (11, 48, 96),
        (20, 33, 160),
        (64, 40, 288),
    ];
    for ty in FORMATS {
        for &(m, rows, cols) in &shapes {
            let w = QMatrix::quantize(ty, rows, cols, &random(&mut rng, rows * cols))
                .expect("quantize");
            let x = random(&mut rng, m * cols);
            let want = reference(&w, &x, m);
            for isa in Isa::all_supported() {
                let mut got = vec![f32::NAN; m * rows];
                matmul_with(isa, &w, &x, m, &mut got).expect("matmul");
                let err = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
                assert!(
                    err <= 2e-5 * scale * (cols as f32).sqrt(),
                    "{ty:?} {isa:?} m={m} {rows}x{cols}: max error {err}"
                );
            }
        }
    }
}

#[test]
fn the_largest_block_sums_are_exact_on_every_path() {
    // Weights whose nibbles are 15 (all but the block's first, which sets
    // the scale) against activations that quantize to +127 or -127 alike:
    // the largest integer sums a block can give, which the AVX2 path adds
    // in 16-bit lanes before widening. Q8_0 rows of +-127 likewise.
    let cols = 256;
    let row = |first: f32, rest: f32| -> Vec<f32> {
        (0..cols)
            .map(|k| if k % QK == 0 { first } else { rest })
            .collect()
    };
    for (ty, w) in [
        (
            QuantType::Q4_0,
            [row(1.0, -0.875), row(-1.0, 0.875)].concat(),
        ),
        (QuantType::Q4_1, [row(-1.0, 1.0), row(1.0, -1.0)].concat()),
        (QuantType::Q8_0, [row(1.0, 1.0), row(-1.0, -1.0)].concat()),
        // IQ4_NL: every index 0, the table's -127 (multiplied as Q8_0's).
        (QuantType::Iq4Nl, [row(1.0, 1.0), row(-1.0, -1.0)].concat()),
        // All nibbles 0 (the most negative weights).
        (QuantType::Q4_0, [row(1.0, 1.0), row(-1.0, -1.0)].concat()),
        // Q5 weights of 31 (the 16-bit sums of four chunks at their most).
        (QuantType::Q5_1, [row(-1.0, 1.0), row(1.0, -1.0)].concat()),
        (
            QuantType::Q5_0,
            [row(1.0, -0.9375), row(-1.0, 0.9375)].concat(),
        ),
    ] {
        let w = QMatrix::quantize(ty, 2, cols, &w).expect("quantize");
        let x = [vec![1.0; cols], vec![-1.0; cols], row(-1.0, 1.0)].concat();
        // Three rows (tiles of 2 and 1), nine (tiles of 8 and 1) and 66
        // (AMX's four of 16, then 2).
        for m in [3, 9, 66] {
            let x = x.repeat(m / 3);
            let want = reference(&w, &x, m);
            for isa in Isa::all_supported() {
                let mut got = vec![f32::NAN; m * 2];
                matmul_with(isa, &w, &x, m, &mut got).expect("matmul");
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
fn a_rows_result_does_not_depend_on_its_batch() {
    // Every path computes each activation row alone, whatever tile (AMX's
    // 16 rows, or 8, 4, 2 or 1) it falls in: a sequence's logits are the
    // same bit for bit alone and in any batch, which a tile that changed
    // the arithmetic for some batch sizes (session 19 tried one for AVX2)
    // would break. On AMX, the lone row takes the VNNI tile and batches of
    // 64 and more the AMX one, so this holds the two to the same bits.
    let mut rng = StdRng::seed_from_u64(23);
    let (rows, cols) = (40, 256);
    for ty in FORMATS {
        let w =
            QMatrix::quantize(ty, rows, cols, &random(&mut rng, rows * cols)).expect("quantize");
        let x = random(&mut rng, 83 * cols);
        for isa in Isa::all_supported() {
            let alone: Vec<f32> = x
                .chunks_exact(cols)
                .flat_map(|xi| {
                    let mut out = vec![f32::NAN; rows];
                    matmul_with(isa, &w, xi, 1, &mut out).expect("matmul");
                    out
                })
                .collect();
            for m in (2..=21).chain([31, 37, 64, 65, 71, 83]) {
                let mut got = vec![f32::NAN; m * rows];
                matmul_with(isa, &w, &x[..m * cols], m, &mut got).expect("matmul");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&alone[..m * rows]),
                    "{ty:?} {isa:?}: rows in a batch of {m} against alone"
                );
            }
        }
    }
}

#[test]
fn every_path_gives_the_same_bits() {
    // The integer sums are exact on every path (Q4_0's and Q8_0's offsets
    // included), and the float steps are the same fused multiply-adds in
    // the same order, so scalar, AVX2, VNNI and AMX agree bit for bit (and
    // the GPU kernels, which mirror them, with all of them).
    let mut rng = StdRng::seed_from_u64(29);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for ty in FORMATS {
        // The last shape takes the multi-group AVX2 path (Q4_0 and Q4_1)
        // with 16 groups a task, blocks in two spans, a partial last group
        // and one row past the tiles of 4.
        let shapes = [
            (1, 48, 256),
            (5, 40, 96),
            (16, 33, 64),
            (67, 32, 128),
            (21, 2053, 2048),
        ];
        for (m, rows, cols) in shapes {
            let w = QMatrix::quantize(ty, rows, cols, &random(&mut rng, rows * cols))
                .expect("quantize");
            let x = random(&mut rng, m * cols);
            let mut want = vec![f32::NAN; m * rows];
            matmul_with(Isa::Scalar, &w, &x, m, &mut want).expect("matmul");
            for isa in Isa::all_supported() {
                let mut got = vec![f32::NAN; m * rows];
                matmul_with(isa, &w, &x, m, &mut got).expect("matmul");
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{ty:?} {isa:?} m={m} against scalar"
                );
            }
        }
    }
}

#[test]
fn matmul_many_gives_each_products_own_bits() {
    // Seeded random sets of products (the experts of a step: mixed
    // formats, widths and row counts, some with no rows) against each
    // product's own `matmul`, bit for bit, on every path.
    let mut rng = StdRng::seed_from_u64(47);
    let formats = [
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q6K,
        QuantType::Iq4Nl,
    ];
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for round in 0..12 {
        let n = rng.random_range(1..9);
        let parts: Vec<(QMatrix, Vec<f32>, usize)> = (0..n)
            .map(|_| {
                let ty = formats[rng.random_range(0..formats.len())];
                let cols = 256 * rng.random_range(1..4);
                let rows = rng.random_range(1..70);
                let m = [0, 1, 2, 5, 8, 17][rng.random_range(0..6)];
                let w = QMatrix::quantize(ty, rows, cols, &random(&mut rng, rows * cols))
                    .expect("quantize");
                (w, random(&mut rng, m * cols), m)
            })
            .collect();
        for isa in Isa::all_supported() {
            let mut outs: Vec<Vec<f32>> = parts
                .iter()
                .map(|(w, _, m)| vec![f32::NAN; m * w.rows])
                .collect();
            let mut products: Vec<Product<'_>> = parts
                .iter()
                .zip(outs.iter_mut())
                .map(|((w, x, m), out)| Product { w, x, m: *m, out })
                .collect();
            matmul_many_with(isa, &mut products).expect("matmul_many");
            for ((w, x, m), got) in parts.iter().zip(&outs) {
                let mut want = vec![f32::NAN; m * w.rows];
                matmul_with(isa, w, x, *m, &mut want).expect("matmul");
                assert_eq!(
                    bits(got),
                    bits(&want),
                    "round {round} {isa:?} {:?} m={m}",
                    w.ty
                );
            }
        }
    }
}

#[test]
fn matmul_many_refuses_a_product_of_the_wrong_shape() {
    let mut rng = StdRng::seed_from_u64(48);
    let w = QMatrix::quantize(QuantType::Q4_0, 16, 64, &random(&mut rng, 16 * 64)).expect("q");
    let x = random(&mut rng, 2 * 64);
    let (mut good, mut bad) = (vec![0.0; 2 * 16], vec![0.0; 16]);
    let mut products = [
        Product {
            w: &w,
            x: &x,
            m: 2,
            out: &mut good,
        },
        Product {
            w: &w,
            x: &x,
            m: 2,
            out: &mut bad,
        },
    ];
    assert!(matmul_many_with(Isa::detect(), &mut products).is_err());
}

#[test]
fn matrices_split_from_a_stack_are_the_matrices_packed_alone() {
    // Experts packed as one stack and split (sharing its buffer) give the
    // bits of each expert packed on its own, in every format's layout.
    let mut rng = StdRng::seed_from_u64(49);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for ty in [
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q6K,
    ] {
        let (n, rows, cols, m) = (5, 48, 256, 3);
        let stack = QMatrix::quantize(ty, n * rows, cols, &random(&mut rng, n * rows * cols))
            .expect("quantize");
        let alone: Vec<QMatrix> = (0..n)
            .map(|e| {
                let ggml: Vec<u8> = (e * rows..(e + 1) * rows)
                    .flat_map(|r| stack.ggml_row(r))
                    .collect();
                QMatrix::new(ty, rows, cols, &ggml).expect("new")
            })
            .collect();
        let parts = stack.clone().split_groups(rows).expect("split");
        assert_eq!(parts.len(), n);
        let x = random(&mut rng, m * cols);
        for (part, own) in parts.iter().zip(&alone) {
            assert_eq!(
                (part.rows, part.cols, part.data_len()),
                (own.rows, own.cols, own.data_len())
            );
            let (mut a, mut b) = (vec![0.0; m * rows], vec![0.0; m * rows]);
            matmul_with(Isa::detect(), part, &x, m, &mut a).expect("matmul");
            matmul_with(Isa::detect(), own, &x, m, &mut b).expect("matmul");
            assert_eq!(bits(&a), bits(&b), "{ty:?}");
        }
        // Not whole groups, or not dividing the stack: refused.
        assert!(stack.clone().split_groups(8).is_err());
        assert!(stack.clone().split_groups(64).is_err());
        assert!(stack.split_groups(0).is_err());
    }
}

#[test]
fn quantized_matmul_approximates_the_float_product() {
    // Against the unquantized activations the error is the Q8 rounding only.
    let mut rng = StdRng::seed_from_u64(5);
    let (m, rows, cols) = (2, 50, 256);
    let w = QMatrix::quantize(QuantType::Q4_1, rows, cols, &random(&mut rng, rows * cols))
        .expect("quantize");
    let x = random(&mut rng, m * cols);
    let mut got = vec![0.0; m * rows];
    kernels::cpu::matmul(&w, &x, m, &mut got).expect("matmul");
    let acts = quantize_activations(&x, w.ty.act_span());
    for i in 0..m {
        for r in 0..rows {
            let wr = w.dequantize_row(r);
            let exact: f32 = wr.iter().zip(&x[i * cols..]).map(|(a, b)| a * b).sum();
            // Each activation is off by at most half its block's step d.
            let bound: f32 = wr
                .chunks(QK)
                .zip(&acts[i * cols / QK..])
                .map(|(wb, xb)| wb.iter().map(|v| v.abs()).sum::<f32>() * xb.d / 2.0)
                .sum();
            let err = (got[i * rows + r] - exact).abs();
            assert!(
                err <= bound + 1e-4,
                "{} vs {exact}: error {err} > bound {bound}",
                got[i * rows + r]
            );
        }
    }
}

#[test]
fn mismatched_shapes_are_errors() {
    let w = QMatrix::quantize(QuantType::Q8_0, 4, 32, &[0.5; 128]).expect("quantize");
    let mut out = vec![0.0; 4];
    assert!(kernels::cpu::matmul(&w, &[0.0; 31], 1, &mut out).is_err());
    assert!(kernels::cpu::matmul(&w, &[0.0; 32], 1, &mut [0.0; 3]).is_err());
}
