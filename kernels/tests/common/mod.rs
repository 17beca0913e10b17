//! What the matmul tests share: seeded random values and the reference
//! product every kernel is held to.

use kernels::QMatrix;
use kernels::quant::quantize_activations;
use rand::Rng;
use rand::rngs::StdRng;

/// `n` values in -1..1.
pub fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// The exact value the integer kernels approximate: dequantized weights
/// times dequantized (Q8, as the format scales them) activations,
/// accumulated in f64.
pub fn reference(w: &QMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let acts = quantize_activations(x, w.ty.act_span());
    let xq: Vec<f64> = acts
        .iter()
        .flat_map(|b| b.qs.iter().map(move |&q| f64::from(b.d) * f64::from(q)))
        .collect();
    let rows: Vec<Vec<f32>> = (0..w.rows).map(|r| w.dequantize_row(r)).collect();
    let mut out = vec![0.0; m * w.rows];
    for i in 0..m {
        let xi = &xq[i * w.cols..(i + 1) * w.cols];
        for (r, wr) in rows.iter().enumerate() {
            out[i * w.rows + r] = wr
                .iter()
                .zip(xi)
                .map(|(&a, &b)| f64::from(a) * b)
                .sum::<f64>() as f32;
        }
    }
    out
}
