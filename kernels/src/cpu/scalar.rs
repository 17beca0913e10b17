//! Portable integer dot products of one interleaved 16-row weight group
//! with one Q8 activation row: the fallback on CPUs without AVX2, and the
//! exact integer arithmetic the SIMD paths reproduce.

use crate::klayout;
use crate::kquant::QK_K;
use crate::layout::{self, GROUP};
use crate::quant::{Q8Block, QK, QuantType, f16_at};

/// `out[lane] = sum_j w[lane][j] * x[j]` for the 16 rows of group `g`, with
/// the SIMD paths' operations in their order (fused multiply-adds), so
/// every path gives the same bits.
pub fn dot_group(ty: QuantType, g: &[u8], x: &[Q8Block]) -> [f32; GROUP] {
    if ty.is_k() {
        return dot_group_k(ty, g, x);
    }
    let gbb = layout::group_block_bytes(ty);
    let mut acc = [0.0f32; GROUP];
    for (gb, xb) in g.chunks_exact(gbb).zip(x) {
        // The weights are `d * (u - k)` (Q4_0, Q5_0, Q8_0: the offset `k`
        // goes into the integer sum) or `d * u + m` (Q4_1, Q5_1: `m * sum x`
        // in float).
        let off = match ty {
            QuantType::Q4_0 => xb.off4(),
            QuantType::Q5_0 => xb.off5(),
            QuantType::Q8_0 => xb.off8,
            QuantType::Q4_1
            | QuantType::Q5_1
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K => 0,
        };
        for (lane, a) in acc.iter_mut().enumerate() {
            let d = f16_at(gb, 2 * lane);
            let isum: i32 = (0..QK)
                .map(|j| i32::from(layout::unsigned_weight(ty, gb, lane, j)) * i32::from(xb.qs[j]))
                .sum();
            *a = ((isum + off) as f32).mul_add(d * xb.d, *a);
            if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
                *a = f16_at(gb, 2 * GROUP + 2 * lane).mul_add(xb.s, *a);
            }
        }
    }
    acc
}

/// `dot_group` for a K-quant group (`crate::klayout`), sub-block by
/// sub-block against the Q8 activation blocks, as the AVX2 tiles do:
/// Q4_K and Q5_K as Q4_1 with the scale `d * sc` and the offset `-(dmin * m)`
/// made in f32 per sub-block; Q6_K's sum exact in integers, each half
/// times its scale, less `32 * sc * sum(x)` of the half.
pub fn dot_group_k(ty: QuantType, g: &[u8], x: &[Q8Block]) -> [f32; GROUP] {
    let sbb = klayout::super_bytes(ty);
    let mut acc = [0.0f32; GROUP];
    for (gsb, xs) in g.chunks_exact(sbb).zip(x.chunks_exact(QK_K / QK)) {
        for (j, xb) in xs.iter().enumerate() {
            let sub = &gsb[klayout::sub_offset(ty, j)..];
            for (lane, a) in acc.iter_mut().enumerate() {
                let d = f16_at(gsb, 2 * lane);
                let dot = |ws: std::ops::Range<usize>| -> i32 {
                    ws.map(|w| {
                        let u = klayout::unsigned_weight(ty, gsb, lane, j, w);
                        i32::from(u) * i32::from(xb.qs[w])
                    })
                    .sum()
                };
                if klayout::has_min(ty) {
                    let dw = d * f32::from(sub[lane]);
                    let mw = -(f16_at(gsb, 2 * GROUP + 2 * lane) * f32::from(sub[GROUP + lane]));
                    *a = (dot(0..QK) as f32).mul_add(dw * xb.d, *a);
                    *a = mw.mul_add(xb.s, *a);
                } else {
                    let (lo, hi) = (
                        i32::from(sub[lane] as i8),
                        i32::from(sub[GROUP + lane] as i8),
                    );
                    let [h0, h1] = xb.halves.map(i32::from);
                    let isum = lo * dot(0..16) + hi * dot(16..QK) - 32 * (lo * h0 + hi * h1);
                    *a = (isum as f32).mul_add(d * xb.d, *a);
                }
            }
        }
    }
    acc
}
