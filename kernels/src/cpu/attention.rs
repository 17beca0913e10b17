//! Attention inner loops over the paged KV cache's rows, f16 or Q8_0:
//! query-key scores and probability-weighted value sums, with an AVX2 +
//! F16C + FMA path picked at run time and a portable one. Vectors are
//! `head_dim` long; rows are contiguous.
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

/// Consecutive key or value rows of `hd` values as the cache holds them:
/// f16, or Q8_0 (`q * d`, one f32 scale per `group` values of a row).
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F16(&'a [f16]),
    Q8 {
        q: &'a [i8],
        d: &'a [f32],
        group: usize,
    },
}

impl KvRows<'_> {
    /// Whether `len` rows of `hd` values are there.
    fn holds(&self, len: usize, hd: usize) -> bool {
        match *self {
            KvRows::F16(x) => x.len() >= len * hd,
            KvRows::Q8 { q, d, group } => {
                group > 0
                    && hd.is_multiple_of(group)
                    && q.len() >= len * hd
                    && d.len() >= len * hd / group
            }
        }
    }

    /// Whether the SIMD loops take these rows on `isa`, `lanes` values at
    /// a time (8: AVX2, 16: AVX-512), never across a scale group.
    #[cfg(target_arch = "x86_64")]
    fn simd(&self, hd: usize, isa: Isa, lanes: usize) -> bool {
        let group_ok = match *self {
            KvRows::F16(_) => true,
            KvRows::Q8 { group, .. } => group.is_multiple_of(lanes),
        };
        let isa_ok = match lanes {
            8 => isa != Isa::Scalar,
            _ => isa >= Isa::Avx512Vnni,
        };
        hd.is_multiple_of(8) && group_ok && isa_ok
    }

    /// Value `i` of row `j` (the portable loops).
    fn at(&self, j: usize, i: usize, hd: usize) -> f32 {
        match *self {
            KvRows::F16(x) => x[j * hd + i].to_f32(),
            KvRows::Q8 { q, d, group } => f32::from(q[j * hd + i]) * d[(j * hd + i) / group],
        }
    }
}

/// `out[g * stride + j] = scale * q_g · keys[j]` for every query head `g`
/// and the `len` rows of `keys` (each key row is converted once for the
/// whole group).
pub fn scores(h: HeadGroup<'_>, keys: KvRows<'_>, len: usize, scale: f32, out: &mut [f32]) {
    let (hd, heads) = (h.hd, h.heads());
    assert!(
        hd > 0 && keys.holds(len, hd) && (heads == 0 || out.len() >= (heads - 1) * h.stride + len),
        "scores: buffers too short"
    );
    #[cfg(target_arch = "x86_64")]
    if keys.simd(hd, Isa::detect(), 8) {
        // SAFETY: AVX2, FMA and F16C are present (Isa::detect checked
        // them); lengths and groups were checked above.
        unsafe {
            match keys {
                KvRows::F16(x) => x86::scores(h, x86::F16Rows(x.as_ptr().cast()), len, scale, out),
                KvRows::Q8 { q, d, group } => {
                    x86::scores(h, x86::Q8Rows::new(q, d, group), len, scale, out)
                }
            }
        }
        return;
    }
    for (g, q) in h.q.chunks_exact(hd).enumerate() {
        for j in 0..len {
            out[g * h.stride + j] = scale * dot(q, keys, j, hd);
        }
    }
}

/// `q · keys[j]`. Where `hd` is a multiple of 8, in the SIMD loops' order,
/// so every path gives the same float: eight lanes, lane `l` the fused
/// multiply-adds of elements `l, l + 8, …` in turn, then the lanes added
/// as `x86::hsum` adds them (`(l0 + l4) + (l2 + l6)`, plus `(l1 + l5) +
/// (l3 + l7)`); otherwise in element order.
fn dot(q: &[f32], keys: KvRows<'_>, j: usize, hd: usize) -> f32 {
    if !hd.is_multiple_of(8) {
        return q
            .iter()
            .enumerate()
            .map(|(i, a)| a * keys.at(j, i, hd))
            .sum();
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if let Some(v) = super::wasm::attention::dot(q, keys, j, hd) {
        return v;
    }
    let mut acc = [0f32; 8];
    for (c, qc) in q.chunks_exact(8).enumerate() {
        for (l, (a, &qv)) in acc.iter_mut().zip(qc).enumerate() {
            *a = qv.mul_add(keys.at(j, 8 * c + l, hd), *a);
        }
    }
    let s = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// `out_g += Σ_j probs[g * stride + j] * values[j]` for every head `g` of
/// `out` (`heads x hd`) and the `len` rows of `values` (each value row is
/// converted once for the whole group).
pub fn weighted_sum(
    probs: &[f32],
    stride: usize,
    values: KvRows<'_>,
    len: usize,
    out: &mut [f32],
    hd: usize,
) {
    weighted_sum_on(Isa::detect(), probs, stride, values, len, out, hd);
}

/// `weighted_sum` on the path `isa` picks (every path adds each output
/// element's rows in row order with fused multiply-adds: the same floats).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn weighted_sum_on(
    isa: Isa,
    probs: &[f32],
    stride: usize,
    values: KvRows<'_>,
    len: usize,
    out: &mut [f32],
    hd: usize,
) {
    let heads = out.len() / hd.max(1);
    assert!(
        hd > 0
            && values.holds(len, hd)
            && (heads == 0 || probs.len() >= (heads - 1) * stride + len),
        "weighted sum: buffers too short"
    );
    #[cfg(target_arch = "x86_64")]
    if values.simd(hd, isa, 8) {
        let wide = values.simd(hd, isa, 16);
        // SAFETY: as in `scores`; AVX-512 F is present where `wide` (the
        // VNNI path implies it).
        unsafe {
            match values {
                KvRows::F16(x) => {
                    let rows = x86::F16Rows(x.as_ptr().cast());
                    x86::weighted_sum(probs, stride, rows, len, out, hd, wide)
                }
                KvRows::Q8 { q, d, group } => {
                    let rows = x86::Q8Rows::new(q, d, group);
                    x86::weighted_sum(probs, stride, rows, len, out, hd, wide)
                }
            }
        }
        return;
    }
    // Fused multiply-adds in row order, as the SIMD loops do them.
    for (g, o) in out.chunks_exact_mut(hd).enumerate() {
        for j in 0..len {
            let p = probs[g * stride + j];
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            if super::wasm::attention::add_row(o, p, values, j, hd) {
                continue;
            }
            for (i, o) in o.iter_mut().enumerate() {
                *o = p.mul_add(values.at(j, i, hd), *o);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::HeadGroup;

    /// Query heads handled together (their accumulators stay in registers).
    const MAX_HEADS: usize = 4;

    /// Rows the SIMD loops read eight values at a time, as f32.
    pub trait Rows: Copy {
        /// Values `i..i + 8` of row `j` (rows `hd` long).
        ///
        /// # Safety
        /// AVX2 and F16C must be enabled and the values in bounds; `i` is a
        /// multiple of 8.
        unsafe fn load8(self, j: usize, i: usize, hd: usize) -> __m256;
    }

    /// f16 rows.
    #[derive(Clone, Copy)]
    pub struct F16Rows(pub *const u16);

    impl Rows for F16Rows {
        #[inline(always)]
        unsafe fn load8(self, j: usize, i: usize, hd: usize) -> __m256 {
            // SAFETY: caller contract.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.add(j * hd + i).cast())) }
        }
    }

    /// Q8_0 rows: eight quants widened and scaled by their group's factor
    /// (a group holds a multiple of eight values, so eight never straddle
    /// two groups).
    #[derive(Clone, Copy)]
    pub struct Q8Rows {
        q: *const i8,
        d: *const f32,
        group: usize,
    }

    impl Q8Rows {
        pub fn new(q: &[i8], d: &[f32], group: usize) -> Self {
            Self {
                q: q.as_ptr(),
                d: d.as_ptr(),
                group,
            }
        }
    }

    impl Rows for Q8Rows {
        #[inline(always)]
        unsafe fn load8(self, j: usize, i: usize, hd: usize) -> __m256 {
            let at = j * hd + i;
            // SAFETY: caller contract; scale `at / group` belongs to the
            // same row (`hd` is a multiple of `group`).
            unsafe {
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(self.q.add(at).cast()));
                let d = _mm256_set1_ps(*self.d.add(at / self.group));
                _mm256_mul_ps(_mm256_cvtepi32_ps(q), d)
            }
        }
    }

    /// Rows the AVX-512 loops read sixteen values at a time, as f32.
    pub trait Rows16: Rows {
        /// Values `i..i + 16` of row `j` (rows `hd` long).
        ///
        /// # Safety
        /// AVX-512 F must be enabled and the values in bounds; `i` is a
        /// multiple of 16 (of the scale group, for Q8_0 rows).
        unsafe fn load16(self, j: usize, i: usize, hd: usize) -> __m512;
    }

    impl Rows16 for F16Rows {
        #[inline(always)]
        unsafe fn load16(self, j: usize, i: usize, hd: usize) -> __m512 {
            // SAFETY: caller contract.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.add(j * hd + i).cast())) }
        }
    }

    impl Rows16 for Q8Rows {
        #[inline(always)]
        unsafe fn load16(self, j: usize, i: usize, hd: usize) -> __m512 {
            let at = j * hd + i;
            // SAFETY: caller contract; the sixteen share one scale.
            unsafe {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(self.q.add(at).cast()));
                let d = _mm512_set1_ps(*self.d.add(at / self.group));
                _mm512_mul_ps(_mm512_cvtepi32_ps(q), d)
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available; `hd` is a multiple of 8 and
    /// the buffers are as long as `super::scores` checks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores<R: Rows>(
        h: HeadGroup<'_>,
        keys: R,
        len: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let heads = h.heads();
        let mut g0 = 0;
        while g0 < heads {
            let n = MAX_HEADS.min(heads - g0);
            // SAFETY: forwarded caller contract, heads `g0..g0 + n`.
            unsafe {
                match n {
                    1 => scores_n::<1, R>(h, g0, keys, len, scale, out),
                    2 => scores_n::<2, R>(h, g0, keys, len, scale, out),
                    3 => scores_n::<3, R>(h, g0, keys, len, scale, out),
                    _ => scores_n::<4, R>(h, g0, keys, len, scale, out),
                }
            }
            g0 += n;
        }
    }

    /// `G` query heads against the key rows, `8 / G` rows at a time: the
    /// tile's eight (or six) accumulators are reduced together by `hsum8`
    /// (in `hsum`'s order, so every score is the same float as one row at
    /// a time gives); the rows left over go one at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_n<const G: usize, R: Rows>(
        h: HeadGroup<'_>,
        g0: usize,
        keys: R,
        len: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = h.hd;
        let qp = h.q.as_ptr();
        let rows = 8 / G;
        let mut j = 0;
        while j + rows <= len {
            let mut acc = [_mm256_setzero_ps(); 8];
            for d in (0..hd).step_by(8) {
                for r in 0..rows {
                    // SAFETY: rows j..j + rows, elements d..d+8, are in
                    // bounds, and so are heads g0..g0 + G of `q`.
                    let k = unsafe { keys.load8(j + r, d, hd) };
                    for g in 0..G {
                        let qv = unsafe { _mm256_loadu_ps(qp.add((g0 + g) * hd + d)) };
                        acc[r * G + g] = _mm256_fmadd_ps(qv, k, acc[r * G + g]);
                    }
                }
            }
            let mut sums = [0.0f32; 8];
            let scaled = _mm256_mul_ps(_mm256_set1_ps(scale), hsum8(acc));
            // SAFETY: `sums` holds 8 floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), scaled) };
            for (lane, &v) in HSUM8_ORDER.iter().enumerate() {
                if v < rows * G {
                    out[(g0 + v % G) * h.stride + j + v / G] = sums[lane];
                }
            }
            j += rows;
        }
        for j in j..len {
            let mut acc = [_mm256_setzero_ps(); G];
            for d in (0..hd).step_by(8) {
                // SAFETY: as above, for row j.
                let k = unsafe { keys.load8(j, d, hd) };
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

    /// Which vector's sum each lane of `hsum8` holds.
    const HSUM8_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

    /// The eight lane sums of eight vectors at once, each added in `hsum`'s
    /// order, ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)), so the
    /// floats are the same; lane `i` holds vector `HSUM8_ORDER[i]`'s.
    #[inline(always)]
    fn hsum8(v: [__m256; 8]) -> __m256 {
        // SAFETY: only called from functions compiled with AVX enabled.
        unsafe {
            // [lo + hi of a | lo + hi of b]: x_i + x_{i+4}.
            let halves = |a: __m256, b: __m256| {
                _mm256_add_ps(
                    _mm256_permute2f128_ps(a, b, 0x20),
                    _mm256_permute2f128_ps(a, b, 0x31),
                )
            };
            // Per 128-bit lane, elements (0 + 2, 1 + 3) of each input.
            let pairs = |a: __m256, b: __m256| {
                _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xEE))
            };
            let a = pairs(halves(v[0], v[1]), halves(v[2], v[3]));
            let b = pairs(halves(v[4], v[5]), halves(v[6], v[7]));
            // Element 0 + element 1 of each pair.
            _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD))
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
    /// As for `scores`, with the lengths `super::weighted_sum` checks;
    /// AVX-512 F too where `wide` (and Q8_0 groups of a multiple of 16).
    pub unsafe fn weighted_sum<R: Rows16>(
        probs: &[f32],
        stride: usize,
        values: R,
        len: usize,
        out: &mut [f32],
        hd: usize,
        wide: bool,
    ) {
        let heads = out.len() / hd;
        let mut g0 = 0;
        while g0 < heads {
            let n = MAX_HEADS.min(heads - g0);
            let o = &mut out[g0 * hd..(g0 + n) * hd];
            let p = &probs[g0 * stride..];
            // SAFETY: forwarded caller contract, heads `g0..g0 + n`.
            unsafe {
                if wide {
                    weighted_heads512(n, p, stride, values, len, o, hd);
                } else {
                    match n {
                        1 => weighted_n::<1, 8, R>(p, stride, values, len, o, hd),
                        2 => weighted_n::<2, 4, R>(p, stride, values, len, o, hd),
                        3 => weighted_n::<3, 4, R>(p, stride, values, len, o, hd),
                        _ => weighted_n::<4, 2, R>(p, stride, values, len, o, hd),
                    }
                }
            }
            g0 += n;
        }
    }

    /// `n` (1 to 4) heads on the AVX-512 loop.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn weighted_heads512<R: Rows16>(
        n: usize,
        p: &[f32],
        stride: usize,
        values: R,
        len: usize,
        o: &mut [f32],
        hd: usize,
    ) {
        // SAFETY: forwarded caller contract.
        unsafe {
            match n {
                1 => weighted512_n::<1, R>(p, stride, values, len, o, hd),
                2 => weighted512_n::<2, R>(p, stride, values, len, o, hd),
                3 => weighted512_n::<3, R>(p, stride, values, len, o, hd),
                _ => weighted512_n::<4, R>(p, stride, values, len, o, hd),
            }
        }
    }

    /// `G` heads, 64 dimensions at a time in sixteen-lane registers (up to
    /// 16 accumulators, the heads' probabilities and the value vectors fit
    /// the 32 AVX-512 registers, and a head of 64 is one pass over the
    /// rows where AVX2 takes four); then 16 at a time, then the AVX2
    /// loop's eight. Each output element still adds its rows in row order.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn weighted512_n<const G: usize, R: Rows16>(
        probs: &[f32],
        stride: usize,
        values: R,
        len: usize,
        out: &mut [f32],
        hd: usize,
    ) {
        let mut d = 0;
        // SAFETY (every loop): dims d..d + 64 (16, 8) of every head and of
        // every value row j < len are in bounds (caller contract).
        unsafe {
            while d + 64 <= hd {
                weighted_pass::<__m512, G, 4, R>(probs, stride, values, len, out, hd, d);
                d += 64;
            }
            while d + 16 <= hd {
                weighted_pass::<__m512, G, 1, R>(probs, stride, values, len, out, hd, d);
                d += 16;
            }
            while d < hd {
                weighted_pass::<__m256, G, 1, R>(probs, stride, values, len, out, hd, d);
                d += 8;
            }
        }
    }

    /// `G` heads, `8 * W` dimensions at a time (`W` by `G`: 8, 4, 4, 2, so
    /// `G * W` accumulators, the heads' probabilities and one value vector
    /// fit the 16 AVX2 registers and enough independent chains of fused
    /// multiply-adds are in flight); dimensions left over go eight at a
    /// time. Each output element adds its rows in row order whatever the
    /// width, so the floats do not depend on it.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_n<const G: usize, const W: usize, R: Rows16>(
        probs: &[f32],
        stride: usize,
        values: R,
        len: usize,
        out: &mut [f32],
        hd: usize,
    ) {
        let mut d = 0;
        // SAFETY (both loops): dims d..d + 8W of every head and of every
        // value row j < len are in bounds (caller contract).
        unsafe {
            while d + 8 * W <= hd {
                weighted_pass::<__m256, G, W, R>(probs, stride, values, len, out, hd, d);
                d += 8 * W;
            }
            while d < hd {
                weighted_pass::<__m256, G, 1, R>(probs, stride, values, len, out, hd, d);
                d += 8;
            }
        }
    }

    /// A register of `LANES` f32 lanes: AVX2's eight or AVX-512's sixteen
    /// (the one weighted pass below, written once for both widths).
    trait Lanes: Copy {
        const LANES: usize;
        unsafe fn zero() -> Self;
        unsafe fn load(p: *const f32) -> Self;
        unsafe fn store(self, p: *mut f32);
        unsafe fn splat(x: f32) -> Self;
        /// `a * b + self`, rounded once.
        unsafe fn fma(self, a: Self, b: Self) -> Self;
        /// Values `i..i + LANES` of row `j` of `rows`.
        unsafe fn row<R: Rows16>(rows: R, j: usize, i: usize, hd: usize) -> Self;
    }

    impl Lanes for __m256 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm256_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn fma(self, a: Self, b: Self) -> Self {
            unsafe { _mm256_fmadd_ps(a, b, self) }
        }
        #[inline(always)]
        unsafe fn row<R: Rows16>(rows: R, j: usize, i: usize, hd: usize) -> Self {
            unsafe { rows.load8(j, i, hd) }
        }
    }

    impl Lanes for __m512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn fma(self, a: Self, b: Self) -> Self {
            unsafe { _mm512_fmadd_ps(a, b, self) }
        }
        #[inline(always)]
        unsafe fn row<R: Rows16>(rows: R, j: usize, i: usize, hd: usize) -> Self {
            unsafe { rows.load16(j, i, hd) }
        }
    }

    /// Dimensions `d..d + W * LANES` of `G` heads over every row, in
    /// registers of `V` (compiled into the AVX2 or AVX-512 function that
    /// calls it, whose features the intrinsics need).
    #[inline(always)]
    unsafe fn weighted_pass<V: Lanes, const G: usize, const W: usize, R: Rows16>(
        probs: &[f32],
        stride: usize,
        values: R,
        len: usize,
        out: &mut [f32],
        hd: usize,
        d: usize,
    ) {
        let op = out.as_mut_ptr();
        let at = |g: usize, c: usize| g * hd + d + V::LANES * c;
        // SAFETY (whole function): dims d..d + W * LANES of every head and
        // of every value row j < len are in bounds (caller contract), and
        // the caller enables the instructions `V` uses.
        unsafe {
            let mut acc = [[V::zero(); W]; G];
            for (g, a) in acc.iter_mut().enumerate() {
                for (c, v) in a.iter_mut().enumerate() {
                    *v = V::load(op.add(at(g, c)));
                }
            }
            for j in 0..len {
                let p: [V; G] = std::array::from_fn(|g| V::splat(probs[g * stride + j]));
                for c in 0..W {
                    let v = V::row(values, j, d + V::LANES * c, hd);
                    for (a, p) in acc.iter_mut().zip(&p) {
                        a[c] = a[c].fma(*p, v);
                    }
                }
            }
            for (g, a) in acc.iter().enumerate() {
                for (c, v) in a.iter().enumerate() {
                    v.store(op.add(at(g, c)));
                }
            }
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

    /// The rows' values, as the plain loops of the test read them.
    fn dequantized(rows: KvRows<'_>, n: usize, hd: usize) -> Vec<f32> {
        (0..n * hd).map(|x| rows.at(x / hd, x % hd, hd)).collect()
    }

    /// Checks `scores` and `weighted_sum` on `rows` against plain f32 loops
    /// over the same values.
    fn check(rows: KvRows<'_>, n: usize, hd: usize, heads: usize) {
        let vals = dequantized(rows, n, hd);
        let stride = n + 3;
        let q = ramp(heads * hd, 1);
        let mut got = vec![0.0; heads * stride];
        let group = HeadGroup { q: &q, hd, stride };
        scores(group, rows, n, 0.5, &mut got);
        for g in 0..heads {
            for j in 0..n {
                let want: f32 = 0.5
                    * q[g * hd..(g + 1) * hd]
                        .iter()
                        .zip(&vals[j * hd..])
                        .map(|(a, b)| a * b)
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
        weighted_sum(&p, stride, rows, n, &mut acc, hd);
        for g in 0..heads {
            for j in 0..n {
                let pj = p[g * stride + j];
                for (w, v) in want[g * hd..(g + 1) * hd].iter_mut().zip(&vals[j * hd..]) {
                    *w += pj * v;
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

    /// One score as the SIMD loop adds it: eight lanes of fused
    /// multiply-adds, reduced ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
    fn score_in_lane_order(q: &[f32], k: &[f32], scale: f32) -> f32 {
        let mut l = [0.0f32; 8];
        for d in (0..q.len()).step_by(8) {
            for (i, l) in l.iter_mut().enumerate() {
                *l = q[d + i].mul_add(k[d + i], *l);
            }
        }
        scale * (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])))
    }

    #[test]
    fn weighted_sums_add_each_element_in_row_order_on_every_path() {
        // Every path (the portable loop too, so a worker's sums do not
        // depend on its instruction set), head count, and widths that
        // leave dimensions over (the AVX-512 loop's 64, 16 and 8 at a time).
        for isa in Isa::all_supported() {
            for heads in 1..=9 {
                for hd in [8usize, 24, 40, 64, 72, 88, 128] {
                    check_row_order(isa, heads, hd);
                }
            }
        }
    }

    /// `weighted_sum` on `isa` against a sequential `mul_add` loop, bit for
    /// bit, on f16 rows and on Q8_0 rows (groups of 8, 16 and 32 where the
    /// row holds them).
    fn check_row_order(isa: Isa, heads: usize, hd: usize) {
        let n = 11;
        let stride = n + 2;
        let p = ramp(heads * stride, 10);
        let f16s: Vec<f16> = ramp(n * hd, 9).into_iter().map(f16::from_f32).collect();
        let q: Vec<i8> = (0..n * hd).map(|i| ((i * 37) % 255) as i8).collect();
        let mut cases = vec![KvRows::F16(&f16s)];
        let scales: Vec<Vec<f32>> = [8usize, 16, 32]
            .iter()
            .map(|g| ramp(n * hd / g, 5).iter().map(|x| x / 64.0).collect())
            .collect();
        for (group, d) in [8usize, 16, 32].into_iter().zip(&scales) {
            if hd.is_multiple_of(group) {
                cases.push(KvRows::Q8 { q: &q, d, group });
            }
        }
        for rows in cases {
            let vals = dequantized(rows, n, hd);
            let mut got = ramp(heads * hd, 11);
            let mut want = got.clone();
            weighted_sum_on(isa, &p, stride, rows, n, &mut got, hd);
            for g in 0..heads {
                for j in 0..n {
                    for i in 0..hd {
                        let w = &mut want[g * hd + i];
                        *w = p[g * stride + j].mul_add(vals[j * hd + i], *w);
                    }
                }
            }
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let kind = match rows {
                KvRows::F16(_) => "f16".to_string(),
                KvRows::Q8 { group, .. } => format!("q8, groups of {group}"),
            };
            assert!(same, "{isa:?} heads {heads} hd {hd} {kind}");
        }
    }

    #[test]
    fn scores_in_tiles_of_rows_are_the_row_at_a_time_floats_in_lane_order() {
        // On every path (the portable loop adds in the SIMD lanes' order
        // too, so a worker's scores do not depend on its instruction set).
        // Every head count (tiles of 8, 4, 2 rows; 3 heads pad the tile)
        // and lengths that leave rows over.
        for heads in 1..=9 {
            for n in [1usize, 2, 3, 7, 8, 13, 17] {
                let hd = 64;
                let stride = n + 1;
                let q = ramp(heads * hd, 7);
                let rows: Vec<f16> = ramp(n * hd, 8).into_iter().map(f16::from_f32).collect();
                let kf: Vec<f32> = rows.iter().map(|v| v.to_f32()).collect();
                let mut got = vec![0.0; heads * stride];
                scores(
                    HeadGroup { q: &q, hd, stride },
                    KvRows::F16(&rows),
                    n,
                    0.125,
                    &mut got,
                );
                for g in 0..heads {
                    for j in 0..n {
                        let want =
                            score_in_lane_order(&q[g * hd..][..hd], &kf[j * hd..][..hd], 0.125);
                        assert_eq!(
                            got[g * stride + j].to_bits(),
                            want.to_bits(),
                            "heads {heads} n {n} head {g} row {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn simd_scores_and_sums_match_the_plain_loops_on_f16_and_q8_rows() {
        for (hd, heads) in [(8usize, 1usize), (64, 3), (24, 5), (12, 2), (96, 4)] {
            let n = 13;
            let rows: Vec<f16> = ramp(n * hd, 2).into_iter().map(f16::from_f32).collect();
            check(KvRows::F16(&rows), n, hd, heads);
            // Q8_0 in groups of 32 where the row allows it, else one group
            // per row (12: the portable loop; 24: SIMD, a group of 24).
            let group = if hd.is_multiple_of(32) { 32 } else { hd };
            let q: Vec<i8> = (0..n * hd).map(|i| ((i * 37) % 255) as i8).collect();
            let d: Vec<f32> = ramp(n * hd / group, 5).iter().map(|x| x / 64.0).collect();
            check(
                KvRows::Q8 {
                    q: &q,
                    d: &d,
                    group,
                },
                n,
                hd,
                heads,
            );
        }
    }
}
