//! Row-wise operations between the matmuls (the CPU backend's): RMSNorm,
//! LayerNorm, the SwiGLU gate, GELU, softmax, RoPE and residual adds. Each runs in parallel over rows (on the
//! executor's thread pool) once a batch is large enough to pay for it, so a
//! long prefill does not leave a core idle between matmuls.

use rayon::prelude::*;

/// Rows per parallel task; smaller batches run on the calling thread.
const ROWS_PER_TASK: usize = 16;

/// Elements per parallel task when a few wide rows are split along the row.
const COLS_PER_TASK: usize = 2048;

/// RMSNorm of each row (`weight.len()` wide).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let dim = weight.len();
    let mut out = vec![0.0; x.len()];
    let norm_rows = |(o, xs): (&mut [f32], &[f32])| {
        for (orow, row) in o.chunks_exact_mut(dim).zip(xs.chunks_exact(dim)) {
            let inv = 1.0 / (mean_square(row) + eps).sqrt();
            for ((o, v), w) in orow.iter_mut().zip(row).zip(weight) {
                *o = v * inv * w;
            }
        }
    };
    for_rows(&mut out, x, dim, norm_rows);
    out
}

/// Mean of squares, in eight partial sums (vectorizes; f32 order is fixed).
fn mean_square(row: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = row.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    (acc.iter().sum::<f32>() + tail) / row.len() as f32
}

/// SwiGLU over fused gate/up rows (`[gate | up]`, each `n` wide):
/// `silu(gate) * up`, one `n`-wide row per input row.
pub fn swiglu(gate_up: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; gate_up.len() / 2];
    if n == 0 {
        return out;
    }
    let rows = out.len() / n;
    if rows < ROWS_PER_TASK && n >= 2 * COLS_PER_TASK {
        // A decode step's few wide rows: split along each row, so no core
        // idles (and falls asleep) between the matmuls around this.
        for (orow, row) in out.chunks_exact_mut(n).zip(gate_up.chunks_exact(2 * n)) {
            let (g, u) = row.split_at(n);
            orow.par_chunks_mut(COLS_PER_TASK)
                .zip(g.par_chunks(COLS_PER_TASK))
                .zip(u.par_chunks(COLS_PER_TASK))
                .for_each(|((o, g), u)| silu_mul(o, g, u));
        }
        return out;
    }
    for_rows(&mut out, gate_up, n, |(o, gu): (&mut [f32], &[f32])| {
        for (orow, row) in o.chunks_exact_mut(n).zip(gu.chunks_exact(2 * n)) {
            let (g, u) = row.split_at(n);
            silu_mul(orow, g, u);
        }
    });
    out
}

/// `o = silu(g) * u`, element-wise.
fn silu_mul(o: &mut [f32], g: &[f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if wide::silu_mul(o, g, u) {
        return;
    }
    silu_mul_portable(o, g, u);
}

/// GeGLU over fused gate/up rows (`[gate | up]`, each `n` wide):
/// `gelu_tanh_f16(gate) * up`, one `n`-wide row per input row, the GELU
/// looked up by the gate's f16 bits (`gelu_f16_lookup`).
pub fn geglu(gate_up: &[f32], n: usize) -> Vec<f32> {
    geglu_with(gate_up, n, gelu_f16_lookup)
}

/// GeGLU with `gelu` for the gate's GELU (the lookup, or its definition).
pub fn geglu_with(gate_up: &[f32], n: usize, gelu: fn(f32) -> f32) -> Vec<f32> {
    let mut out = vec![0.0; gate_up.len() / 2];
    if n == 0 {
        return out;
    }
    for_rows(&mut out, gate_up, n, |(o, gu): (&mut [f32], &[f32])| {
        for (orow, row) in o.chunks_exact_mut(n).zip(gu.chunks_exact(2 * n)) {
            let (g, u) = row.split_at(n);
            for ((o, &g), &u) in orow.iter_mut().zip(g).zip(u) {
                *o = gelu(g) * u;
            }
        }
    });
    out
}

/// `gelu_tanh_f16(g)`, the same bits, from a table of its value at every
/// f16 input (as ggml's CPU backend keeps one) instead of an `exp` each.
pub fn gelu_f16_lookup(g: f32) -> f32 {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    if g <= -10.0 {
        return 0.0;
    }
    if g >= 10.0 {
        return g;
    }
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| gelu_of_f16(half::f16::from_bits(b).to_f32()))
            .collect()
    });
    table[usize::from(half::f16::from_f32(g).to_bits())]
}

/// GELU's tanh form as ggml's CPU backend computes it (`GGML_GELU_FP16`):
/// the input rounded to f16, `0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715
/// x^2)))` rounded to f16 (its lookup table); past -10 zero, past 10 the
/// input itself. `tanh` through `exp`, so every backend rounds alike.
pub fn gelu_tanh_f16(g: f32) -> f32 {
    use half::f16;
    if g <= -10.0 {
        return 0.0;
    }
    if g >= 10.0 {
        return g;
    }
    gelu_of_f16(f16::from_f32(g).to_f32())
}

/// The tanh form at an f16 value `x`, rounded to f16.
fn gelu_of_f16(x: f32) -> f32 {
    let inner = 0.797_884_6 * x * (1.0 + 0.044_715 * x * x);
    let t = 1.0 - 2.0 / (exp(2.0 * inner.abs()) + 1.0);
    let th = if inner < 0.0 { -t } else { t };
    half::f16::from_f32(0.5 * x * (1.0 + th)).to_f32()
}

#[inline(always)]
fn silu_mul_portable(o: &mut [f32], g: &[f32], u: &[f32]) {
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + exp(-g)) * u;
    }
}

/// `row[i] = exp(row[i] - max)`, eight at a time where the CPU allows.
pub fn exp_shifted_fast(row: &mut [f32], max: f32) {
    #[cfg(target_arch = "x86_64")]
    if wide::exp_shifted(row, max) {
        return;
    }
    exp_shifted(row, max);
}

/// `row[i] = exp(row[i] - max)`.
#[inline(always)]
fn exp_shifted(row: &mut [f32], max: f32) {
    for v in row.iter_mut() {
        *v = exp(*v - max);
    }
}

#[cfg(target_arch = "x86_64")]
mod wide {
    //! The element-wise loops over `exp`, compiled for AVX2 or AVX-512:
    //! the same operations in the same order (Rust never fuses a multiply
    //! and an add by itself), so the results are bit-identical, eight or
    //! sixteen at a time. Each returns false, doing nothing, where the CPU
    //! lacks AVX2 (or `SYNOR_KERNELS=scalar` asks for the portable path).
    #![allow(unsafe_code)]

    use crate::cpu::Isa;

    pub fn silu_mul(o: &mut [f32], g: &[f32], u: &[f32]) -> bool {
        silu_mul_on(Isa::detect(), o, g, u)
    }

    pub fn exp_shifted(row: &mut [f32], max: f32) -> bool {
        exp_shifted_on(Isa::detect(), row, max)
    }

    /// `silu_mul` on the path `isa`, which the CPU must support.
    pub(super) fn silu_mul_on(isa: Isa, o: &mut [f32], g: &[f32], u: &[f32]) -> bool {
        on(isa, || super::silu_mul_portable(o, g, u))
    }

    /// `exp_shifted` on the path `isa`, which the CPU must support.
    pub(super) fn exp_shifted_on(isa: Isa, row: &mut [f32], max: f32) -> bool {
        on(isa, || super::exp_shifted(row, max))
    }

    /// Runs the loop `f` compiled for `isa` (inlined into a function that
    /// enables its features); false, running nothing, for `Scalar`.
    #[inline(always)]
    fn on(isa: Isa, f: impl FnOnce()) -> bool {
        assert!(Isa::all_supported().contains(&isa));
        // SAFETY (both arms): the CPU has the features each function
        // enables (`isa` is one it supports, checked above).
        match isa {
            Isa::Avx512Vnni | Isa::Amx => unsafe { avx512(f) },
            Isa::Avx2 => unsafe { avx2(f) },
            Isa::Scalar => return false,
        }
        true
    }

    #[target_feature(enable = "avx2,avx512f")]
    unsafe fn avx512(f: impl FnOnce()) {
        f();
    }

    #[target_feature(enable = "avx2")]
    unsafe fn avx2(f: impl FnOnce()) {
        f();
    }
}

/// LayerNorm of each row (`weight.len()` wide): `(x - mean) / sqrt(var +
/// eps) * weight + bias`.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let dim = weight.len();
    let mut out = vec![0.0; x.len()];
    for_rows(&mut out, x, dim, |(o, xs): (&mut [f32], &[f32])| {
        for (orow, row) in o.chunks_exact_mut(dim).zip(xs.chunks_exact(dim)) {
            let mean = row.iter().sum::<f32>() / dim as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / dim as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for (((o, v), w), b) in orow.iter_mut().zip(row).zip(weight).zip(bias) {
                *o = (v - mean) * inv * w + b;
            }
        }
    });
    out
}

/// Exact (erf) GELU, in place.
pub fn gelu_in_place(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = 0.5 * *v * (1.0 + erf(*v / std::f32::consts::SQRT_2));
    }
}

/// erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7).
pub fn erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * exp(-x * x);
    if x < 0.0 { -y } else { y }
}

/// e^x to within about one ulp, the same operations in the same order as
/// the GPU kernels' `exp_precise` (`common.wgsl`, `kernels.cu`), so every
/// backend's softmax, SiLU and GELU round alike: x = k ln2 + r by Cody and
/// Waite, a degree-7 polynomial for e^r on |r| <= ln2 / 2, then 2^k in two
/// factors (subnormal results stay exact). Branch-free, so loops over it
/// vectorize.
#[inline]
#[allow(clippy::excessive_precision)]
pub fn exp(x: f32) -> f32 {
    // Adding and taking away 1.5 * 2^23 rounds to an integer, ties to
    // even (the shaders' `round`, `rintf`).
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-104.0, 89.0);
    let kr = xc * std::f32::consts::LOG2_E + ROUND;
    let k = kr - ROUND;
    let r = (xc - k * 0.693145752) - k * 1.42860677e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.16666667
                    + r * (0.041666668
                        + r * (0.008333334 + r * (0.0013888889 + r * 0.0001984127))))));
    // `k as i32` without the saturating cast (which LLVM leaves scalar):
    // `kr` is 1.5 * 2^23 + k in one binade, so its low bits are `k`.
    let ki = (kr.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let (k1, k2) = (ki / 2, ki - ki / 2);
    let two = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let y = p * two(k1) * two(k2);
    if x > 88.72283 {
        f32::INFINITY
    } else if x < -103.97208 {
        0.0
    } else {
        y
    }
}

/// Numerically stable softmax of one row, in place.
pub fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    exp_shifted_fast(row, max);
    // In position order (the GPU kernels add in the same order).
    let sum = row.iter().fold(0.0, |s, v| s + v);
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// Rotates every head of one token's q or k row at `pos`, in place.
pub fn rope_row(x: &mut [f32], pos: usize, rope: &crate::backend::Rope) {
    let hd = rope.head_dim;
    let half = rope.rot_dim / 2;
    let (cos, sin) = (
        &rope.cos[pos * half..(pos + 1) * half],
        &rope.sin[pos * half..(pos + 1) * half],
    );
    for head in x.chunks_exact_mut(hd) {
        for i in 0..half {
            let (a, b) = if rope.neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// `x += y`, element-wise.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    const CHUNK: usize = 16 * 1024;
    let add = |(a, b): (&mut [f32], &[f32])| {
        for (a, b) in a.iter_mut().zip(b) {
            *a += b;
        }
    };
    if x.len() <= CHUNK {
        add((x, y));
    } else {
        x.par_chunks_mut(CHUNK)
            .zip(y.par_chunks(CHUNK))
            .for_each(add);
    }
}

/// Applies `f` to matching row ranges of `out` (`out_w` wide) and `x`
/// (same row count): in parallel tasks of `ROWS_PER_TASK` rows when there
/// are more rows than that.
fn for_rows<F>(out: &mut [f32], x: &[f32], out_w: usize, f: F)
where
    F: Fn((&mut [f32], &[f32])) + Sync + Send,
{
    let rows = out.len() / out_w;
    if rows == 0 {
        return;
    }
    let in_w = x.len() / rows;
    if rows <= ROWS_PER_TASK {
        f((out, x));
    } else {
        out.par_chunks_mut(ROWS_PER_TASK * out_w)
            .zip(x.par_chunks(ROWS_PER_TASK * in_w))
            .for_each(f);
    }
}

#[cfg(test)]
mod tests {
    use crate::reference;

    use super::*;
    use crate::reference::max_diff;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect()
    }

    #[test]
    fn rms_norm_matches_the_reference_serial_and_parallel() {
        let w = ramp(36);
        for rows in [1, 3, 40] {
            let x = ramp(rows * 36);
            let got = rms_norm(&x, &w, 1e-5);
            assert!(max_diff(&got, &reference::rms_norm(&x, &w, 1e-5)) < 1e-5);
        }
    }

    #[test]
    fn gelu_is_ggml_s_f16_table_of_the_tanh_form() {
        use half::f16;
        // Every f16 input in (-10, 10): the table ggml builds (the tanh
        // form with libm's tanhf, rounded to f16) within one f16 step, and
        // equal at nearly all of them.
        let (mut n, mut apart) = (0, 0);
        for bits in 0..=u16::MAX {
            let x = f16::from_bits(bits).to_f32();
            if !x.is_finite() || x <= -10.0 || x >= 10.0 {
                continue;
            }
            let y = 0.5 * x * (1.0 + (0.797_884_6 * x * (1.0 + 0.044_715 * x * x)).tanh());
            let (want, got) = (f16::from_f32(y), f16::from_f32(gelu_tanh_f16(x)));
            n += 1;
            if want != got {
                apart += 1;
                let step = (want.to_f32() - got.to_f32()).abs();
                assert!(
                    step <= f32::from(want).abs() * 1e-3 + 1e-7,
                    "{x}: {want} vs {got}"
                );
            }
        }
        assert!(apart * 1000 < n, "{apart} of {n} apart");
        assert_eq!(gelu_tanh_f16(-11.0), 0.0);
        assert_eq!(gelu_tanh_f16(12.5), 12.5);
        let gu = [0.5, -30.0, 2.0, 3.0];
        assert_eq!(geglu(&gu, 2), [gelu_tanh_f16(0.5) * 2.0, 0.0]);
    }

    #[test]
    fn the_gelu_table_gives_the_definitions_bits_everywhere() {
        // Every f16 value, the values between them, the edges and beyond.
        let mut xs: Vec<f32> = (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect();
        xs.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 1.37e-4));
        xs.extend([-10.0, 10.0, -9.999, 9.999, -1e30, 1e30, f32::MIN_POSITIVE]);
        for x in xs {
            let (want, got) = (gelu_tanh_f16(x), gelu_f16_lookup(x));
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "{x}: {want} vs {got}"
            );
        }
        let gu = ramp(2 * 3 * 700);
        assert_eq!(geglu(&gu, 700), geglu_with(&gu, 700, gelu_tanh_f16));
    }

    #[test]
    fn swiglu_gates_each_row_with_its_own_half() {
        // Few narrow rows, many rows (split by rows), and a decode step's
        // wide rows (split along each row, with a partial last task).
        for (rows, n) in [(2, 5), (37, 5), (3, 2 * COLS_PER_TASK + 5)] {
            let gu = ramp(rows * 2 * n);
            let got = swiglu(&gu, n);
            for r in 0..rows {
                for j in 0..n {
                    let (g, u) = (gu[r * 2 * n + j], gu[r * 2 * n + n + j]);
                    let want = g / (1.0 + (-g).exp()) * u;
                    assert!((got[r * n + j] - want).abs() < 1e-6, "row {r} col {j}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_wide_exp_loops_round_exactly_like_the_portable_ones() {
        // Past both clamps, through subnormal results, and every tail length.
        let xs: Vec<f32> = (0..20_011)
            .map(|i| (i as f32 - 10_000.0) * 0.0113)
            .collect();
        let us = ramp(xs.len());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut portable = vec![0.0; xs.len()];
        silu_mul_portable(&mut portable, &xs, &us);
        // Every path this CPU has (AVX2 and AVX-512 where present).
        for isa in crate::cpu::Isa::all_supported() {
            let mut wide = portable.iter().map(|_| f32::NAN).collect::<Vec<_>>();
            if !wide::silu_mul_on(isa, &mut wide, &xs, &us) {
                continue;
            }
            assert_eq!(bits(&wide), bits(&portable), "silu on {isa:?}");
            for len in [1, 7, 8, 9, 15, 16, 17, 191, 20_011] {
                let mut a = xs[..len].to_vec();
                let mut b = a.clone();
                assert!(wide::exp_shifted_on(isa, &mut a, 3.0));
                exp_shifted(&mut b, 3.0);
                assert_eq!(bits(&a), bits(&b), "exp on {isa:?}, {len} values");
            }
        }
    }

    #[test]
    fn add_in_place_adds_every_element() {
        for n in [10, 40_000] {
            let mut x = ramp(n);
            let y = ramp(n);
            let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
            add_in_place(&mut x, &y);
            assert!(max_diff(&x, &want) < 1e-6);
        }
    }

    #[test]
    fn exp_is_within_two_ulps_of_libm_everywhere_it_is_finite() {
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        let mut x = -103.0f32;
        while x < 88.7 {
            let (got, want) = (exp(x), x.exp());
            assert!(ulps(got, want) <= 2, "exp({x}) = {got}, libm {want}");
            x += 0.0137;
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(-104.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-100.0) > 0.0, "subnormal results stay");
    }

    #[test]
    fn erf_and_gelu_match_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
        ] {
            assert!((erf(x) - want).abs() < 2e-6, "erf({x}) = {}", erf(x));
        }
        let mut g = [1.0f32, -6.0];
        gelu_in_place(&mut g);
        assert!((g[0] - 0.841_344_7).abs() < 1e-5);
        assert!(g[1].abs() < 1e-6);
    }

    #[test]
    fn layer_norm_centres_and_scales_each_row() {
        let x = vec![1.0, 2.0, 3.0, 4.0, -1.0, -1.0, -1.0, 3.0];
        let y = layer_norm(&x, &[1.0; 4], &[0.5; 4], 1e-12);
        for row in y.chunks(4) {
            let mean = row.iter().sum::<f32>() / 4.0;
            assert!((mean - 0.5).abs() < 1e-5);
        }
    }
}
