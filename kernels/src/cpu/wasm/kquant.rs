//! WebAssembly SIMD128 dot products of one K-quant weight group
//! (`crate::klayout`: 16 rows, super-blocks of 256 weights in eight
//! sub-blocks of 32) with up to four Q8 activation rows, bit for bit
//! `scalar::dot_group_k`: per sub-block the same integer dot products
//! (`i32x4.dot_i16x8_s`, as the 32-weight formats in `super`) times the
//! sub-block's integer scales, added into the super-block's integer sums,
//! then the same two fused multiply-adds a super-block. Q4_K, Q5_K and
//! Q6_K; IQ4_XS runs `scalar`.

use core::arch::wasm32::*;

use super::{Spread, f16x4, fifth_bits, fma, lanes, load, nibbles, pair_up};
use crate::klayout;
use crate::kquant::QK_K;
use crate::layout::GROUP;
use crate::quant::{Q8Block, QK, QuantType};

/// Activation blocks of a super-block.
const PER: usize = QK_K / QK;

/// Whether `ty` has a SIMD128 path here.
pub fn supports(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4K | QuantType::Q5K | QuantType::Q6K)
}

/// `R` activation rows against K-quant group `g`, a quarter of the rows
/// at a time, super-block by super-block.
#[inline(always)]
pub(super) fn tile<const R: usize>(
    ty: QuantType,
    g: &[u8],
    x: &[&[Q8Block]],
    spreads: &[&[Spread]],
    out: &mut [[f32; GROUP]],
) {
    let sbb = klayout::super_bytes(ty);
    let supers = g.len() / sbb;
    assert!((0..R).all(|r| x[r].len() >= supers * PER && spreads[r].len() >= supers * PER));
    for quad in 0..GROUP / 4 {
        let mut acc = [f32x4_splat(0.0); R];
        for (s, gsb) in g.chunks_exact(sbb).enumerate() {
            let (mut isum, mut msum) = ([i32x4_splat(0); R], [i32x4_splat(0); R]);
            for j in 0..PER {
                let sub = &gsb[klayout::sub_offset(ty, j)..];
                let w = weights(ty, sub, quad);
                let b = s * PER + j;
                for r in 0..R {
                    let [d0, d1] = halves(&w, &spreads[r][b]);
                    let [h0, h1] = x[r][b].halves.map(i32::from);
                    let (sums, mins) = sub_sums(ty, sub, quad, [d0, d1], [h0, h1]);
                    isum[r] = i32x4_add(isum[r], sums);
                    msum[r] = i32x4_add(msum[r], mins);
                }
            }
            let d = f16x4(gsb, 8 * quad);
            for r in 0..R {
                let xd = f32x4_splat(x[r][s * PER].d);
                acc[r] = fma(f32x4_convert_i32x4(isum[r]), f32x4_mul(d, xd), acc[r]);
                if klayout::has_min(ty) {
                    let neg_dmin = f32x4_neg(f16x4(gsb, 2 * GROUP + 8 * quad));
                    acc[r] = fma(
                        f32x4_convert_i32x4(msum[r]),
                        f32x4_mul(neg_dmin, xd),
                        acc[r],
                    );
                }
            }
        }
        for r in 0..R {
            out[r][4 * quad..4 * quad + 4].copy_from_slice(&lanes(acc[r]));
        }
    }
}

/// The four rows' dot products of one sub-block with one activation
/// block: of its first 16 weights (chunks 0-3) and of its last 16.
#[inline(always)]
fn halves(w: &[v128; 8], xc: &Spread) -> [v128; 2] {
    std::array::from_fn(|h| {
        let (mut lo, mut hi) = (i32x4_splat(0), i32x4_splat(0));
        for c in 4 * h..4 * h + 4 {
            let (w01, w23) = (i16x8_extend_low_i8x16(w[c]), i16x8_extend_high_i8x16(w[c]));
            lo = i32x4_add(lo, i32x4_dot_i16x8(w01, xc[c]));
            hi = i32x4_add(hi, i32x4_dot_i16x8(w23, xc[c]));
        }
        pair_up(lo, hi)
    })
}

/// One sub-block's share of the four rows' integer sums, from its dot
/// products `dots` (each half's) and the activation block's `halves`:
/// `sc * dot` and the mins' `m * sum(x)` (Q4_K, Q5_K), or Q6_K's signed
/// half scales `lo * dot0 + hi * dot1 - 32 * (lo * h0 + hi * h1)`.
#[inline(always)]
fn sub_sums(
    ty: QuantType,
    sub: &[u8],
    quad: usize,
    dots: [v128; 2],
    halves: [i32; 2],
) -> (v128, v128) {
    let [d0, d1] = dots;
    let [h0, h1] = halves;
    if klayout::has_min(ty) {
        let sc = bytes4(sub, 4 * quad, false);
        let m = bytes4(sub, GROUP + 4 * quad, false);
        let sums = i32x4_mul(sc, i32x4_add(d0, d1));
        (sums, i32x4_mul(m, i32x4_splat(h0 + h1)))
    } else {
        let lo = bytes4(sub, 4 * quad, true);
        let hi = bytes4(sub, GROUP + 4 * quad, true);
        let dots = i32x4_add(i32x4_mul(lo, d0), i32x4_mul(hi, d1));
        let offs = i32x4_add(
            i32x4_mul(lo, i32x4_splat(32 * h0)),
            i32x4_mul(hi, i32x4_splat(32 * h1)),
        );
        (i32x4_sub(dots, offs), i32x4_splat(0))
    }
}

/// Bytes `at..at + 4` of `b` as four 32-bit lanes, sign-extended or not.
#[inline(always)]
fn bytes4(b: &[u8], at: usize, signed: bool) -> v128 {
    let word = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let v = u32x4_splat(word);
    if signed {
        i32x4_extend_low_i16x8(i16x8_extend_low_i8x16(v))
    } else {
        u32x4_extend_low_u16x8(u16x8_extend_low_u8x16(v))
    }
}

/// The eight chunks of rows `4 * quad..4 * quad + 4` of one sub-block, as
/// unsigned values below 64 (row `r` in bytes `4r..4r + 4`): the nibbles,
/// with Q5_K's fifth bits or Q6_K's high two bits put in.
#[inline(always)]
fn weights(ty: QuantType, sub: &[u8], quad: usize) -> [v128; 8] {
    let mut w = nibbles(sub, klayout::sub_quants(ty), quad);
    match ty {
        QuantType::Q5K => fifth_bits(&mut w, load(sub, klayout::SUB_SCALES + 16 * quad)),
        QuantType::Q6K => {
            // In load `p`, bits `2s..2s + 2` hold chunk `4p + s`'s high bits.
            for p in 0..2 {
                let high = load(sub, klayout::Q6_HIGH + 64 * p + 16 * quad);
                for s in 0..4 {
                    let at4 = if 2 * s <= 4 {
                        u8x16_shl(high, 4 - 2 * s as u32)
                    } else {
                        u8x16_shr(high, 2 * s as u32 - 4)
                    };
                    let c = 4 * p + s;
                    w[c] = v128_or(w[c], v128_and(at4, u8x16_splat(0x30)));
                }
            }
        }
        QuantType::Q4_0
        | QuantType::Q4_1
        | QuantType::Q5_0
        | QuantType::Q5_1
        | QuantType::Q8_0
        | QuantType::Iq4Nl
        | QuantType::Q4K
        | QuantType::Iq4Xs => {}
    }
    w
}

#[cfg(test)]
mod tests {
    use super::super::tests::check;
    use super::*;
    use crate::quant::{QMatrix, amax, quantize_block_q8_at};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const FORMATS: [QuantType; 3] = [QuantType::Q4K, QuantType::Q5K, QuantType::Q6K];

    /// Activation rows as the kernels quantize them for a K-quant: one
    /// scale per 256 values.
    fn activations(rng: &mut StdRng, rows: usize, cols: usize, scale: f32) -> Vec<Vec<Q8Block>> {
        (0..rows)
            .map(|_| {
                let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-scale..scale)).collect();
                x.chunks_exact(QK_K)
                    .flat_map(|s| {
                        let floor = amax(s);
                        s.chunks_exact(QK)
                            .map(move |b| quantize_block_q8_at(b, floor))
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_k_format_matches_scalar_bit_for_bit_for_every_tile() {
        let mut rng = StdRng::seed_from_u64(52);
        for ty in FORMATS {
            assert!(super::super::supports(ty));
            for (rows, cols, m) in [
                (16, 256, 1),
                (19, 512, 2),
                (40, 768, 3),
                (16, 256, 4),
                (33, 512, 9),
            ] {
                let v: Vec<f32> = (0..rows * cols)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let w = QMatrix::quantize(ty, rows, cols, &v).expect("quantize");
                check(&w, &activations(&mut rng, m, cols, 3.0), "random");
            }
        }
    }

    #[test]
    fn raw_k_blocks_with_every_scale_match_scalar() {
        // GGML super-blocks of random bytes: every sub-block scale and
        // min, and f16 scales that are subnormal, huge, infinite or NaN.
        let mut rng = StdRng::seed_from_u64(53);
        for ty in FORMATS {
            let (rows, cols) = (32, 512);
            let ggml: Vec<u8> = (0..rows * cols / QK_K * ty.block_bytes())
                .map(|_| rng.random())
                .collect();
            let w = QMatrix::new(ty, rows, cols, &ggml).expect("pack");
            for scale in [1e-30, 1.0, 1e30] {
                check(&w, &activations(&mut rng, 5, cols, scale), "raw");
            }
        }
    }
}
