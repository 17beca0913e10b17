//! AVX2 tiles for K-quant weights in their own super-blocks
//! (`crate::klayout`): one group of 16 weight rows against `MR` activation
//! rows, two 256-bit halves of 8 rows, sub-block by sub-block against the
//! Q8 activation blocks (32 weights each). The CPU paths above AVX2
//! (AVX-512 VNNI, AMX) run these tiles too for these formats.
//!
//! - Q4_K: the nibbles as Q4_1's (`x86::half_sums`), their 16-bit pair
//!   sums multiplied by the row's sub-block scale in the widening `madd`
//!   (at most 2 * 30480 * 63), summed over the super-block in i32 with the
//!   mins times the activation sums, then two fused multiply-adds per
//!   super-block, as ggml computes it against Q8_K.
//! - Q5_K: as Q4_K, with the fifth bits added and the sums widened as
//!   Q5_0's (`x86::half_sums`), four chunks at a time.
//! - IQ4_XS: the 4-bit indices mapped to their signed table values
//!   (`pshufb`), multiplied as Q8_0's signed weights (`x86::half_sums`:
//!   the sign moved onto the activations, pairs of at most 2 * 127 * 127)
//!   and widened chunk by chunk with the row's signed sub-block scale in
//!   the `madd` (at most 8 * 16 * 32258 * 32 a super-block), then one
//!   fused multiply-add per super-block, as Q6_K.
//! - Q6_K: 6-bit unsigned quants (nibble | high bits << 4); the products
//!   of each 8-byte pair (`maddubs`, at most 2 * 63 * 127) summed two
//!   chunks at a time in 16 bits (at most 32004), then multiplied by the
//!   row's scale of that half (`madd` with the scale in both 16-bit
//!   halves of the lane), exact; the offset `32 * (sc_lo * h0 + sc_hi *
//!   h1)` from the activation block's half sums in one more `madd`; one
//!   fused multiply-add per super-block.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::x86::{
    IQ4XS, Q5K, Q8_0, act_chunk, add_high_bits, half_sums, iq4_values, nibbles, prefetch_ahead, ty,
};
use crate::klayout::{
    Q6_HIGH, SUB_SCALES, has_min, sub_bytes, sub_offset, sub_quants, super_bytes,
};
use crate::layout::GROUP;
use crate::quant::Q8Block;

/// Eight scale bytes, signed (Q6_K) or not, each in both 16-bit halves of
/// its lane (a `madd` multiplier).
///
/// # Safety
/// AVX2 must be enabled; 8 bytes at `p` must be readable.
#[inline(always)]
unsafe fn scale_pairs<const SIGNED: bool>(p: *const u8) -> __m256i {
    unsafe {
        let b = _mm_loadl_epi64(p.cast());
        let e = if SIGNED {
            _mm256_cvtepi8_epi32(b)
        } else {
            _mm256_cvtepu8_epi32(b)
        };
        _mm256_blend_epi16::<0xAA>(e, _mm256_slli_epi32::<16>(e))
    }
}

/// Q6_K's eight chunks of one half: the low nibbles with the high bits
/// put at bits 4-5 (see `crate::klayout`).
///
/// # Safety
/// AVX2 must be enabled; `sub` must point at a whole Q6_K sub-block.
#[inline(always)]
unsafe fn q6_weights(sub: *const u8, half: usize) -> [__m256i; 8] {
    unsafe {
        let mut wv = nibbles(sub.add(SUB_SCALES), half);
        let m = _mm256_set1_epi8(0x30);
        for p in 0..2 {
            let hb = _mm256_loadu_si256(sub.add(Q6_HIGH + 64 * p + 32 * half).cast());
            let parts = [
                _mm256_slli_epi16::<4>(hb),
                _mm256_slli_epi16::<2>(hb),
                hb,
                _mm256_srli_epi16::<2>(hb),
            ];
            for (s, part) in parts.into_iter().enumerate() {
                let c = 4 * p + s;
                wv[c] = _mm256_or_si256(wv[c], _mm256_and_si256(part, m));
            }
        }
        wv
    }
}

/// Q6_K's exact integer sum of one half block's eight rows with one
/// activation block (see the module header).
///
/// # Safety
/// AVX2 must be enabled; `xb` must point at a valid block.
#[inline(always)]
unsafe fn q6_sums(
    wv: &[__m256i; 8],
    xb: *const Q8Block,
    (s_lo, s_hi, pair): (__m256i, __m256i, __m256i),
) -> __m256i {
    unsafe {
        let xc = |c| _mm256_set1_epi32(act_chunk(xb, c));
        let p = |c: usize| {
            _mm256_add_epi16(
                _mm256_maddubs_epi16(wv[c], xc(c)),
                _mm256_maddubs_epi16(wv[c + 1], xc(c + 1)),
            )
        };
        let lo = _mm256_add_epi32(_mm256_madd_epi16(p(0), s_lo), _mm256_madd_epi16(p(2), s_lo));
        let hi = _mm256_add_epi32(_mm256_madd_epi16(p(4), s_hi), _mm256_madd_epi16(p(6), s_hi));
        let [h0, h1] = (*xb).halves;
        let h = _mm256_set1_epi32(i32::from(h0 as u16) | (i32::from(h1) << 16));
        let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(pair, h));
        _mm256_sub_epi32(_mm256_add_epi32(lo, hi), off)
    }
}

/// The integer sums of one group super-block's two halves against `MR`
/// activation rows: per row and half, `sum_j sc_j * dot_j` (Q6_K: with
/// its offset) and, for the formats with mins, `sum_j m_j * sum(x_j)`.
/// At most 8 * 49M (Q6_K) in magnitude: exact in i32.
///
/// # Safety
/// AVX2 must be enabled; `sb` must point at a whole group super-block of
/// format `K` and every `x[i]` at its 8 activation blocks.
#[inline(always)]
unsafe fn super_sums<const K: u8, const MR: usize>(
    sb: *const u8,
    x: [*const Q8Block; MR],
) -> [[[__m256i; 2]; 2]; MR] {
    // SAFETY (whole body): AVX2 is enabled; sub-block `j` and activation
    // block `j` are in bounds (caller contract).
    unsafe {
        let kt = ty(K);
        let mut sums = [[[_mm256_setzero_si256(); 2]; 2]; MR];
        for j in 0..8 {
            let sub = sb.add(sub_offset(kt, j));
            prefetch_ahead(sub, sub_bytes(kt), MR);
            for h in 0..2 {
                if K == IQ4XS {
                    let sc = scale_pairs::<true>(sub.add(8 * h));
                    let mut wv = nibbles(sub.add(sub_quants(kt)), h);
                    iq4_values(&mut wv);
                    for (i, acc) in sums.iter_mut().enumerate() {
                        let xb = x[i].add(j);
                        let xc = |c| _mm256_set1_epi32(act_chunk(xb, c));
                        let v = half_sums::<Q8_0>(&wv, xc, _mm256_setzero_si256(), sc);
                        acc[0][h] = _mm256_add_epi32(acc[0][h], v);
                    }
                    continue;
                }
                if !has_min(kt) {
                    let s_lo = scale_pairs::<true>(sub.add(8 * h));
                    let s_hi = scale_pairs::<true>(sub.add(GROUP + 8 * h));
                    let pair = _mm256_blend_epi16::<0xAA>(s_lo, s_hi);
                    let wv = q6_weights(sub, h);
                    for (i, acc) in sums.iter_mut().enumerate() {
                        let v = q6_sums(&wv, x[i].add(j), (s_lo, s_hi, pair));
                        acc[0][h] = _mm256_add_epi32(acc[0][h], v);
                    }
                    continue;
                }
                let sc = scale_pairs::<false>(sub.add(8 * h));
                let m = _mm256_cvtepu8_epi32(_mm_loadl_epi64(sub.add(GROUP + 8 * h).cast()));
                let mut wv = nibbles(sub.add(sub_quants(kt)), h);
                if K == Q5K {
                    add_high_bits(&mut wv, sub.add(SUB_SCALES), h);
                }
                for (i, acc) in sums.iter_mut().enumerate() {
                    let xb = x[i].add(j);
                    let xc = |c| _mm256_set1_epi32(act_chunk(xb, c));
                    let v = half_sums::<K>(&wv, xc, _mm256_setzero_si256(), sc);
                    let [h0, h1] = (*xb).halves;
                    let bsum = _mm256_set1_epi32(i32::from(h0) + i32::from(h1));
                    acc[0][h] = _mm256_add_epi32(acc[0][h], v);
                    acc[1][h] = _mm256_add_epi32(acc[1][h], _mm256_madd_epi16(m, bsum));
                }
            }
        }
        sums
    }
}

/// Computes `out[i * stride + lane] = dot(w[lane], x[i])` for one 16-row
/// K-quant group (format tag `K`: `x86::Q4K`, `Q5K`, `Q6K` or `IQ4XS`), bit for bit
/// as `scalar::dot_group_k`: the integer sums of each super-block
/// (`super_sums`), then `d * xd` times the scaled sum and `-dmin * xd`
/// times the mins' sum, the activation scale `xd` being one per 256
/// (`QuantType::act_span`), as ggml's `vec_dot_q4_K_q8_K`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `g` must point at `nb / 8`
/// group super-blocks of format `K`, every `x[i]` at `nb` Q8 blocks
/// (each eight sharing a scale), and `out + i * stride` at 16 writable
/// floats for every `i < MR`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn group_k_avx2<const K: u8, const MR: usize>(
    g: *const u8,
    x: [*const Q8Block; MR],
    nb: usize,
    (out, stride): (*mut f32, usize),
) {
    let kt = ty(K);
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for s in 0..nb / 8 {
        // SAFETY (whole loop body): super-block `s` of the group and blocks
        // `8s..8s + 8` of every activation row are in bounds (caller
        // contract).
        let sb = unsafe { g.add(s * super_bytes(kt)) };
        let half_f16 = |at: usize, h: usize| {
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(sb.add(at + 16 * h).cast()) })
        };
        let d = [half_f16(0, 0), half_f16(0, 1)];
        let neg = _mm256_set1_ps(-0.0);
        let neg_dmin = [0, 1].map(|h| _mm256_xor_ps(half_f16(2 * GROUP, h), neg));
        let xs: [*const Q8Block; MR] = std::array::from_fn(|i| unsafe { x[i].add(8 * s) });
        let sums = unsafe { super_sums::<K, MR>(sb, xs) };
        for ((a, sum), xb) in acc.iter_mut().zip(&sums).zip(xs) {
            let xd = _mm256_set1_ps(unsafe { (*xb).d });
            for h in 0..2 {
                let v = _mm256_cvtepi32_ps(sum[0][h]);
                a[h] = _mm256_fmadd_ps(v, _mm256_mul_ps(d[h], xd), a[h]);
                if has_min(kt) {
                    let v = _mm256_cvtepi32_ps(sum[1][h]);
                    a[h] = _mm256_fmadd_ps(v, _mm256_mul_ps(neg_dmin[h], xd), a[h]);
                }
            }
        }
    }
    for (i, a) in acc.into_iter().enumerate() {
        // SAFETY: row `i` of the output holds 16 floats (caller contract).
        unsafe {
            _mm256_storeu_ps(out.add(i * stride), a[0]);
            _mm256_storeu_ps(out.add(i * stride + 8), a[1]);
        }
    }
}
