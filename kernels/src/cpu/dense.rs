//! f32 matrix multiplication on the CPU, `y = x · Wᵀ` with `x` row-major
//! `m x k` and `W` row-major `n x k` (both contiguous along `k`), for the
//! weights a model keeps in f32. Tasks own blocks of `W` rows; within a
//! task, tiles of 2 input rows by 4 weight rows keep eight 8-lane partial
//! sums in registers, so each loaded vector of `x` is used four times and
//! each of `W` twice. Picked at run time: AVX-512F intrinsics (16-lane
//! fused multiply-adds, for rows of 64 or more), else the portable body compiled for AVX2, else
//! for the baseline (those two add in the same order; AVX-512 results can
//! differ from them in the last bits).

use rayon::prelude::*;

/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 16;
const LANES: usize = 8;

/// `x · Wᵀ`: `m x n`, row-major.
pub fn matmul_f32(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    debug_assert_eq!(w.len(), n * k);
    debug_assert_eq!(x.len(), m * k);
    if m == 0 || n == 0 {
        return Vec::new();
    }
    // Per task: its weight rows' outputs for every input row, `[row][i]`.
    let mut out_t = vec![0.0f32; n * m];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * m)
        .enumerate()
        .for_each(|(task, o)| {
            let first = task * ROWS_PER_TASK;
            let rows = o.len() / m;
            block(&w[first * k..(first + rows) * k], rows, k, x, m, o);
        });
    let mut out = vec![0.0f32; m * n];
    for (j, col) in out_t.chunks_exact(m).enumerate() {
        for (i, v) in col.iter().enumerate() {
            out[i * n + j] = *v;
        }
    }
    out
}

/// One task: `rows` weight rows against every input row.
fn block(w: &[f32], rows: usize, k: usize, x: &[f32], m: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    // Short rows: the per-tile horizontal sums would cost more than the
    // wider lanes save.
    if k >= 64 && std::arch::is_x86_feature_detected!("avx512f") {
        block_with(w, rows, k, x, m, out, avx512::tile);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked just above).
        #[allow(unsafe_code)]
        unsafe {
            block_avx2(w, rows, k, x, m, out)
        };
        return;
    }
    block_body(w, rows, k, x, m, out);
}

/// The same body compiled with AVX2 (8-lane vectors); the caller checks
/// the CPU has it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn block_avx2(w: &[f32], rows: usize, k: usize, x: &[f32], m: usize, out: &mut [f32]) {
    block_body(w, rows, k, x, m, out);
}

#[inline(always)]
fn block_body(w: &[f32], rows: usize, k: usize, x: &[f32], m: usize, out: &mut [f32]) {
    block_with(w, rows, k, x, m, out, tile);
}

/// One tile's dot products: `(w, j, nj, x, i, ni, k)` as in `tile`.
type Tile = fn(&[f32], usize, usize, &[f32], usize, usize, usize) -> [[f32; 2]; 4];

#[inline(always)]
fn block_with(w: &[f32], rows: usize, k: usize, x: &[f32], m: usize, out: &mut [f32], tile: Tile) {
    let mut j = 0;
    while j < rows {
        let nj = (rows - j).min(4);
        let mut i = 0;
        while i < m {
            let ni = (m - i).min(2);
            let sums = tile(w, j, nj, x, i, ni, k);
            for (dj, row) in sums.iter().enumerate().take(nj) {
                for (di, s) in row.iter().enumerate().take(ni) {
                    out[(j + dj) * m + i + di] = *s;
                }
            }
            i += ni;
        }
        j += nj;
    }
}

/// Dot products of input rows `i..i+ni` with weight rows `j..j+nj`
/// (`ni <= 2`, `nj <= 4`), as `[weight row][input row]`.
#[inline(always)]
fn tile(w: &[f32], j: usize, nj: usize, x: &[f32], i: usize, ni: usize, k: usize) -> [[f32; 2]; 4] {
    let mut acc = [[[0.0f32; LANES]; 2]; 4];
    let row_w = |r: usize| &w[(j + r.min(nj - 1)) * k..][..k];
    let row_x = |r: usize| &x[(i + r.min(ni - 1)) * k..][..k];
    let (ws, xs) = (
        [row_w(0), row_w(1), row_w(2), row_w(3)],
        [row_x(0), row_x(1)],
    );
    let whole = k / LANES * LANES;
    let mut c = 0;
    while c < whole {
        for (a, wr) in acc.iter_mut().zip(&ws) {
            let wv = &wr[c..c + LANES];
            for (lanes, xr) in a.iter_mut().zip(&xs) {
                let xv = &xr[c..c + LANES];
                for l in 0..LANES {
                    lanes[l] += wv[l] * xv[l];
                }
            }
        }
        c += LANES;
    }
    let mut out = [[0.0f32; 2]; 4];
    for (r, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        for (s, (dst, lanes)) in o.iter_mut().zip(a).enumerate() {
            let tail: f32 = (whole..k).map(|t| ws[r][t] * xs[s][t]).sum();
            *dst = lanes.iter().sum::<f32>() + tail;
        }
    }
    out
}

/// The tile with AVX-512F intrinsics: eight 16-lane fused multiply-add
/// accumulators.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_reduce_add_ps, _mm512_setzero_ps,
    };

    /// Safe entry: only reached after the caller saw `avx512f`.
    pub fn tile(
        w: &[f32],
        j: usize,
        nj: usize,
        x: &[f32],
        i: usize,
        ni: usize,
        k: usize,
    ) -> [[f32; 2]; 4] {
        // SAFETY: the dispatcher checked `avx512f`; every load below
        // reads 16 floats inside a row of length `k` (c + 16 <= k).
        unsafe { tile_avx512(w, j, nj, x, i, ni, k) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn tile_avx512(
        w: &[f32],
        j: usize,
        nj: usize,
        x: &[f32],
        i: usize,
        ni: usize,
        k: usize,
    ) -> [[f32; 2]; 4] {
        let row_w = |r: usize| &w[(j + r.min(nj - 1)) * k..][..k];
        let row_x = |r: usize| &x[(i + r.min(ni - 1)) * k..][..k];
        let (ws, xs) = (
            [row_w(0), row_w(1), row_w(2), row_w(3)],
            [row_x(0), row_x(1)],
        );
        let mut acc: [[__m512; 2]; 4] = [[_mm512_setzero_ps(); 2]; 4];
        let whole = k / 16 * 16;
        let mut c = 0;
        while c < whole {
            // SAFETY: c + 16 <= whole <= k, inside each row.
            let (x0, x1) = unsafe {
                (
                    _mm512_loadu_ps(xs[0].as_ptr().add(c)),
                    _mm512_loadu_ps(xs[1].as_ptr().add(c)),
                )
            };
            for (a, wr) in acc.iter_mut().zip(&ws) {
                // SAFETY: as above.
                let wv = unsafe { _mm512_loadu_ps(wr.as_ptr().add(c)) };
                a[0] = _mm512_fmadd_ps(wv, x0, a[0]);
                a[1] = _mm512_fmadd_ps(wv, x1, a[1]);
            }
            c += 16;
        }
        let mut out = [[0.0f32; 2]; 4];
        for (r, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
            for (s, (dst, v)) in o.iter_mut().zip(a).enumerate() {
                let tail: f32 = (whole..k).map(|t| ws[r][t] * xs[s][t]).sum();
                *dst = _mm512_reduce_add_ps(*v) + tail;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    #[test]
    fn every_shape_matches_the_reference() {
        for (m, n, k) in [
            (1, 1, 1),
            (3, 5, 7),
            (2, 4, 8),
            (5, 17, 33),
            (9, 40, 64),
            (1, 70, 384),
        ] {
            let (w, x) = (reference::ramp(n * k, 1), reference::ramp(m * k, 2));
            let got = matmul_f32(&w, n, k, &x, m);
            let want = reference::matmul(&x, &w, m, k, n);
            let err = reference::max_diff(&got, &want);
            assert!(err < 1e-4 * k as f32, "{m}x{n}x{k}: {err}");
        }
        assert!(matmul_f32(&[], 0, 4, &[], 0).is_empty());
    }
}
