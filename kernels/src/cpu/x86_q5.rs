//! AVX2 tiles for Q5_0 and Q5_1 weights in the interleaved 16-row layout
//! (`crate::layout`): one group of 16 weight rows against `MR` activation
//! rows, two 256-bit halves of 8 rows. The AVX-512 VNNI and AMX paths run
//! these tiles too for Q5.
//!
//! A weight is its nibble with the high bit put at bit 4 (one shift and
//! one mask per chunk from the group block's load of high bits), 0..32.
//! The products of each byte pair (`maddubs`) are summed four chunks at a
//! time in 16 bits (eight products of at most 31 * 127: 31496, exact),
//! then widened; Q5_0's `-16 * sum(x)` goes into the integer sum
//! (`Q8Block::off5`), Q5_1's min into the float one, as on the scalar
//! path, so the bits are the same.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::x86::{Q5_0, Q5_1, act_chunk, nibbles, prefetch_ahead, ty};
use crate::layout::{GROUP, group_block_bytes, high_offset, quants_offset};
use crate::quant::Q8Block;

/// The eight 5-bit chunks of one half (8 rows) of a group block.
///
/// # Safety
/// AVX2 must be enabled; `base` must point at a whole Q5 group block of
/// format `T`.
#[inline(always)]
unsafe fn q5_weights<const T: u8>(base: *const u8, half: usize) -> [__m256i; 8] {
    unsafe {
        let mut wv = nibbles(base.add(quants_offset(ty(T))), half);
        add_high_bits(&mut wv, base.add(high_offset(ty(T))), half);
        wv
    }
}

/// Puts the fifth bits of one half's eight chunks, from the 64-byte load
/// of high bits at `high` (bit `c` of a row's byte `k`: weight `4c + k`),
/// at bit 4 of the chunks' bytes.
///
/// # Safety
/// AVX2 must be enabled; 64 bytes at `high` must be readable.
#[inline(always)]
pub(crate) unsafe fn add_high_bits(wv: &mut [__m256i; 8], high: *const u8, half: usize) {
    unsafe {
        let hb = _mm256_loadu_si256(high.add(32 * half).cast());
        let parts = [
            _mm256_slli_epi16::<4>(hb),
            _mm256_slli_epi16::<3>(hb),
            _mm256_slli_epi16::<2>(hb),
            _mm256_slli_epi16::<1>(hb),
            hb,
            _mm256_srli_epi16::<1>(hb),
            _mm256_srli_epi16::<2>(hb),
            _mm256_srli_epi16::<3>(hb),
        ];
        let m = _mm256_set1_epi8(0x10);
        for (w, part) in wv.iter_mut().zip(parts) {
            *w = _mm256_or_si256(*w, _mm256_and_si256(part, m));
        }
    }
}

/// The integer sums of one half block's eight rows of 5-bit weights with
/// one activation block (no offset), each row's times its 16-bit
/// multiplier in `mul` (1, or Q5_K's sub-block scale: at most 2 * 31496
/// * 63 a `madd`).
///
/// # Safety
/// AVX2 must be enabled; `xb` must point at a valid block.
#[inline(always)]
pub(crate) unsafe fn wide_sums(wv: &[__m256i; 8], xb: *const Q8Block, mul: __m256i) -> __m256i {
    unsafe {
        let xc = |c| _mm256_set1_epi32(act_chunk(xb, c));
        let four = |c: usize| {
            let p0 = _mm256_add_epi16(
                _mm256_maddubs_epi16(wv[c], xc(c)),
                _mm256_maddubs_epi16(wv[c + 1], xc(c + 1)),
            );
            let p1 = _mm256_add_epi16(
                _mm256_maddubs_epi16(wv[c + 2], xc(c + 2)),
                _mm256_maddubs_epi16(wv[c + 3], xc(c + 3)),
            );
            _mm256_madd_epi16(_mm256_add_epi16(p0, p1), mul)
        };
        _mm256_add_epi32(four(0), four(4))
    }
}

/// `wide_sums` with Q5_0's offset.
///
/// # Safety
/// AVX2 must be enabled; `xb` must point at a valid block.
#[inline(always)]
unsafe fn q5_sums<const T: u8>(wv: &[__m256i; 8], xb: *const Q8Block) -> __m256i {
    unsafe {
        let off = if T == Q5_0 { (*xb).off5() } else { 0 };
        let ones = _mm256_set1_epi16(1);
        _mm256_add_epi32(wide_sums(wv, xb, ones), _mm256_set1_epi32(off))
    }
}

/// Computes `out[i * stride + lane] = dot(w[lane], x[i])` for one 16-row
/// Q5 group (format tag `T`: `x86::Q5_0` or `x86::Q5_1`), bit for bit as
/// `scalar::dot_group`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `g` must point at `nb` group
/// blocks of format `T`, every `x[i]` at `nb` Q8 blocks, and
/// `out + i * stride` at 16 writable floats for every `i < MR`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn group_q5_avx2<const T: u8, const MR: usize>(
    g: *const u8,
    x: [*const Q8Block; MR],
    nb: usize,
    (out, stride): (*mut f32, usize),
) {
    let gbb = group_block_bytes(ty(T));
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for b in 0..nb {
        // SAFETY (whole loop body): block `b` of the group and of every
        // activation row is in bounds (caller contract).
        let base = unsafe { g.add(b * gbb) };
        prefetch_ahead(base, gbb, MR);
        for h in 0..2 {
            let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base.add(16 * h).cast()) });
            let mw = if T == Q5_1 {
                _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base.add(2 * GROUP + 16 * h).cast()) })
            } else {
                _mm256_setzero_ps()
            };
            let wv = unsafe { q5_weights::<T>(base, h) };
            for (i, a) in acc.iter_mut().enumerate() {
                let xb = unsafe { x[i].add(b) };
                let sums = _mm256_cvtepi32_ps(unsafe { q5_sums::<T>(&wv, xb) });
                let (xd, xs) = unsafe { ((*xb).d, (*xb).s) };
                a[h] = _mm256_fmadd_ps(sums, _mm256_mul_ps(dw, _mm256_set1_ps(xd)), a[h]);
                if T == Q5_1 {
                    a[h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs), a[h]);
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
