//! Attention inner loops over f16 keys and values (the paged KV cache's
//! storage format): query-key scores and probability-weighted value sums,
//! with an AVX2 + F16C + FMA path picked at run time and a portable one.
//! Vectors are `head_dim` long; rows are contiguous.
#![allow(unsafe_code)]

use half::f16;

use super::Isa;

/// The query heads of one KV group: `heads` rows of `hd` values (`q`),
/// and the scores of each head, `stride` apart in one buffer.
#[derive(Debug, Clone, Copy)]
pub struct HeadGroup<'a> {
    pub q: &'a [f32],
    pub hd: usize,
    pub stride: usize,
}

impl HeadGroup<'_> {
    fn heads(&self) -> usize {
        self.q.len() / self.hd
    }
}

/// `out[g * stride + j] = scale * q_g · keys[j]` for every query head `g`
/// and the `len` f16 rows of `keys` (each key row is converted once for
/// the whole group).
pub fn scores_f16(h: HeadGroup<'_>, keys: &[f16], len: usize, scale: f32, out: &mut [f32]) {
    let (hd, heads) = (h.hd, h.heads());
    assert!(
        hd > 0
            && keys.len() >= len * hd
            && (heads == 0 || out.len() >= (heads - 1) * h.stride + len),
        "scores: buffers too short"
    );
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(8) && Isa::detect() != Isa::Scalar {
        // SAFETY: AVX2, FMA and F16C are present (Isa::detect checked
        // them); lengths were checked above.
        unsafe { x86::scores(h, keys, len, scale, out) };
        return;
    }
    for (g, q) in h.q.chunks_exact(hd).enumerate() {
        for j in 0..len {
            let k = &keys[j * hd..(j + 1) * hd];
            out[g * h.stride + j] =
                scale * q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum::<f32>();
        }
    }
}

/// `out_g += Σ_j probs[g * stride + j] * values[j]` for every head `g` of
/// `out` (`heads x hd`) and the `len` f16 rows of `values` (each value row
/// is converted once for the whole group).
pub fn weighted_sum_f16(
    probs: &[f32],
    stride: usize,
    values: &[f16],
    len: usize,
    out: &mut [f32],
    hd: usize,
) {
    let heads = out.len() / hd.max(1);
    assert!(
        hd > 0
            && values.len() >= len * hd
            && (heads == 0 || probs.len() >= (heads - 1) * stride + len),
        "weighted sum: buffers too short"
    );
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(8) && Isa::detect() != Isa::Scalar {
        // SAFETY: as in `scores_f16`.
        unsafe { x86::weighted_sum(probs, stride, values, len, out, hd) };
        return;
    }
    for (g, o) in out.chunks_exact_mut(hd).enumerate() {
        for j in 0..len {
            let p = probs[g * stride + j];
            for (o, v) in o.iter_mut().zip(&values[j * hd..(j + 1) * hd]) {
                *o += p * v.to_f32();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::HeadGroup;

    /// Query heads handled together (their accumulators stay in registers).
    const MAX_HEADS: usize = 4;

    /// # Safety
    /// AVX2, FMA and F16C must be available; `hd` is a multiple of 8 and
    /// the buffers are as long as `scores_f16` checks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(h: HeadGroup<'_>, keys: &[f16], len: usize, scale: f32, out: &mut [f32]) {
        let heads = h.heads();
        let mut g0 = 0;
        while g0 < heads {
            let n = MAX_HEADS.min(heads - g0);
            // SAFETY: forwarded caller contract, heads `g0..g0 + n`.
            unsafe {
                match n {
                    1 => scores_n::<1>(h, g0, keys, len, scale, out),
                    2 => scores_n::<2>(h, g0, keys, len, scale, out),
                    3 => scores_n::<3>(h, g0, keys, len, scale, out),
                    _ => scores_n::<4>(h, g0, keys, len, scale, out),
                }
            }
            g0 += n;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_n<const G: usize>(
        h: HeadGroup<'_>,
        g0: usize,
        keys: &[f16],
        len: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = h.hd;
        let kp = keys.as_ptr().cast::<u16>();
        let qp = h.q.as_ptr();
        for j in 0..len {
            let mut acc = [_mm256_setzero_ps(); G];
            for d in (0..hd).step_by(8) {
                // SAFETY: row j, elements d..d+8 are in bounds, and so are
                // heads g0..g0 + G of `q` (caller contract).
                let k = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(kp.add(j * hd + d).cast())) };
                for (g, a) in acc.iter_mut().enumerate() {
                    let qv = unsafe { _mm256_loadu_ps(qp.add((g0 + g) * hd + d)) };
                    *a = _mm256_fmadd_ps(qv, k, *a);
                }
            }
            for (g, a) in acc.iter().enumerate() {
                out[(g0 + g) * h.stride + j] = scale * hsum(*a);
            }
        }
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

    /// # Safety
    /// As for `scores`, with the lengths `weighted_sum_f16` checks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum(
        probs: &[f32],
        stride: usize,
        values: &[f16],
        len: usize,
        out: &mut [f32],
        hd: usize,
    ) {
        let heads = out.len() / hd;
        let mut g0 = 0;
        while g0 < heads {
            let n = MAX_HEADS.min(heads - g0);
            let o = &mut out[g0 * hd..(g0 + n) * hd];
            let p = &probs[g0 * stride..];
            // SAFETY: forwarded caller contract, heads `g0..g0 + n`.
            unsafe {
                match n {
                    1 => weighted_n::<1>(p, stride, values, len, o, hd),
                    2 => weighted_n::<2>(p, stride, values, len, o, hd),
                    3 => weighted_n::<3>(p, stride, values, len, o, hd),
                    _ => weighted_n::<4>(p, stride, values, len, o, hd),
                }
            }
            g0 += n;
        }
    }

    /// `G` heads, 16 dimensions at a time: `2 * G` accumulators plus two
    /// converted value vectors fit the 16 AVX2 registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_n<const G: usize>(
        probs: &[f32],
        stride: usize,
        values: &[f16],
        len: usize,
        out: &mut [f32],
        hd: usize,
    ) {
        let vp = values.as_ptr().cast::<u16>();
        let op = out.as_mut_ptr();
        let mut d = 0;
        while d < hd {
            let w = if d + 16 <= hd { 2 } else { 1 };
            // SAFETY (whole loop): dims d..d + 8w of every head and of every
            // value row j < len are in bounds (caller contract).
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for (g, a) in acc.iter_mut().enumerate() {
                for (c, v) in a.iter_mut().enumerate().take(w) {
                    *v = unsafe { _mm256_loadu_ps(op.add(g * hd + d + 8 * c)) };
                }
            }
            for j in 0..len {
                let mut v = [_mm256_setzero_ps(); 2];
                for (c, x) in v.iter_mut().enumerate().take(w) {
                    *x = unsafe {
                        _mm256_cvtph_ps(_mm_loadu_si128(vp.add(j * hd + d + 8 * c).cast()))
                    };
                }
                for (g, a) in acc.iter_mut().enumerate() {
                    let p = _mm256_set1_ps(probs[g * stride + j]);
                    for c in 0..w {
                        a[c] = _mm256_fmadd_ps(p, v[c], a[c]);
                    }
                }
            }
            for (g, a) in acc.iter().enumerate() {
                for (c, v) in a.iter().enumerate().take(w) {
                    unsafe { _mm256_storeu_ps(op.add(g * hd + d + 8 * c), *v) };
                }
            }
            d += 8 * w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize, k: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + k) % 211) as f32 / 105.0) - 1.0)
            .collect()
    }

    #[test]
    fn simd_scores_and_sums_match_the_plain_loops() {
        for (hd, heads) in [(8usize, 1usize), (64, 3), (24, 5), (12, 2)] {
            let n = 13;
            let stride = n + 3;
            let q = ramp(heads * hd, 1);
            let rows: Vec<f16> = ramp(n * hd, 2).into_iter().map(f16::from_f32).collect();
            let mut got = vec![0.0; heads * stride];
            let group = HeadGroup { q: &q, hd, stride };
            scores_f16(group, &rows, n, 0.5, &mut got);
            for g in 0..heads {
                for j in 0..n {
                    let want: f32 = 0.5
                        * q[g * hd..(g + 1) * hd]
                            .iter()
                            .zip(&rows[j * hd..])
                            .map(|(a, b)| a * b.to_f32())
                            .sum::<f32>();
                    let v = got[g * stride + j];
                    assert!(
                        (v - want).abs() < 1e-4,
                        "hd {hd} head {g} score {j}: {v} vs {want}"
                    );
                }
            }
            let p = ramp(heads * stride, 3);
            let mut acc = ramp(heads * hd, 4);
            let mut want = acc.clone();
            weighted_sum_f16(&p, stride, &rows, n, &mut acc, hd);
            for g in 0..heads {
                for j in 0..n {
                    let pj = p[g * stride + j];
                    for (w, v) in want[g * hd..(g + 1) * hd].iter_mut().zip(&rows[j * hd..]) {
                        *w += pj * v.to_f32();
                    }
                }
            }
            let err = acc
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-4, "hd {hd} weighted sum error {err}");
        }
    }
}
