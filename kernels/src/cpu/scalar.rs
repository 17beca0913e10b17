//! Portable integer dot products of quantized weight rows with Q8
//! activation rows: the fallback on CPUs without AVX2, and the exact
//! integer arithmetic the SIMD paths must reproduce.

use crate::quant::{Q8Block, QK, QuantType, f16_at};

/// `sum_j w_j * x_j` of one weight row (GGML blocks) and one activation row.
pub fn dot_row(ty: QuantType, w: &[u8], x: &[Q8Block]) -> f32 {
    let bb = ty.block_bytes();
    let mut acc = 0.0f32;
    for (blk, xb) in w.chunks_exact(bb).zip(x) {
        let d = f16_at(blk, 0);
        let (isum, offset) = match ty {
            QuantType::Q4_0 => (nibble_dot(&blk[2..18], &xb.qs), -8.0 * d),
            QuantType::Q4_1 => (nibble_dot(&blk[4..20], &xb.qs), f16_at(blk, 2)),
            QuantType::Q8_0 => {
                let s: i32 = blk[2..34]
                    .iter()
                    .zip(&xb.qs)
                    .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
                    .sum();
                (s, 0.0)
            }
        };
        acc += d * xb.d * isum as f32 + offset * xb.s;
    }
    acc
}

/// Dot of 32 unsigned nibbles (GGML order) with 32 signed bytes.
fn nibble_dot(qs: &[u8], x: &[i8; QK]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += i32::from(qs[j] & 0x0F) * i32::from(x[j]);
        s += i32::from(qs[j] >> 4) * i32::from(x[j + 16]);
    }
    s
}
