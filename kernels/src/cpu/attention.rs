//! Attention inner loops over f16 keys and values (the paged KV cache's
//! storage format): query-key scores and probability-weighted value sums,
//! with an AVX2 + F16C + FMA path picked at run time and a portable one.
//! Vectors are `head_dim` long; rows are contiguous.
#![allow(unsafe_code)]

use half::f16;

use super::Isa;

/// `out[j] = scale * q · keys[j]` for each `head_dim`-wide f16 row of `keys`.
pub fn scores_f16(q: &[f32], keys: &[f16], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(
        hd > 0 && keys.len() >= out.len() * hd,
        "keys too short for the scores"
    );
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(8) && Isa::detect() != Isa::Scalar {
        // SAFETY: AVX2, FMA and F16C are present (Isa::detect checked them);
        // lengths were checked above.
        unsafe { x86::scores(q, keys, scale, out) };
        return;
    }
    for (j, o) in out.iter_mut().enumerate() {
        let k = &keys[j * hd..(j + 1) * hd];
        *o = scale * q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum::<f32>();
    }
}

/// `out += Σ_j probs[j] * values[j]` for `head_dim`-wide f16 rows.
pub fn weighted_sum_f16(probs: &[f32], values: &[f16], out: &mut [f32]) {
    let hd = out.len();
    assert!(
        hd > 0 && values.len() >= probs.len() * hd,
        "values too short for the weights"
    );
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(8) && Isa::detect() != Isa::Scalar {
        // SAFETY: as in `scores_f16`.
        unsafe { x86::weighted_sum(probs, values, out) };
        return;
    }
    for (j, &p) in probs.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(&values[j * hd..(j + 1) * hd]) {
            *o += p * v.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    /// # Safety
    /// AVX2, FMA and F16C must be available; `q.len()` is a multiple of 8
    /// and `keys` holds `out.len()` rows of `q.len()` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(q: &[f32], keys: &[f16], scale: f32, out: &mut [f32]) {
        let hd = q.len();
        let kp = keys.as_ptr().cast::<u16>();
        for (j, o) in out.iter_mut().enumerate() {
            let mut acc = _mm256_setzero_ps();
            for d in (0..hd).step_by(8) {
                // SAFETY: row j, elements d..d+8 are in bounds (caller contract).
                let k = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(kp.add(j * hd + d).cast())) };
                let qv = unsafe { _mm256_loadu_ps(q.as_ptr().add(d)) };
                acc = _mm256_fmadd_ps(qv, k, acc);
            }
            let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            *o = scale * _mm_cvtss_f32(s);
        }
    }

    /// # Safety
    /// As for `scores`, with `out.len()` the row width.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum(probs: &[f32], values: &[f16], out: &mut [f32]) {
        let hd = out.len();
        let vp = values.as_ptr().cast::<u16>();
        for d in (0..hd).step_by(8) {
            // SAFETY: `out[d..d + 8]` and row j's `d..d + 8` are in bounds.
            let mut acc = unsafe { _mm256_loadu_ps(out.as_ptr().add(d)) };
            for (j, &p) in probs.iter().enumerate() {
                let v = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(vp.add(j * hd + d).cast())) };
                acc = _mm256_fmadd_ps(_mm256_set1_ps(p), v, acc);
            }
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(d), acc) };
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
        for hd in [8usize, 64, 12] {
            let n = 13;
            let q = ramp(hd, 1);
            let rows: Vec<f16> = ramp(n * hd, 2).into_iter().map(f16::from_f32).collect();
            let mut got = vec![0.0; n];
            scores_f16(&q, &rows, 0.5, &mut got);
            for (j, g) in got.iter().enumerate() {
                let want: f32 = 0.5
                    * q.iter()
                        .zip(&rows[j * hd..])
                        .map(|(a, b)| a * b.to_f32())
                        .sum::<f32>();
                assert!((g - want).abs() < 1e-4, "hd {hd} score {j}: {g} vs {want}");
            }
            let p = ramp(n, 3);
            let mut acc = ramp(hd, 4);
            let mut want = acc.clone();
            weighted_sum_f16(&p, &rows, &mut acc);
            for (j, &pj) in p.iter().enumerate() {
                for (w, v) in want.iter_mut().zip(&rows[j * hd..(j + 1) * hd]) {
                    *w += pj * v.to_f32();
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
