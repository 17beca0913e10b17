//! Portable integer dot products of one interleaved 16-row weight group
//! with one Q8 activation row: the fallback on CPUs without AVX2, and the
//! exact integer arithmetic the SIMD paths reproduce.

use crate::iquant::KVALUES;
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
            QuantType::Q8_0 | QuantType::Iq4Nl => xb.off8,
            QuantType::Q4_1
            | QuantType::Q5_1
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
            | QuantType::Iq4Xs => 0,
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

/// `dot_group` for a K-quant group (`crate::klayout`), as the AVX2 tiles
/// do: per super-block, the integer sum of each sub-block's dot product
/// times its scale (Q6_K: each half's, less `32 * sc * sum(x)` of the
/// half) and of its min times the activations' sum, then `d * xd` and
/// `-dmin * xd` times those, `xd` the activations' one scale per 256.
pub fn dot_group_k(ty: QuantType, g: &[u8], x: &[Q8Block]) -> [f32; GROUP] {
    let sbb = klayout::super_bytes(ty);
    let mut acc = [0.0f32; GROUP];
    for (gsb, xs) in g.chunks_exact(sbb).zip(x.chunks_exact(QK_K / QK)) {
        let xd = xs[0].d;
        debug_assert!(xs.iter().all(|b| b.d == xd), "one activation scale per 256");
        for (lane, a) in acc.iter_mut().enumerate() {
            let (isum, msum) = super_sums(ty, gsb, xs, lane);
            *a = (isum as f32).mul_add(f16_at(gsb, 2 * lane) * xd, *a);
            if klayout::has_min(ty) {
                let neg_dmin = -f16_at(gsb, 2 * GROUP + 2 * lane);
                *a = (msum as f32).mul_add(neg_dmin * xd, *a);
            }
        }
    }
    acc
}

/// Lane `lane`'s integer sums over one group super-block (see
/// `dot_group_k`): the scaled dot products, and the mins' sum (IQ4_XS:
/// its table values times the activations, times the signed scale).
fn super_sums(ty: QuantType, gsb: &[u8], xs: &[Q8Block], lane: usize) -> (i32, i32) {
    let (mut isum, mut msum) = (0i32, 0i32);
    for (j, xb) in xs.iter().enumerate() {
        let sub = &gsb[klayout::sub_offset(ty, j)..];
        let dot = |ws: std::ops::Range<usize>| -> i32 {
            ws.map(|w| {
                let u = klayout::unsigned_weight(ty, gsb, lane, j, w);
                i32::from(u) * i32::from(xb.qs[w])
            })
            .sum()
        };
        let [h0, h1] = xb.halves.map(i32::from);
        if ty == QuantType::Iq4Xs {
            let dot: i32 = (0..QK)
                .map(|w| {
                    let i = klayout::unsigned_weight(ty, gsb, lane, j, w);
                    i32::from(KVALUES[usize::from(i)]) * i32::from(xb.qs[w])
                })
                .sum();
            isum += i32::from(sub[lane] as i8) * dot;
        } else if klayout::has_min(ty) {
            isum += i32::from(sub[lane]) * dot(0..QK);
            msum += i32::from(sub[GROUP + lane]) * (h0 + h1);
        } else {
            let (lo, hi) = (
                i32::from(sub[lane] as i8),
                i32::from(sub[GROUP + lane] as i8),
            );
            isum += lo * dot(0..16) + hi * dot(16..QK) - 32 * (lo * h0 + hi * h1);
        }
    }
    (isum, msum)
}
