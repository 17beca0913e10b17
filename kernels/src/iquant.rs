//! GGML's non-linear 4-bit formats, as stored in GGUF files: their byte
//! layout, their dequantization exactly as ggml computes it (the reference
//! the kernels are checked against), quantizers for tests and synthetic
//! models, and each IQ4_XS super-block taken apart into the fields the
//! kernels' layout (`crate::klayout`) stores.
//!
//! Both map each 4-bit index through one table of 16 signed values
//! (`KVALUES`, ggml's `kvalues_iq4nl`), denser near zero than Q4_0's
//! evenly spaced steps:
//! - IQ4_NL: blocks of 32 weights, f16 `d` then 16 bytes of indices in
//!   Q4_0's nibble order (byte `j`: weight `j` low, `j + 16` high);
//!   `w = d * KVALUES[i]`.
//! - IQ4_XS: super-blocks of 256 weights: f16 `d`, u16 `scales_h`, four
//!   bytes `scales_l`, 128 bytes of indices (16 per 32-weight sub-block,
//!   in IQ4_NL's order). Sub-block `j` has the 6-bit scale
//!   `ls = (scales_l[j/2] >> 4(j%2) & 15) | ((scales_h >> 2j & 3) << 4)`
//!   and `w = (d * (ls - 32)) * KVALUES[i]`.

use half::f16;

use crate::kquant::QK_K;
use crate::quant::QK;

/// ggml's `kvalues_iq4nl`: the weight each 4-bit index stands for.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Bytes of one IQ4_NL block (32 weights).
pub const IQ4NL_BYTES: usize = 2 + QK / 2;
/// Bytes of one IQ4_XS super-block (256 weights).
pub const IQ4XS_BYTES: usize = 2 + 2 + QK_K / 64 + QK_K / 2;

fn f16_of(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// One IQ4_NL block (`IQ4NL_BYTES`) to f32, as ggml.
pub fn dequantize_iq4nl(b: &[u8]) -> [f32; QK] {
    let d = f16_of(b, 0);
    let mut out = [0.0; QK];
    for j in 0..QK / 2 {
        out[j] = d * f32::from(KVALUES[usize::from(b[2 + j] & 0x0F)]);
        out[j + 16] = d * f32::from(KVALUES[usize::from(b[2 + j] >> 4)]);
    }
    out
}

/// One IQ4_XS super-block (`IQ4XS_BYTES`) to f32, as ggml's
/// `dequantize_row_iq4_xs`.
pub fn dequantize_iq4xs(b: &[u8]) -> Vec<f32> {
    let k = Iq4xsBlock::from_ggml(b);
    let d = f16::from_bits(k.d).to_f32();
    let mut out = Vec::with_capacity(QK_K);
    for (j, q) in k.q.chunks_exact(QK).enumerate() {
        let dl = d * f32::from(k.ls[j]);
        out.extend(q.iter().map(|&i| dl * f32::from(KVALUES[usize::from(i)])));
    }
    out
}

/// One IQ4_XS super-block taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iq4xsBlock {
    /// f16 bits of the super-block scale.
    pub d: u16,
    /// Each sub-block's scale, `ls - 32` (-32..32).
    pub ls: [i8; 8],
    /// The 4-bit indices into `KVALUES`, in weight order.
    pub q: [u8; QK_K],
}

impl Iq4xsBlock {
    /// Reads one super-block (`IQ4XS_BYTES` bytes).
    pub fn from_ggml(b: &[u8]) -> Self {
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        let (scales_l, qs) = (&b[4..8], &b[8..8 + QK_K / 2]);
        let mut k = Self {
            d: u16::from_le_bytes([b[0], b[1]]),
            ls: [0; 8],
            q: [0; QK_K],
        };
        for j in 0..8 {
            let low = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0F;
            let high = ((scales_h >> (2 * j)) & 3) as u8;
            k.ls[j] = ((low | (high << 4)) as i8) - 32;
            for (l, &byte) in qs[16 * j..][..16].iter().enumerate() {
                k.q[32 * j + l] = byte & 0x0F;
                k.q[32 * j + l + 16] = byte >> 4;
            }
        }
        k
    }

    /// The GGML bytes (the inverse of `from_ggml`).
    pub fn to_ggml(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(IQ4XS_BYTES);
        b.extend_from_slice(&self.d.to_le_bytes());
        let six = self.ls.map(|l| (l + 32) as u8 & 63);
        let scales_h = (0..8).fold(0u16, |h, j| h | (u16::from(six[j] >> 4) << (2 * j)));
        b.extend_from_slice(&scales_h.to_le_bytes());
        b.extend((0..4).map(|p| (six[2 * p] & 0x0F) | ((six[2 * p + 1] & 0x0F) << 4)));
        for q in self.q.chunks_exact(QK) {
            b.extend((0..16).map(|l| (q[l] & 0x0F) | ((q[l + 16] & 0x0F) << 4)));
        }
        b
    }
}

/// The index of the table value nearest `v` (the lower on a tie).
fn nearest(v: f32) -> u8 {
    let mut best = 0;
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        if (v - f32::from(k)).abs() < (v - f32::from(KVALUES[best])).abs() {
            best = i;
        }
    }
    best as u8
}

/// The scale of 32 weights against the table, as ggml's
/// `quantize_row_iq4_nl_impl` searches it without an importance matrix:
/// scales around `max / -127` tried, each fitted by least squares with
/// weights `x²`, the best kept.
fn block_scale(x: &[f32]) -> f32 {
    let max = x
        .iter()
        .copied()
        .fold(0.0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    if max == 0.0 {
        return 0.0;
    }
    let (mut best_d, mut best) = (max / f32::from(KVALUES[0]), 0.0f32);
    for t in -7i8..=7 {
        let id = (f32::from(t) + f32::from(KVALUES[0])) / max;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = f32::from(KVALUES[usize::from(nearest(id * v))]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            (best_d, best) = (sumqx / sumq2, sumqx * sumqx / sumq2);
        }
    }
    best_d
}

/// The indices of `x` against scale `d`.
fn indices(x: &[f32], d: f32) -> impl Iterator<Item = u8> + '_ {
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    x.iter().map(move |&v| nearest(v * id))
}

/// Quantizes 32 weights to one IQ4_NL block.
pub fn quantize_iq4nl(x: &[f32]) -> Vec<u8> {
    let d = f16::from_f32(block_scale(x));
    let q: Vec<u8> = indices(x, d.to_f32()).collect();
    let mut b = d.to_bits().to_le_bytes().to_vec();
    b.extend((0..16).map(|l| q[l] | (q[l + 16] << 4)));
    b
}

/// Quantizes 256 weights to one IQ4_XS super-block: each sub-block's
/// scale as IQ4_NL's, those eight scales to 6 bits against the largest
/// (`d = -max / 32`, as ggml), then the indices against the scales kept.
pub fn quantize_iq4xs(x: &[f32]) -> Vec<u8> {
    let scales: Vec<f32> = x.chunks_exact(QK).map(block_scale).collect();
    let max = scales
        .iter()
        .copied()
        .fold(0.0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    let d = f16::from_f32(-max / 32.0);
    let id = if d.to_f32() != 0.0 {
        1.0 / d.to_f32()
    } else {
        0.0
    };
    let mut k = Iq4xsBlock {
        d: d.to_bits(),
        ls: [0; 8],
        q: [0; QK_K],
    };
    for (j, (s, xs)) in scales.iter().zip(x.chunks_exact(QK)).enumerate() {
        k.ls[j] = (s * id).round().clamp(-32.0, 31.0) as i8;
        let dl = d.to_f32() * f32::from(k.ls[j]);
        for (q, i) in k.q[QK * j..][..QK].iter_mut().zip(indices(xs, dl)) {
            *q = i;
        }
    }
    k.to_ggml()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn iq4xs_blocks_round_trip_every_field() {
        for seed in 0..8u32 {
            let bytes: Vec<u8> = (0..IQ4XS_BYTES)
                .map(|i| ((i as u32 * 131 + seed * 17) % 251) as u8)
                .collect();
            let k = Iq4xsBlock::from_ggml(&bytes);
            assert_eq!(k.to_ggml(), bytes, "seed {seed}");
            assert!(k.ls.iter().all(|l| (-32..32).contains(l)));
        }
    }

    #[test]
    fn dequantization_follows_ggml() {
        // d = 0.5, scales_h: sub-block 1's high bits = 3, scales_l: sub-block 0
        // low 5, sub-block 1 low 2; indices ascending.
        let mut b = vec![0u8; IQ4XS_BYTES];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&(3u16 << 2).to_le_bytes());
        b[4] = 5 | (2 << 4);
        for l in 0..16 {
            b[8 + l] = (l as u8) | (((15 - l) as u8) << 4);
        }
        let w = dequantize_iq4xs(&b);
        // Sub-block 0: ls = 5, dl = 0.5 * (5 - 32).
        assert_eq!(w[3], 0.5 * -27.0 * f32::from(KVALUES[3]));
        assert_eq!(w[16 + 2], 0.5 * -27.0 * f32::from(KVALUES[13]));
        // Sub-block 1: ls = 2 | 3 << 4 = 50; its indices are all 0.
        assert_eq!(w[32], 0.5 * 18.0 * -127.0);
        // As IQ4_NL: byte 2 (12) holds weight 0 low and weight 16 high.
        let nl = dequantize_iq4nl(&b[..IQ4NL_BYTES]);
        assert_eq!((nl[0], nl[16]), (0.5 * 53.0, 0.5 * -127.0));
        assert_eq!(nl[9], 0.5 * f32::from(KVALUES[3]));
    }

    #[test]
    fn quantizers_stay_within_a_step_of_the_table() {
        let x = noise(QK_K, 3);
        let nl: Vec<f32> = x
            .chunks_exact(QK)
            .flat_map(|b| dequantize_iq4nl(&quantize_iq4nl(b)))
            .collect();
        let xs = dequantize_iq4xs(&quantize_iq4xs(&x));
        for back in [&nl, &xs] {
            let rms = (x
                .iter()
                .zip(back.iter())
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f32>()
                / x.len() as f32)
                .sqrt();
            // Uniform noise in [-1, 1]: the widest gap of the table is 24/127
            // of the scale, so the error stays under about 0.1.
            assert!(rms < 0.1, "rms {rms}");
        }
        assert_eq!(quantize_iq4nl(&[0.0; QK])[..2], [0, 0]);
    }
}
