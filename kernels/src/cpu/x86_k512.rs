//! AVX-512 VNNI tiles for the super-block formats (Q4_K, Q5_K, Q6_K,
//! IQ4_XS in `crate::klayout`): one group of 16 weight rows in one 512-bit
//! vector (row `r` in lane `r`) against `MR` activation rows, the same
//! integer sums as the AVX2 tiles (`x86_k`) and the scalar path, so every
//! path gives the same bits.
//!
//! Per 32-weight sub-block and activation row, eight `vpdpbusd` (four
//! unsigned weight bytes times four activation bytes, summed into each
//! row's i32) give the sub-block's dot product, which one `vpmulld` scales
//! by the row's sub-block scale:
//! - Q4_K: nibbles, the two chains of `vpdpbusd` small enough to be scaled
//!   as 16-bit pairs in one `vpdpwssd` instead (a `vpmulld` is two uops on
//!   the port the `vpdpbusd`s need); Q5_K: with the fifth bits. The mins
//!   times the activation blocks' sums once per super-block, four
//!   `vpdpwssd` of 16-bit pairs;
//! - Q6_K: 6-bit quants in two chains of 16 weights, each started at
//!   `-32 * sum(x)` of its half (the quants' offset) and scaled by that
//!   half's scale;
//! - IQ4_XS: the indices mapped to their table values `+ 128` (`vpshufb`),
//!   the chain started at `-128 * sum(x)` (`Q8Block::off8`).
//!
//! The sums stay exact in i32 (at most 8 sub-blocks of 32 * 241 * 127 * 63).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::x86::{
    IQ4XS, Q4K, Q5K, Q6K, act_chunk, add_high_bits512, iq4_table, nibbles512, prefetch_ahead, ty,
};
use crate::klayout::{
    Q6_HIGH, SUB_SCALES, has_min, sub_bytes, sub_offset, sub_quants, super_bytes,
};
use crate::layout::GROUP;
use crate::quant::Q8Block;

/// Q6_K's high two bits from its two loads at `Q6_HIGH` (in load `p`, bits
/// `2s..2s + 2` of a row's byte `k` belong to weight `4(4p + s) + k`), put
/// at bits 4-5 of each chunk's bytes.
///
/// # Safety
/// AVX-512 F/BW must be enabled; `sub` must point at a whole sub-block.
#[inline(always)]
unsafe fn add_q6_high512(wv: &mut [__m512i; 8], sub: *const u8) {
    unsafe {
        let m = _mm512_set1_epi8(0x30);
        for p in 0..2 {
            let hb = _mm512_loadu_si512(sub.add(Q6_HIGH + 64 * p).cast());
            let parts = [
                _mm512_slli_epi16::<4>(hb),
                _mm512_slli_epi16::<2>(hb),
                hb,
                _mm512_srli_epi16::<2>(hb),
            ];
            for (s, part) in parts.into_iter().enumerate() {
                let c = 4 * p + s;
                wv[c] = _mm512_or_si512(wv[c], _mm512_and_si512(part, m));
            }
        }
    }
}

/// The unsigned weight bytes of sub-block `sub` of format `K`.
///
/// # Safety
/// AVX-512 F/BW must be enabled; `sub` must point at a whole sub-block.
#[inline(always)]
unsafe fn weights<const K: u8>(sub: *const u8) -> [__m512i; 8] {
    unsafe {
        let kt = ty(K);
        let mut wv = nibbles512(sub.add(sub_quants(kt)));
        if K == Q5K {
            add_high_bits512(&mut wv, sub.add(SUB_SCALES));
        } else if K == Q6K {
            add_q6_high512(&mut wv, sub);
        } else if K == IQ4XS {
            let t = _mm512_broadcast_i32x4(iq4_table(0x80));
            for w in wv.iter_mut() {
                *w = _mm512_shuffle_epi8(t, *w);
            }
        }
        wv
    }
}

/// `sum_c w[c] . x[c]` over chunks `cs` in two chains (even and odd
/// chunks), the first started at `init`.
///
/// # Safety
/// AVX-512 VNNI must be enabled; `xb` must point at a valid block.
#[inline(always)]
unsafe fn chains(
    wv: &[__m512i; 8],
    xb: *const Q8Block,
    cs: std::ops::Range<usize>,
    init: i32,
) -> (__m512i, __m512i) {
    unsafe {
        let mut s0 = _mm512_set1_epi32(init);
        let mut s1 = _mm512_setzero_si512();
        for c in cs.step_by(2) {
            s0 = _mm512_dpbusd_epi32(s0, wv[c], _mm512_set1_epi32(act_chunk(xb, c)));
            s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], _mm512_set1_epi32(act_chunk(xb, c + 1)));
        }
        (s0, s1)
    }
}

/// `init + sum_c w[c] . x[c]` over chunks `cs`.
///
/// # Safety
/// As `chains`.
#[inline(always)]
unsafe fn dot(
    wv: &[__m512i; 8],
    xb: *const Q8Block,
    cs: std::ops::Range<usize>,
    init: i32,
) -> __m512i {
    unsafe {
        let (s0, s1) = chains(wv, xb, cs, init);
        _mm512_add_epi32(s0, s1)
    }
}

/// Sixteen bytes at `p` as i32 lanes, signed or not.
///
/// # Safety
/// AVX-512 F must be enabled; 16 bytes at `p` must be readable.
#[inline(always)]
unsafe fn lanes<const SIGNED: bool>(p: *const u8) -> __m512i {
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        if SIGNED {
            _mm512_cvtepi8_epi32(b)
        } else {
            _mm512_cvtepu8_epi32(b)
        }
    }
}

/// Two i32 vectors whose lanes fit in 16 bits as one of 16-bit pairs
/// (`lo` in the low half of each lane), for `vpdpwssd`.
///
/// # Safety
/// AVX-512 F/BW must be enabled.
#[inline(always)]
unsafe fn pairs(lo: __m512i, hi: __m512i) -> __m512i {
    unsafe { _mm512_mask_blend_epi16(0xAAAA_AAAA, lo, _mm512_bslli_epi128::<2>(hi)) }
}

/// The rows' mins of a super-block (Q4_K, Q5_K) as four vectors of
/// 16-bit pairs: sub-blocks `2p` and `2p + 1` in vector `p`.
///
/// # Safety
/// AVX-512 F/BW must be enabled; `sb` must point at a whole group
/// super-block of format `K`.
#[inline(always)]
unsafe fn min_pairs<const K: u8>(sb: *const u8) -> [__m512i; 4] {
    unsafe {
        let at = |j: usize| lanes::<false>(sb.add(sub_offset(ty(K), j) + GROUP));
        std::array::from_fn(|p| pairs(at(2 * p), at(2 * p + 1)))
    }
}

/// `sum_j m_j * sum(x_j)` over a super-block's eight sub-blocks, for
/// activation row `xs` (four `vpdpwssd`: each activation block's sum is at
/// most 32 * 127, a 16-bit value).
///
/// # Safety
/// AVX-512 VNNI must be enabled; `xs` must point at 8 valid blocks.
#[inline(always)]
unsafe fn min_sum(mins: &[__m512i; 4], xs: *const Q8Block) -> __m512i {
    unsafe {
        let bsum = |j: usize| {
            let [h0, h1] = (*xs.add(j)).halves;
            (i32::from(h0) + i32::from(h1)) as u16
        };
        let mut acc = _mm512_setzero_si512();
        for (p, m) in mins.iter().enumerate() {
            let b = u32::from(bsum(2 * p)) | (u32::from(bsum(2 * p + 1)) << 16);
            acc = _mm512_dpwssd_epi32(acc, *m, _mm512_set1_epi32(b as i32));
        }
        acc
    }
}

/// One sub-block's scaled integer sum for one activation row, added to
/// `acc`: Q4_K's two chains (each at most 16 * 15 * 127, a 16-bit value)
/// as 16-bit pairs times the scale pairs in one `vpdpwssd`; the other
/// formats' dot product (with its offset) times the scale in `vpmulld`.
///
/// # Safety
/// AVX-512 F/BW/VNNI must be enabled; `xb` must point at a valid block.
#[inline(always)]
unsafe fn scaled<const K: u8>(
    wv: &[__m512i; 8],
    xb: *const Q8Block,
    (sc, other, sc_pairs): (__m512i, __m512i, __m512i),
    acc: __m512i,
) -> __m512i {
    unsafe {
        if K == Q4K {
            let (s0, s1) = chains(wv, xb, 0..8, 0);
            return _mm512_dpwssd_epi32(acc, pairs(s0, s1), sc_pairs);
        }
        let [h0, h1] = (*xb).halves.map(i32::from);
        let v = if K == Q6K {
            let lo = dot(wv, xb, 0..4, -32 * h0);
            let hi = dot(wv, xb, 4..8, -32 * h1);
            _mm512_add_epi32(_mm512_mullo_epi32(lo, sc), _mm512_mullo_epi32(hi, other))
        } else {
            let init = if K == IQ4XS { (*xb).off8 } else { 0 };
            _mm512_mullo_epi32(dot(wv, xb, 0..8, init), sc)
        };
        _mm512_add_epi32(acc, v)
    }
}

/// The integer sums of one group super-block against `MR` activation
/// rows: per row, `sum_j sc_j * dot_j` (with each format's offset) and,
/// for the formats with mins, `sum_j m_j * sum(x_j)`; as `x86_k`'s.
///
/// # Safety
/// AVX-512 F/BW/VNNI must be enabled; `sb` must point at a whole group
/// super-block of format `K` and every `x[i]` at its 8 activation blocks.
#[inline(always)]
unsafe fn super_sums<const K: u8, const MR: usize>(
    sb: *const u8,
    x: [*const Q8Block; MR],
) -> [[__m512i; 2]; MR] {
    // SAFETY (whole body): the features are enabled; sub-block `j` and
    // activation block `j` are in bounds (caller contract).
    unsafe {
        let kt = ty(K);
        let mut sums = [[_mm512_setzero_si512(); 2]; MR];
        for j in 0..8 {
            let sub = sb.add(sub_offset(kt, j));
            prefetch_ahead(sub, sub_bytes(kt), MR);
            let wv = weights::<K>(sub);
            let sc = if K == Q6K || K == IQ4XS {
                lanes::<true>(sub)
            } else {
                lanes::<false>(sub)
            };
            let other = lanes::<true>(sub.add(GROUP));
            let sc_pairs = _mm512_or_si512(sc, _mm512_slli_epi32::<16>(sc));
            for (i, acc) in sums.iter_mut().enumerate() {
                acc[0] = scaled::<K>(&wv, x[i].add(j), (sc, other, sc_pairs), acc[0]);
            }
        }
        if has_min(kt) {
            let mins = min_pairs::<K>(sb);
            for (acc, xs) in sums.iter_mut().zip(x) {
                acc[1] = min_sum(&mins, xs);
            }
        }
        sums
    }
}

/// Computes `out[i * stride + lane] = dot(w[lane], x[i])` for one 16-row
/// group of a super-block format (tag `K`: `x86::Q4K`, `Q5K`, `Q6K` or
/// `IQ4XS`), bit for bit as `scalar::dot_group_k` and
/// `x86_k::group_k_avx2`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `g`
/// must point at `nb / 8` group super-blocks of format `K`, every `x[i]`
/// at `nb` Q8 blocks (each eight sharing a scale), and `out + i * stride`
/// at 16 writable floats for every `i < MR`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn group_k_vnni<const K: u8, const MR: usize>(
    g: *const u8,
    x: [*const Q8Block; MR],
    nb: usize,
    (out, stride): (*mut f32, usize),
) {
    let kt = ty(K);
    let mut acc = [_mm512_setzero_ps(); MR];
    for s in 0..nb / 8 {
        // SAFETY (whole loop body): super-block `s` of the group and blocks
        // `8s..8s + 8` of every activation row are in bounds (caller
        // contract).
        let sb = unsafe { g.add(s * super_bytes(kt)) };
        let f16s = |at: usize| _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(sb.add(at).cast()) });
        let d = f16s(0);
        let sign = _mm512_set1_epi32(i32::MIN);
        let neg_dmin =
            _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(f16s(2 * GROUP)), sign));
        let xs: [*const Q8Block; MR] = std::array::from_fn(|i| unsafe { x[i].add(8 * s) });
        let sums = unsafe { super_sums::<K, MR>(sb, xs) };
        for ((a, sum), xb) in acc.iter_mut().zip(&sums).zip(xs) {
            let xd = _mm512_set1_ps(unsafe { (*xb).d });
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[0]), _mm512_mul_ps(d, xd), *a);
            if has_min(kt) {
                let v = _mm512_cvtepi32_ps(sum[1]);
                *a = _mm512_fmadd_ps(v, _mm512_mul_ps(neg_dmin, xd), *a);
            }
        }
    }
    for (i, a) in acc.into_iter().enumerate() {
        // SAFETY: row `i` of the output holds 16 floats (caller contract).
        unsafe { _mm512_storeu_ps(out.add(i * stride), a) };
    }
}
