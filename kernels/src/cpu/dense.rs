//! Dense matrix multiplication on the CPU, `y = x · Wᵀ` with `x` row-major
//! `m x k` f32 and `W` an `n x k` weight held in f32, f16 or bf16 (the
//! weights a model keeps unquantized: BERT's linear layers, a GGUF file's
//! F32, F16 and BF16 tensors, each kept in its own width and widened to
//! f32 in the micro-kernel, exactly, so the products are the f32 ones).
//!
//! The weight is packed once, at load, into panels of `NR` = 32 output
//! columns laid out along `k` (`panel[kk][c] = W[p·32 + c][kk]`, the last
//! panel zero-padded), the layout of a BLIS/GotoBLAS micro-kernel: each
//! step of `k` loads one 32-wide row of the panel (two 16-lane vectors),
//! broadcasts one value of each of up to `MR` = 6 input rows, and does 12
//! fused multiply-adds into registers; no horizontal sums, and the output
//! tile is stored straight into `y`'s rows. Tasks own panels (parallel over
//! output columns) and reuse their panel, which stays in L2, for every
//! block of input rows. Picked at run time: AVX-512F intrinsics, else the
//! same kernel in portable Rust compiled for AVX2, else for the baseline
//! (the portable kernel multiplies and adds separately, so its results can
//! differ from AVX-512's in the last bits).

use rayon::prelude::*;

/// Output columns per panel.
pub const NR: usize = 32;
/// Input rows per micro-kernel call.
const MR: usize = 6;

/// A weight element: f32, or an f16 or bf16 widened to f32 exactly.
pub trait Elem: Copy + Default + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    fn f32(self) -> f32;
    /// Sixteen consecutive elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// AVX-512F must be enabled; 16 elements at `p` must be readable.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Elem for f32 {
    fn f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

/// An IEEE half, by its bits (GGUF's F16).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(transparent)]
pub struct F16(pub u16);

/// A bfloat16, by its bits (GGUF's BF16): the top half of an f32.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Elem for F16 {
    fn f32(self) -> f32 {
        half::f16::from_bits(self.0).to_f32()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps};
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

impl Elem for Bf16 {
    fn f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{
            _mm256_loadu_si256, _mm512_castsi512_ps, _mm512_cvtepu16_epi32, _mm512_slli_epi32,
        };
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
}

/// Panels of one element width (see `Packed`).
#[derive(Debug, Clone, PartialEq)]
enum Panels {
    F32(Vec<f32>),
    F16(Vec<F16>),
    Bf16(Vec<Bf16>),
}

/// A weight packed into `NR`-column panels, in its own width.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    /// `panels x k x NR`.
    data: Panels,
    /// Outputs (the weight's rows).
    pub n: usize,
    /// Inputs (the weight's columns).
    pub k: usize,
}

/// `w` (row-major `n x k`) in panels.
fn pack<E: Elem>(w: &[E], n: usize, k: usize) -> Vec<E> {
    debug_assert_eq!(w.len(), n * k);
    let panels = n.div_ceil(NR);
    let mut data = vec![E::default(); panels * k * NR];
    for (p, panel) in data.chunks_exact_mut((k * NR).max(1)).enumerate() {
        for c in 0..NR.min(n - p * NR) {
            let row = &w[(p * NR + c) * k..][..k];
            for (kk, &v) in row.iter().enumerate() {
                panel[kk * NR + c] = v;
            }
        }
    }
    data
}

impl Packed {
    /// Packs `w`, row-major `n x k`.
    pub fn new(w: &[f32], n: usize, k: usize) -> Self {
        Self {
            data: Panels::F32(pack(w, n, k)),
            n,
            k,
        }
    }

    /// Packs f16 (or, `bf16`, bfloat16) bits, row-major `n x k`, kept at
    /// 16 bits.
    pub fn new_half(bits: &[u16], bf16: bool, n: usize, k: usize) -> Self {
        let data = if bf16 {
            Panels::Bf16(pack(
                &bits.iter().map(|&b| Bf16(b)).collect::<Vec<_>>(),
                n,
                k,
            ))
        } else {
            Panels::F16(pack(
                &bits.iter().map(|&b| F16(b)).collect::<Vec<_>>(),
                n,
                k,
            ))
        };
        Self { data, n, k }
    }

    /// Bytes of the packed weight.
    pub fn bytes(&self) -> usize {
        match &self.data {
            Panels::F32(d) => 4 * d.len(),
            Panels::F16(d) => 2 * d.len(),
            Panels::Bf16(d) => 2 * d.len(),
        }
    }

    /// Row `r` of the weight (an embedding lookup).
    pub fn row(&self, r: usize) -> Vec<f32> {
        match &self.data {
            Panels::F32(d) => row_of(d, self.k, r),
            Panels::F16(d) => row_of(d, self.k, r),
            Panels::Bf16(d) => row_of(d, self.k, r),
        }
    }
}

fn row_of<E: Elem>(data: &[E], k: usize, r: usize) -> Vec<f32> {
    let (p, c) = (r / NR, r % NR);
    let panel = &data[p * k * NR..][..k * NR];
    (0..k).map(|kk| panel[kk * NR + c].f32()).collect()
}

/// `x · Wᵀ`: `m x n`, row-major, in parallel over panels.
pub fn matmul_packed(w: &Packed, x: &[f32], m: usize) -> Vec<f32> {
    gemm_any(w, x, m, true)
}

/// `matmul_packed` on the calling thread alone (for callers that are
/// themselves one of many parallel tasks).
pub fn matmul_packed_serial(w: &Packed, x: &[f32], m: usize) -> Vec<f32> {
    gemm_any(w, x, m, false)
}

/// `gemm` over `w`'s panels, whatever their width.
fn gemm_any(w: &Packed, x: &[f32], m: usize, parallel: bool) -> Vec<f32> {
    match &w.data {
        Panels::F32(d) => gemm(d, (w.n, w.k), x, m, parallel),
        Panels::F16(d) => gemm(d, (w.n, w.k), x, m, parallel),
        Panels::Bf16(d) => gemm(d, (w.n, w.k), x, m, parallel),
    }
}

/// Input rows per task when tasks own rows.
const ROWS_PER_TASK: usize = 4 * MR;

fn gemm<E: Elem>(
    data: &[E],
    (n, k): (usize, usize),
    x: &[f32],
    m: usize,
    parallel: bool,
) -> Vec<f32> {
    let panel = |p: usize| &data[p * k * NR..][..k * NR];
    debug_assert_eq!(x.len(), m * k);
    if m == 0 || n == 0 {
        return Vec::new();
    }
    let mut y = vec![0.0f32; m * n];
    if k == 0 {
        return y;
    }
    let kernel = pick::<E>();
    // Rows `first..` of `y` (whole rows), every panel.
    let rows_task = |first: usize, y: &mut [f32]| {
        let rows = y.len() / n;
        for p in 0..n.div_ceil(NR) {
            let (panel, width) = (panel(p), NR.min(n - p * NR));
            for b in (0..rows).step_by(MR) {
                let r = MR.min(rows - b);
                let out = &mut y[b * n + p * NR..];
                kernel(panel, &x[(first + b) * k..], k, r, out, n, width);
            }
        }
    };
    let tasks = m.div_ceil(ROWS_PER_TASK);
    if !parallel || tasks == 1 && n <= NR {
        rows_task(0, &mut y);
    } else if tasks >= rayon::current_num_threads() {
        y.par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(|(t, y)| rows_task(t * ROWS_PER_TASK, y));
    } else {
        // Few rows: tasks own panels, each writing `[row][NR]` tiles that
        // are then copied into `y`'s rows.
        let mut tiles = vec![0.0f32; n.div_ceil(NR) * m * NR];
        tiles
            .par_chunks_mut(m * NR)
            .enumerate()
            .for_each(|(p, out)| {
                for b in (0..m).step_by(MR) {
                    let r = MR.min(m - b);
                    kernel(panel(p), &x[b * k..], k, r, &mut out[b * NR..], NR, NR);
                }
            });
        for (p, tile) in tiles.chunks_exact(m * NR).enumerate() {
            let width = NR.min(n - p * NR);
            for (i, row) in tile.chunks_exact(NR).enumerate() {
                y[i * n + p * NR..][..width].copy_from_slice(&row[..width]);
            }
        }
    }
    y
}

/// `x · Wᵀ` of an unpacked row-major `n x k` weight (packs it first).
pub fn matmul_f32(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    matmul_packed(&Packed::new(w, n, k), x, m)
}

/// A micro-kernel: `(panel, x rows from here, k, rows <= MR, out, out's
/// row stride, columns to store <= NR)`.
type Kernel<E> = fn(&[E], &[f32], usize, usize, &mut [f32], usize, usize);

fn pick<E: Elem>() -> Kernel<E> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return avx512::kernel::<E>;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return portable_avx2::<E>;
        }
    }
    portable::<E>
}

#[cfg(target_arch = "x86_64")]
fn portable_avx2<E: Elem>(
    p: &[E],
    x: &[f32],
    k: usize,
    rows: usize,
    o: &mut [f32],
    ld: usize,
    w: usize,
) {
    // SAFETY: `pick` returns this only where AVX2 is present.
    #[allow(unsafe_code)]
    unsafe {
        portable_avx2_body(p, x, k, rows, o, ld, w)
    }
}

/// The portable kernel compiled with AVX2 (8-lane vectors).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn portable_avx2_body<E: Elem>(
    p: &[E],
    x: &[f32],
    k: usize,
    rows: usize,
    o: &mut [f32],
    ld: usize,
    w: usize,
) {
    portable(p, x, k, rows, o, ld, w);
}

#[inline(always)]
fn portable<E: Elem>(
    p: &[E],
    x: &[f32],
    k: usize,
    rows: usize,
    o: &mut [f32],
    ld: usize,
    w: usize,
) {
    let acc = match rows {
        1 => portable_rows::<E, 1>(p, x, k),
        2 => portable_rows::<E, 2>(p, x, k),
        3 => portable_rows::<E, 3>(p, x, k),
        4 => portable_rows::<E, 4>(p, x, k),
        5 => portable_rows::<E, 5>(p, x, k),
        _ => portable_rows::<E, MR>(p, x, k),
    };
    for (r, a) in acc.chunks_exact(NR).enumerate().take(rows) {
        o[r * ld..][..w].copy_from_slice(&a[..w]);
    }
}

/// `R` rows of the product, `[row][NR]` (padded to `MR` rows).
#[inline(always)]
fn portable_rows<E: Elem, const R: usize>(panel: &[E], x: &[f32], k: usize) -> [f32; MR * NR] {
    let mut acc = [[0.0f32; NR]; R];
    for (kk, b) in panel.chunks_exact(NR).enumerate().take(k) {
        let b: [f32; NR] = std::array::from_fn(|c| b[c].f32());
        for (r, a) in acc.iter_mut().enumerate() {
            let v = x[r * k + kk];
            for (s, w) in a.iter_mut().zip(&b) {
                *s += v * w;
            }
        }
    }
    let mut out = [0.0f32; MR * NR];
    for (o, a) in out.chunks_exact_mut(NR).zip(&acc) {
        o.copy_from_slice(a);
    }
    out
}

/// The micro-kernel with AVX-512F intrinsics: `R` rows x 32 columns in
/// `2R` accumulators.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };

    use super::{Elem, MR, NR};

    /// Safe entry: only reached after `pick` saw `avx512f`.
    pub fn kernel<E: Elem>(
        p: &[E],
        x: &[f32],
        k: usize,
        rows: usize,
        o: &mut [f32],
        ld: usize,
        w: usize,
    ) {
        assert!(rows <= MR && w <= NR && p.len() >= k * NR && x.len() >= rows * k);
        assert!(o.len() >= (rows - 1) * ld + w);
        // SAFETY: avx512f is present; the lengths were checked just above,
        // and every access below is inside them.
        unsafe {
            match rows {
                1 => rows_avx512::<E, 1>(p, x, k, o, ld, w),
                2 => rows_avx512::<E, 2>(p, x, k, o, ld, w),
                3 => rows_avx512::<E, 3>(p, x, k, o, ld, w),
                4 => rows_avx512::<E, 4>(p, x, k, o, ld, w),
                5 => rows_avx512::<E, 5>(p, x, k, o, ld, w),
                _ => rows_avx512::<E, MR>(p, x, k, o, ld, w),
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn rows_avx512<E: Elem, const R: usize>(
        panel: &[E],
        x: &[f32],
        k: usize,
        out: &mut [f32],
        ld: usize,
        width: usize,
    ) {
        let mut acc: [[__m512; 2]; R] = [[_mm512_setzero_ps(); 2]; R];
        let (b, a) = (panel.as_ptr(), x.as_ptr());
        for kk in 0..k {
            // SAFETY: kk * NR + 32 <= k * NR <= panel.len().
            let (b0, b1) = unsafe { (E::load16(b.add(kk * NR)), E::load16(b.add(kk * NR + 16))) };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: r * k + kk < rows * k <= x.len().
                let v = _mm512_set1_ps(unsafe { *a.add(r * k + kk) });
                acc[0] = _mm512_fmadd_ps(v, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(v, b1, acc[1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            if width == NR {
                // SAFETY: r * ld + 32 <= (rows - 1) * ld + width <= out.len().
                unsafe {
                    let o = out.as_mut_ptr().add(r * ld);
                    _mm512_storeu_ps(o, acc[0]);
                    _mm512_storeu_ps(o.add(16), acc[1]);
                }
            } else {
                let mut tmp = [0.0f32; NR];
                // SAFETY: `tmp` holds 32 floats.
                unsafe {
                    _mm512_storeu_ps(tmp.as_mut_ptr(), acc[0]);
                    _mm512_storeu_ps(tmp.as_mut_ptr().add(16), acc[1]);
                }
                out[r * ld..][..width].copy_from_slice(&tmp[..width]);
            }
        }
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
            (6, 32, 16),
            (7, 33, 64),
            (9, 40, 64),
            (13, 65, 100),
            (1, 70, 384),
            (1, 3, 0),
            (50, 70, 20),
            (200, 33, 9),
        ] {
            let (w, x) = (reference::ramp(n * k, 1), reference::ramp(m * k, 2));
            let want = reference::matmul(&x, &w, m, k, n);
            // Parallel (over rows or over panels, by the shape) and serial.
            let p = Packed::new(&w, n, k);
            for got in [matmul_f32(&w, n, k, &x, m), matmul_packed_serial(&p, &x, m)] {
                let err = reference::max_diff(&got, &want);
                assert!(err < 1e-4 * k.max(1) as f32, "{m}x{n}x{k}: {err}");
            }
            // The portable kernel, wherever the machine would pick another.
            for first in (0..m).step_by(MR) {
                let rows = MR.min(m - first);
                for panel in 0..n.div_ceil(NR) {
                    let mut out = vec![0.0; rows * NR];
                    let Panels::F32(d) = &p.data else {
                        panic!("f32 panels")
                    };
                    let pan = &d[panel * k * NR..][..k * NR];
                    portable(pan, &x[first * k..], k, rows, &mut out, NR, NR);
                    for (r, o) in out.chunks_exact(NR).enumerate() {
                        for (c, v) in o.iter().enumerate().take(NR.min(n - panel * NR)) {
                            let want = want[(first + r) * n + panel * NR + c];
                            assert!((v - want).abs() < 1e-4 * k.max(1) as f32);
                        }
                    }
                }
            }
        }
        assert!(matmul_f32(&[], 0, 4, &[], 0).is_empty());
    }

    #[test]
    fn half_weights_give_the_products_of_their_f32_values_bit_for_bit() {
        for (m, n, k) in [(1, 70, 384), (7, 33, 64), (50, 40, 20), (3, 5, 7)] {
            let w = reference::ramp(n * k, 5);
            let x = reference::ramp(m * k, 6);
            for bf16 in [false, true] {
                let bits = crate::backend::narrow(&w, bf16);
                let wide: Vec<f32> = bits
                    .iter()
                    .map(|&b| if bf16 { Bf16(b).f32() } else { F16(b).f32() })
                    .collect();
                let half = Packed::new_half(&bits, bf16, n, k);
                assert_eq!(half.bytes() * 2, Packed::new(&wide, n, k).bytes());
                let want = matmul_f32(&wide, n, k, &x, m);
                let bitsof = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for got in [
                    matmul_packed(&half, &x, m),
                    matmul_packed_serial(&half, &x, m),
                ] {
                    assert_eq!(bitsof(&got), bitsof(&want), "{m}x{n}x{k} bf16={bf16}");
                }
                for r in [0, n - 1] {
                    assert_eq!(half.row(r), wide[r * k..(r + 1) * k]);
                }
                // The portable kernel too, wherever the machine picks another.
                let (Panels::F32(f), Panels::F16(_) | Panels::Bf16(_)) =
                    (&Packed::new(&wide, n, k).data, &half.data)
                else {
                    panic!("panels")
                };
                let rows = MR.min(m);
                let (mut a, mut b) = (vec![0.0; rows * NR], vec![0.0; rows * NR]);
                portable(&f[..k * NR], &x, k, rows, &mut a, NR, NR);
                match &half.data {
                    Panels::F16(h) => portable(&h[..k * NR], &x, k, rows, &mut b, NR, NR),
                    Panels::Bf16(h) => portable(&h[..k * NR], &x, k, rows, &mut b, NR, NR),
                    Panels::F32(_) => panic!("half panels"),
                }
                assert_eq!(bitsof(&a), bitsof(&b), "portable {m}x{n}x{k} bf16={bf16}");
            }
        }
    }

    #[test]
    fn packed_rows_are_the_weight_rows() {
        let (n, k) = (70, 9);
        let w = reference::ramp(n * k, 3);
        let p = Packed::new(&w, n, k);
        for r in 0..n {
            assert_eq!(p.row(r), w[r * k..(r + 1) * k]);
        }
    }
}
