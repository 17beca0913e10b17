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

/// Per-block scales (`d`) and scaled sums (`s`) of one activation row,
/// contiguous, so eight of them load as one vector.
#[derive(Debug, Clone, Copy)]
pub struct ActScales {
    pub d: *const f32,
    pub s: *const f32,
}

/// The 32 weights of one block as bytes: unsigned nibbles (Q4) or signed
/// bytes (Q8_0), in activation order.
///
/// # Safety
/// `blk` must point at a whole block of format `T`; AVX2 must be enabled.
#[inline(always)]
unsafe fn unpack<const T: u8>(blk: *const u8, m4: __m128i) -> __m256i {
    unsafe {
        match T {
            Q4_0 | Q4_1 => {
                let raw = _mm_loadu_si128(blk.add(if T == Q4_1 { 4 } else { 2 }).cast());
                let lo = _mm_and_si128(raw, m4);
                let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
                _mm256_set_m128i(hi, lo)
            }
            _ => _mm256_loadu_si256(blk.add(2).cast()),
        }
    }
}

/// Lane `k` of the result is the sum of the eight lanes of `v[k]`.
#[inline(always)]
fn reduce8(v: [__m256i; 8]) -> __m256i {
    // SAFETY: only called from functions compiled with AVX2 enabled.
    unsafe {
        let t0 = _mm256_hadd_epi32(v[0], v[1]);
        let t1 = _mm256_hadd_epi32(v[2], v[3]);
        let t2 = _mm256_hadd_epi32(v[4], v[5]);
        let t3 = _mm256_hadd_epi32(v[6], v[7]);
        let u0 = _mm256_hadd_epi32(t0, t1);
        let u1 = _mm256_hadd_epi32(t2, t3);
        let lo = _mm256_permute2x128_si256(u0, u1, 0x20);
        let hi = _mm256_permute2x128_si256(u0, u1, 0x31);
        _mm256_add_epi32(lo, hi)
    }
}

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
            xs: [ActScales; MR],
            nb: usize,
        ) -> [[f32; MR]; NR] {
            let dot = $dot;
            let m4 = _mm_set1_epi8(0x0F);
            let mut acc = [[_mm256_setzero_ps(); MR]; NR];
            let mut off = [[0.0f32; MR]; NR];
            // Groups of 8 blocks: eight integer dot products are reduced into
            // one vector of per-block sums, then scaled (and offset) with
            // vector ops, instead of scalar work per block.
            let groups = nb / 8;
            for g in 0..groups {
                let mut wv = [[_mm256_setzero_si256(); 8]; NR];
                let mut dvec = [_mm256_setzero_ps(); NR];
                let mut ovec = [_mm256_setzero_ps(); NR];
                for r in 0..NR {
                    let mut d16 = [0u16; 8];
                    let mut m16 = [0u16; 8];
                    for k in 0..8 {
                        // SAFETY: block `8g + k` of row `r` is in bounds.
                        let blk = unsafe { w[r].add((g * 8 + k) * block_bytes(T)) };
                        d16[k] = unsafe { blk.cast::<u16>().read_unaligned() };
                        if T == Q4_1 {
                            m16[k] = unsafe { blk.add(2).cast::<u16>().read_unaligned() };
                        }
                        wv[r][k] = unsafe { unpack::<T>(blk, m4) };
                    }
                    dvec[r] = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(d16.as_ptr().cast())) };
                    ovec[r] = match T {
                        Q4_1 => unsafe { _mm256_cvtph_ps(_mm_loadu_si128(m16.as_ptr().cast())) },
                        Q4_0 => _mm256_mul_ps(dvec[r], _mm256_set1_ps(-8.0)),
                        _ => _mm256_setzero_ps(),
                    };
                }
                for i in 0..MR {
                    // SAFETY: group `g` of activation row `i` is in bounds.
                    let xdv = unsafe { _mm256_loadu_ps(xs[i].d.add(g * 8)) };
                    let xsv = unsafe { _mm256_loadu_ps(xs[i].s.add(g * 8)) };
                    let mut xv = [_mm256_setzero_si256(); 8];
                    for (k, v) in xv.iter_mut().enumerate() {
                        *v = unsafe {
                            _mm256_loadu_si256((*x[i].add(g * 8 + k)).qs.as_ptr().cast())
                        };
                    }
                    for r in 0..NR {
                        let mut p = [_mm256_setzero_si256(); 8];
                        for k in 0..8 {
                            p[k] = if T == Q8_0 {
                                dot(
                                    _mm256_sign_epi8(wv[r][k], wv[r][k]),
                                    _mm256_sign_epi8(xv[k], wv[r][k]),
                                )
                            } else {
                                dot(wv[r][k], xv[k])
                            };
                        }
                        let sums = _mm256_cvtepi32_ps(reduce8(p));
                        acc[r][i] = _mm256_fmadd_ps(sums, _mm256_mul_ps(dvec[r], xdv), acc[r][i]);
                        if T != Q8_0 {
                            acc[r][i] = _mm256_fmadd_ps(ovec[r], xsv, acc[r][i]);
                        }
                    }
                }
            }
            for b in groups * 8..nb {
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
