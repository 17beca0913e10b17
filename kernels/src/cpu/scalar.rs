//! Portable integer dot products of one interleaved 16-row weight group
//! with one Q8 activation row: the fallback on CPUs without AVX2, and the
//! exact integer arithmetic the SIMD paths reproduce.

use crate::layout::{self, GROUP};
use crate::quant::{Q8Block, QK, QuantType, f16_at};

/// `out[lane] = sum_j w[lane][j] * x[j]` for the 16 rows of group `g`.
pub fn dot_group(ty: QuantType, g: &[u8], x: &[Q8Block]) -> [f32; GROUP] {
    let gbb = layout::group_block_bytes(ty);
    let mut acc = [0.0f32; GROUP];
    for (gb, xb) in g.chunks_exact(gbb).zip(x) {
        for (lane, a) in acc.iter_mut().enumerate() {
            let d = f16_at(gb, 2 * lane);
            let offset = block_offset(ty, gb, lane, d);
            let isum: i32 = (0..QK)
                .map(|j| i32::from(layout::unsigned_weight(ty, gb, lane, j)) * i32::from(xb.qs[j]))
                .sum();
            *a += d * xb.d * isum as f32 + offset * xb.s;
        }
    }
    acc
}

/// The per-block term that turns the unsigned integer weights into real
/// ones: `w = d * u + offset`.
fn block_offset(ty: QuantType, gb: &[u8], lane: usize, d: f32) -> f32 {
    match ty {
        QuantType::Q4_0 => -8.0 * d,
        QuantType::Q4_1 => f16_at(gb, 2 * GROUP + 2 * lane),
        QuantType::Q8_0 => -128.0 * d,
    }
}
