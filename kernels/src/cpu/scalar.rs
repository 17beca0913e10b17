//! Portable integer dot products of one interleaved 16-row weight group
//! with one Q8 activation row: the fallback on CPUs without AVX2, and the
//! exact integer arithmetic the SIMD paths reproduce.

use crate::layout::{self, GROUP};
use crate::quant::{Q8Block, QK, QuantType, f16_at};

/// `out[lane] = sum_j w[lane][j] * x[j]` for the 16 rows of group `g`, with
/// the SIMD paths' operations in their order (fused multiply-adds), so
/// every path gives the same bits.
pub fn dot_group(ty: QuantType, g: &[u8], x: &[Q8Block]) -> [f32; GROUP] {
    let gbb = layout::group_block_bytes(ty);
    let mut acc = [0.0f32; GROUP];
    for (gb, xb) in g.chunks_exact(gbb).zip(x) {
        // The weights are `d * (u - k)` (Q4_0, Q8_0: the offset `k` goes
        // into the integer sum) or `d * u + m` (Q4_1: `m * sum x` in float).
        let off = match ty {
            QuantType::Q4_0 => xb.off4,
            QuantType::Q8_0 => xb.off8,
            QuantType::Q4_1 => 0,
        };
        for (lane, a) in acc.iter_mut().enumerate() {
            let d = f16_at(gb, 2 * lane);
            let isum: i32 = (0..QK)
                .map(|j| i32::from(layout::unsigned_weight(ty, gb, lane, j)) * i32::from(xb.qs[j]))
                .sum();
            *a = ((isum + off) as f32).mul_add(d * xb.d, *a);
            if ty == QuantType::Q4_1 {
                *a = f16_at(gb, 2 * GROUP + 2 * lane).mul_add(xb.s, *a);
            }
        }
    }
    acc
}
