//! WebAssembly SIMD128 dot products of one interleaved 16-row weight group
//! with up to four Q8 activation rows: the browser worker's CPU path
//! (`tab/`, built with `+simd128`). Bit for bit `scalar::dot_group`: the
//! same integer sums, the same float roundings, and fused multiply-adds
//! made exact without an FMA instruction (see `fma`).
//!
//! One vector holds four weight rows' four consecutive weights (the
//! layout's 64-byte loads are four of them). Widened to 16 bits, two rows
//! at a time, `i32x4.dot_i16x8_s` against the chunk's four activations
//! (repeated for both rows) gives two partial sums a row; a block's
//! partials are paired up once at its end. Each unpacked weight vector
//! serves every activation row of a tile. The 32-weight formats here; the
//! K-quants (Q4_K, Q5_K, Q6_K) in `kquant`; IQ4_XS runs `scalar`.
#![allow(unsafe_code)]

pub mod attention;
mod kquant;

use core::arch::wasm32::*;

use super::scalar;
use crate::iquant::KVALUES;
use crate::layout::{self, GROUP};
use crate::quant::{Q8Block, QK, QuantType};

/// Activation rows computed against each unpacked weight vector.
pub const TILE: usize = 4;

/// One activation block as the dot products take it: chunk `c` (values
/// `4c..4c + 4`) widened to 16 bits and repeated for two weight rows.
pub type Spread = [v128; QK / 4];

/// Whether `ty` has a SIMD128 path here (IQ4_XS runs `scalar`).
pub fn supports(ty: QuantType) -> bool {
    kquant::supports(ty)
        || matches!(
            ty,
            QuantType::Q4_0
                | QuantType::Q4_1
                | QuantType::Q5_0
                | QuantType::Q5_1
                | QuantType::Q8_0
                | QuantType::Iq4Nl
        )
}

/// The spread of one activation block.
pub fn spread(xb: &Q8Block) -> Spread {
    std::array::from_fn(|c| {
        let q = &xb.qs[4 * c..4 * c + 4];
        let word = i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
        i16x8_extend_low_i8x16(i32x4_splat(word))
    })
}

/// `scalar::dot_group(ty, g, x[i])` for every row `i` (at most `TILE`),
/// `spreads[i]` being `x[i]`'s blocks spread. Formats without a SIMD128
/// path fall back to `scalar` row by row.
pub fn dot_group_rows(
    ty: QuantType,
    g: &[u8],
    x: &[&[Q8Block]],
    spreads: &[&[Spread]],
    out: &mut [[f32; GROUP]],
) {
    assert!(x.len() == spreads.len() && x.len() == out.len() && x.len() <= TILE);
    if !supports(ty) {
        for (o, xr) in out.iter_mut().zip(x) {
            *o = scalar::dot_group(ty, g, xr);
        }
        return;
    }
    if kquant::supports(ty) {
        match x.len() {
            1 => kquant::tile::<1>(ty, g, x, spreads, out),
            2 => kquant::tile::<2>(ty, g, x, spreads, out),
            3 => kquant::tile::<3>(ty, g, x, spreads, out),
            4 => kquant::tile::<4>(ty, g, x, spreads, out),
            _ => {}
        }
        return;
    }
    match x.len() {
        1 => tile::<1>(ty, g, x, spreads, out),
        2 => tile::<2>(ty, g, x, spreads, out),
        3 => tile::<3>(ty, g, x, spreads, out),
        4 => tile::<4>(ty, g, x, spreads, out),
        _ => {}
    }
}

/// `R` activation rows against group `g`, a quarter of the rows (one
/// vector's four) at a time, block by block.
#[inline(always)]
fn tile<const R: usize>(
    ty: QuantType,
    g: &[u8],
    x: &[&[Q8Block]],
    spreads: &[&[Spread]],
    out: &mut [[f32; GROUP]],
) {
    let gbb = layout::group_block_bytes(ty);
    let blocks = g.len() / gbb;
    assert!((0..R).all(|r| x[r].len() >= blocks && spreads[r].len() >= blocks));
    for quad in 0..GROUP / 4 {
        let mut acc = [f32x4_splat(0.0); R];
        for (b, gb) in g.chunks_exact(gbb).enumerate() {
            let w = weights(ty, gb, quad);
            let (mut lo, mut hi) = ([i32x4_splat(0); R], [i32x4_splat(0); R]);
            for (c, &wc) in w.iter().enumerate() {
                let (w01, w23) = (i16x8_extend_low_i8x16(wc), i16x8_extend_high_i8x16(wc));
                for r in 0..R {
                    let xc = spreads[r][b][c];
                    lo[r] = i32x4_add(lo[r], i32x4_dot_i16x8(w01, xc));
                    hi[r] = i32x4_add(hi[r], i32x4_dot_i16x8(w23, xc));
                }
            }
            let d = f16x4(gb, 8 * quad);
            let min = matches!(ty, QuantType::Q4_1 | QuantType::Q5_1)
                .then(|| f16x4(gb, 2 * GROUP + 8 * quad));
            for r in 0..R {
                let xb = &x[r][b];
                let sums = i32x4_add(pair_up(lo[r], hi[r]), i32x4_splat(offset(ty, xb)));
                let scale = f32x4_mul(d, f32x4_splat(xb.d));
                acc[r] = fma(f32x4_convert_i32x4(sums), scale, acc[r]);
                if let Some(m) = min {
                    acc[r] = fma(m, f32x4_splat(xb.s), acc[r]);
                }
            }
        }
        for r in 0..R {
            out[r][4 * quad..4 * quad + 4].copy_from_slice(&lanes(acc[r]));
        }
    }
}

/// The integer offset `scalar::dot_group` adds to a block's sum. Q8_0 and
/// IQ4_NL are multiplied here as signed values, whose sums already equal
/// the reference's unsigned ones plus its offset.
#[inline(always)]
fn offset(ty: QuantType, xb: &Q8Block) -> i32 {
    match ty {
        QuantType::Q4_0 => xb.off4(),
        QuantType::Q5_0 => xb.off5(),
        QuantType::Q4_1
        | QuantType::Q5_1
        | QuantType::Q8_0
        | QuantType::Iq4Nl
        | QuantType::Q4K
        | QuantType::Q5K
        | QuantType::Q6K
        | QuantType::Iq4Xs => 0,
    }
}

/// The eight chunks of rows `4 * quad..4 * quad + 4` of one group block,
/// as the signed bytes the sums multiply (row `r` in bytes `4r..4r + 4`):
/// nibbles, five-bit values, Q8_0's `q`, or IQ4_NL's table values.
#[inline(always)]
fn weights(ty: QuantType, gb: &[u8], quad: usize) -> [v128; 8] {
    let q = layout::quants_offset(ty);
    if ty == QuantType::Q8_0 {
        return std::array::from_fn(|c| {
            v128_xor(load(gb, q + 64 * c + 16 * quad), i8x16_splat(-128))
        });
    }
    let mut w = nibbles(gb, q, quad);
    match ty {
        QuantType::Q5_0 | QuantType::Q5_1 => {
            fifth_bits(&mut w, load(gb, layout::high_offset(ty) + 16 * quad));
        }
        QuantType::Iq4Nl => {
            let table = i8x16(
                KVALUES[0],
                KVALUES[1],
                KVALUES[2],
                KVALUES[3],
                KVALUES[4],
                KVALUES[5],
                KVALUES[6],
                KVALUES[7],
                KVALUES[8],
                KVALUES[9],
                KVALUES[10],
                KVALUES[11],
                KVALUES[12],
                KVALUES[13],
                KVALUES[14],
                KVALUES[15],
            );
            for wc in &mut w {
                *wc = i8x16_swizzle(table, *wc);
            }
        }
        QuantType::Q4_0
        | QuantType::Q4_1
        | QuantType::Q8_0
        | QuantType::Q4K
        | QuantType::Q5K
        | QuantType::Q6K
        | QuantType::Iq4Xs => {}
    }
    w
}

/// The eight chunks of rows `4 * quad..4 * quad + 4` from four 64-byte
/// nibble loads at `q` (load `l`: chunk `l` in its low nibbles, chunk
/// `l + 4` in its high ones).
#[inline(always)]
fn nibbles(b: &[u8], q: usize, quad: usize) -> [v128; 8] {
    let mut w = [u8x16_splat(0); 8];
    for l in 0..4 {
        let v = load(b, q + 64 * l + 16 * quad);
        w[l] = v128_and(v, u8x16_splat(0x0F));
        w[l + 4] = u8x16_shr(v, 4);
    }
    w
}

/// Puts each chunk's fifth bits into its weights: bit `c` of each byte of
/// `high` is chunk `c`'s (Q5_0, Q5_1, Q5_K).
#[inline(always)]
fn fifth_bits(w: &mut [v128; 8], high: v128) {
    for (c, wc) in w.iter_mut().enumerate() {
        let at4 = if c <= 4 {
            u8x16_shl(high, 4 - c as u32)
        } else {
            u8x16_shr(high, c as u32 - 4)
        };
        *wc = v128_or(*wc, v128_and(at4, u8x16_splat(0x10)));
    }
}

/// One row's sum from each pair: `[r0, r0, r1, r1]` and `[r2, r2, r3,
/// r3]` partials to `[r0, r1, r2, r3]`.
#[inline(always)]
fn pair_up(lo: v128, hi: v128) -> v128 {
    i32x4_add(
        i32x4_shuffle::<0, 2, 4, 6>(lo, hi),
        i32x4_shuffle::<1, 3, 5, 7>(lo, hi),
    )
}

/// 16 bytes of `b` from `at`.
#[inline(always)]
fn load(b: &[u8], at: usize) -> v128 {
    let s = &b[at..at + 16];
    // SAFETY: `s` holds 16 bytes; `v128_load` takes any alignment.
    unsafe { v128_load(s.as_ptr().cast()) }
}

/// Four f16 values of `b` from byte `at`, as f32 (`f16_bits_to_f32`).
#[inline(always)]
fn f16x4(b: &[u8], at: usize) -> v128 {
    let s = &b[at..at + 8];
    // SAFETY: `s` holds 8 bytes, four u16; any alignment.
    f16_bits_to_f32(unsafe { u32x4_load_extend_u16x4(s.as_ptr().cast()) })
}

/// Four f16 (their bits in the low halves of 32-bit lanes) as f32, exactly
/// as `half::f16::to_f32` (NaNs quieted, payload kept).
#[inline(always)]
fn f16_bits_to_f32(h: v128) -> v128 {
    let em = v128_and(h, u32x4_splat(0x7FFF));
    let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    let bits = i32x4_shl(em, 13);
    // Zeros, subnormals and normals: exact, as a product by a power of two.
    let finite = f32x4_mul(bits, f32x4_splat(f32::from_bits((127 + 112) << 23)));
    let nan = v128_and(i32x4_gt(em, i32x4_splat(0x7C00)), u32x4_splat(0x0040_0000));
    let special = v128_or(v128_or(bits, u32x4_splat(0x7F80_0000)), nan);
    let is_special = i32x4_ge(em, i32x4_splat(0x7C00));
    v128_or(v128_bitselect(special, finite, is_special), sign)
}

/// `a * b + c` lane by lane, rounded once, as `f32::mul_add`. The product
/// of two f32 is exact in f64; the sum is rounded to f64 and then to f32.
/// That second rounding can differ from one rounding only where the f64
/// result lies on a midpoint between two f32, or outside the normal f32
/// range: such lanes (rare) are computed by `f32::mul_add`.
#[inline(always)]
fn fma(a: v128, b: v128, c: v128) -> v128 {
    let high = |v: v128| i32x4_shuffle::<2, 3, 2, 3>(v, v);
    let wide = |a: v128, b: v128, c: v128| {
        f64x2_add(
            f64x2_mul(f64x2_promote_low_f32x4(a), f64x2_promote_low_f32x4(b)),
            f64x2_promote_low_f32x4(c),
        )
    };
    let lo = wide(a, b, c);
    let hi = wide(high(a), high(b), high(c));
    if !(rounds_once(lo) && rounds_once(hi)) {
        let (a, b, c) = (lanes(a), lanes(b), lanes(c));
        let r: [f32; 4] = std::array::from_fn(|i| a[i].mul_add(b[i], c[i]));
        return f32x4(r[0], r[1], r[2], r[3]);
    }
    i32x4_shuffle::<0, 1, 4, 5>(f32x4_demote_f64x2_zero(lo), f32x4_demote_f64x2_zero(hi))
}

/// Whether both f64 lanes round to f32 as their exact values would: zero,
/// or a normal f32 magnitude not on a midpoint between two f32 (the low 29
/// of the 52 fraction bits `1000…0`).
#[inline(always)]
fn rounds_once(r: v128) -> bool {
    let a = f64x2_abs(r);
    let normal = v128_and(
        f64x2_ge(a, f64x2_splat(f64::from(f32::MIN_POSITIVE))),
        f64x2_lt(a, f64x2_splat(2f64.powi(128))),
    );
    let midpoint = i64x2_eq(
        v128_and(r, i64x2_splat(0x1FFF_FFFF)),
        i64x2_splat(0x1000_0000),
    );
    let zero = f64x2_eq(a, f64x2_splat(0.0));
    i64x2_all_true(v128_or(v128_andnot(normal, midpoint), zero))
}

/// The four f32 lanes of `v`.
#[inline(always)]
fn lanes(v: v128) -> [f32; 4] {
    [
        f32x4_extract_lane::<0>(v),
        f32x4_extract_lane::<1>(v),
        f32x4_extract_lane::<2>(v),
        f32x4_extract_lane::<3>(v),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{QMatrix, quantize_block_q8_at};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const FORMATS: [QuantType; 6] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Iq4Nl,
    ];

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// Runs `dot_group_rows` on every group of `w` for `rows` activation
    /// rows and checks each against `scalar::dot_group`, bit for bit.
    pub(super) fn check(w: &QMatrix, x: &[Vec<Q8Block>], what: &str) {
        let spreads: Vec<Vec<Spread>> = x.iter().map(|r| r.iter().map(spread).collect()).collect();
        for g in 0..w.groups() {
            for (xs, ss) in x.chunks(TILE).zip(spreads.chunks(TILE)) {
                let xr: Vec<&[Q8Block]> = xs.iter().map(Vec::as_slice).collect();
                let sr: Vec<&[Spread]> = ss.iter().map(Vec::as_slice).collect();
                let mut got = vec![[f32::NAN; GROUP]; xs.len()];
                dot_group_rows(w.ty, w.group(g), &xr, &sr, &mut got);
                for (i, row) in got.iter().enumerate() {
                    let want = scalar::dot_group(w.ty, w.group(g), xr[i]);
                    for lane in 0..GROUP {
                        assert!(
                            same(row[lane], want[lane]),
                            "{what} {:?} group {g} row {i} lane {lane}: {} vs {}",
                            w.ty,
                            row[lane],
                            want[lane]
                        );
                    }
                }
            }
        }
    }

    fn activations(rng: &mut StdRng, rows: usize, cols: usize, scale: f32) -> Vec<Vec<Q8Block>> {
        (0..rows)
            .map(|_| {
                let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-scale..scale)).collect();
                x.chunks_exact(QK)
                    .map(|b| quantize_block_q8_at(b, 0.0))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_format_matches_scalar_bit_for_bit_for_every_tile() {
        let mut rng = StdRng::seed_from_u64(50);
        for ty in FORMATS {
            for (rows, cols, m) in [
                (16, 32, 1),
                (19, 96, 2),
                (40, 576, 3),
                (16, 128, 4),
                (33, 64, 9),
            ] {
                let v: Vec<f32> = (0..rows * cols)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let w = QMatrix::quantize(ty, rows, cols, &v).expect("quantize");
                check(&w, &activations(&mut rng, m, cols, 3.0), "random");
            }
        }
    }

    #[test]
    fn raw_bytes_with_every_scale_match_scalar() {
        // Group blocks of random bytes: scales that are subnormal, huge,
        // infinite or NaN, and sums whose f64 rounding lands on an f32
        // midpoint now and then.
        let mut rng = StdRng::seed_from_u64(51);
        for ty in FORMATS {
            let (rows, cols) = (32, 256);
            let ggml: Vec<u8> = (0..rows * cols / QK * ty.block_bytes())
                .map(|_| rng.random())
                .collect();
            let w = QMatrix::new(ty, rows, cols, &ggml).expect("pack");
            for scale in [1e-30, 1.0, 1e30] {
                check(&w, &activations(&mut rng, 5, cols, scale), "raw");
            }
        }
    }

    #[test]
    fn fma_rounds_once_where_f64_would_round_twice() {
        // a * b + c = 1 + 2^-24 + 2^-70: just above the midpoint of 1 and
        // 1 + 2^-23, so it rounds up; in f64 it rounds to the midpoint,
        // which then rounds to even, down to 1.
        let e = 2f32.powi(-23);
        let (a, b, c) = (1.0 + e, -(1.0 - e) * 2f32.powi(-24), 1.0 + e);
        let want = a.mul_add(b, c);
        assert_eq!(want, 1.0 + e);
        let twice = (f64::from(a) * f64::from(b) + f64::from(c)) as f32;
        assert_eq!(twice, 1.0, "the case rounds twice in f64");
        let got = lanes(fma(f32x4_splat(a), f32x4_splat(b), f32x4_splat(c)));
        assert!(got.iter().all(|&g| same(g, want)), "{got:?} vs {want}");
        for (a, b, c) in [
            (1e-20f32, 1e-20, 1e-39),
            (3e38, 2.0, -3e38),
            (f32::INFINITY, 0.0, 1.0),
        ] {
            let got = lanes(fma(f32x4_splat(a), f32x4_splat(b), f32x4_splat(c)));
            assert!(same(got[0], a.mul_add(b, c)), "{a} {b} {c}: {got:?}");
        }
    }

    #[test]
    fn f16_conversion_matches_half_for_every_value() {
        for h in 0..=u16::MAX {
            let bytes = [h.to_le_bytes(), h.to_le_bytes(), [0, 0], [0, 0]].concat();
            let got = lanes(f16x4(&bytes, 0))[0];
            let want = half::f16::from_bits(h).to_f32();
            assert_eq!(got.to_bits(), want.to_bits(), "f16 {h:#06x}");
        }
    }
}
