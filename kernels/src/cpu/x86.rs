//! x86-64 SIMD tiles for quantized matmul: AVX2 (`maddubs`) and AVX-512
//! VNNI (`vpdpbusd` on 256-bit lanes). A tile computes `NR` weight rows
//! against `MR` activation rows, so each unpacked weight block is reused
//! `MR` times from registers and each activation block `NR` times.
//!
//! Unsigned-by-signed byte products: Q4 nibbles are already unsigned; for
//! Q8_0 weights the sign is moved onto the activation (`|w| * sign(x, w)`).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::quant::{Q8Block, QuantType};

/// `QuantType` as a const-generic tag (branches fold away per format).
pub const Q4_0: u8 = 0;
pub const Q4_1: u8 = 1;
pub const Q8_0: u8 = 2;

pub const fn tag(ty: QuantType) -> u8 {
    match ty {
        QuantType::Q4_0 => Q4_0,
        QuantType::Q4_1 => Q4_1,
        QuantType::Q8_0 => Q8_0,
    }
}

const fn block_bytes(t: u8) -> usize {
    match t {
        Q4_0 => 18,
        Q4_1 => 20,
        _ => 34,
    }
}

/// Generates a tile function for one instruction set; `$dot` turns
/// (unsigned a, signed b) byte vectors into eight i32 lane sums.
macro_rules! tile_fn {
    ($name:ident, $features:literal, $dot:expr) => {
        /// Computes `out[r][i] = dot(w[r], x[i])` for an `NR x MR` tile.
        ///
        /// # Safety
        /// The CPU must support the enabled features; every `w[r]` must point
        /// at `nb` blocks of format `T` and every `x[i]` at `nb` Q8 blocks.
        #[target_feature(enable = $features)]
        pub unsafe fn $name<const T: u8, const NR: usize, const MR: usize>(
            w: [*const u8; NR],
            x: [*const Q8Block; MR],
            nb: usize,
        ) -> [[f32; MR]; NR] {
            let dot = $dot;
            let m4 = _mm_set1_epi8(0x0F);
            let mut acc = [[_mm256_setzero_ps(); MR]; NR];
            let mut off = [[0.0f32; MR]; NR];
            for b in 0..nb {
                let mut wv = [_mm256_setzero_si256(); NR];
                let mut d = [0.0f32; NR];
                let mut o = [0.0f32; NR];
                for r in 0..NR {
                    // SAFETY: block `b` of row `r` is in bounds (caller contract).
                    let blk = unsafe { w[r].add(b * block_bytes(T)) };
                    let scales = unsafe {
                        _mm_cvtph_ps(_mm_cvtsi32_si128(blk.cast::<i32>().read_unaligned()))
                    };
                    d[r] = _mm_cvtss_f32(scales);
                    match T {
                        Q4_0 | Q4_1 => {
                            let qs = unsafe { blk.add(if T == Q4_1 { 4 } else { 2 }) };
                            let raw = unsafe { _mm_loadu_si128(qs.cast()) };
                            let lo = _mm_and_si128(raw, m4);
                            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
                            wv[r] = _mm256_set_m128i(hi, lo);
                            o[r] = if T == Q4_1 {
                                _mm_cvtss_f32(_mm_shuffle_ps(scales, scales, 1))
                            } else {
                                -8.0 * d[r]
                            };
                        }
                        _ => wv[r] = unsafe { _mm256_loadu_si256(blk.add(2).cast()) },
                    }
                }
                for i in 0..MR {
                    // SAFETY: block `b` of activation row `i` is in bounds.
                    let xb = unsafe { &*x[i].add(b) };
                    let xv = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
                    for r in 0..NR {
                        let p = if T == Q8_0 {
                            dot(_mm256_sign_epi8(wv[r], wv[r]), _mm256_sign_epi8(xv, wv[r]))
                        } else {
                            dot(wv[r], xv)
                        };
                        let scale = _mm256_set1_ps(d[r] * xb.d);
                        acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r][i]);
                        off[r][i] += o[r] * xb.s;
                    }
                }
            }
            let mut out = [[0.0f32; MR]; NR];
            for r in 0..NR {
                for i in 0..MR {
                    out[r][i] = hsum(acc[r][i]) + off[r][i];
                }
            }
            out
        }
    };
}

#[inline(always)]
fn hsum(v: __m256) -> f32 {
    // SAFETY: only called from functions compiled with AVX enabled.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

// The closures are defined inside the generated functions, so they inherit
// those functions' target features (and the intrinsics are safe to call).
tile_fn!(tile_avx2, "avx2,fma,f16c", |a: __m256i, b: __m256i| {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
});

tile_fn!(
    tile_vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    |a: __m256i, b: __m256i| { _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b) }
);
