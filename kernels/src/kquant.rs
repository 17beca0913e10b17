//! GGML's K-quant formats, as stored in GGUF files: their byte layout,
//! their dequantization exactly as ggml computes it (the reference every
//! K-quant kernel is checked against), simple quantizers for tests and
//! benchmarks, and each super-block taken apart into the fields the
//! kernels' layout (`crate::klayout`) stores.
//!
//! - Q4_K: super-blocks of 256 weights: f16 `d` and `dmin`, twelve bytes
//!   holding eight 6-bit scales and eight 6-bit mins, then 128 bytes of
//!   nibbles. Sub-block `j` (32 weights) is `w = (d·sc_j)·q - (dmin·m_j)`;
//!   its nibbles are the low (even `j`) or high (odd `j`) halves of bytes
//!   `32·(j/2)..32·(j/2) + 32`.
//! - Q5_K: Q4_K's fields with 32 bytes of high bits `qh` before the
//!   nibbles: bit `j` of `qh[l]` is the fifth bit of weight `l` of
//!   sub-block `j`; `w = (d·sc_j)·q - (dmin·m_j)` with `q` in 0..32.
//! - Q6_K: 128 bytes of low nibbles `ql`, 64 bytes of 2-bit high parts
//!   `qh`, sixteen signed 8-bit scales (one per 16 weights), f16 `d`:
//!   `w = (d·sc_{i/16})·(q - 32)` with `q` in 0..64.

use half::f16;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K super-block.
pub const Q4K_BYTES: usize = 2 + 2 + 12 + QK_K / 2;
/// Bytes of one Q5_K super-block.
pub const Q5K_BYTES: usize = Q4K_BYTES + QK_K / 8;
/// Bytes of one Q6_K super-block.
pub const Q6K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

fn f16_bits(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn f32_of(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Scale and min (6 bits each) of sub-block `j` of a Q4_K super-block.
fn scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// One Q4_K or Q5_K super-block taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Q4kBlock {
    /// f16 bits of the super-block scale and min scale.
    pub d: u16,
    pub dmin: u16,
    /// 6-bit scale and min of each 32-weight sub-block.
    pub sc: [u8; 8],
    pub m: [u8; 8],
    /// The quants, in weight order: 4 bits (Q4_K) or 5 (Q5_K).
    pub q: [u8; QK_K],
}

/// Q5_K's fields are Q4_K's, with five-bit quants.
pub type Q5kBlock = Q4kBlock;

impl Q4kBlock {
    /// Reads one Q4_K super-block (`Q4K_BYTES` bytes).
    pub fn from_ggml(b: &[u8]) -> Self {
        Self::read(b, None)
    }

    /// Reads one Q5_K super-block (`Q5K_BYTES` bytes).
    pub fn from_ggml_q5k(b: &[u8]) -> Self {
        Self::read(b, Some(&b[16..48]))
    }

    fn read(b: &[u8], qh: Option<&[u8]>) -> Self {
        let scales = &b[4..16];
        let qs = &b[16 + qh.map_or(0, <[u8]>::len)..];
        let mut out = Self {
            d: f16_bits(b, 0),
            dmin: f16_bits(b, 2),
            sc: [0; 8],
            m: [0; 8],
            q: [0; QK_K],
        };
        for j in 0..8 {
            (out.sc[j], out.m[j]) = scale_min(scales, j);
            let bytes = &qs[32 * (j / 2)..][..32];
            for (l, &byte) in bytes.iter().enumerate() {
                let high = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
                out.q[32 * j + l] = high | if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            }
        }
        out
    }

    /// The Q4_K bytes (the inverse of `from_ggml`).
    pub fn to_ggml(&self) -> Vec<u8> {
        self.write(false)
    }

    /// The Q5_K bytes (the inverse of `from_ggml_q5k`).
    pub fn to_ggml_q5k(&self) -> Vec<u8> {
        self.write(true)
    }

    fn write(&self, q5: bool) -> Vec<u8> {
        let mut b = Vec::with_capacity(Q5K_BYTES);
        b.extend_from_slice(&self.d.to_le_bytes());
        b.extend_from_slice(&self.dmin.to_le_bytes());
        let (sc, m) = (&self.sc, &self.m);
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            scales[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            scales[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
        }
        b.extend_from_slice(&scales);
        if q5 {
            b.extend(
                (0..32)
                    .map(|l| (0..8).fold(0u8, |h, j| h | (((self.q[32 * j + l] >> 4) & 1) << j))),
            );
        }
        for pair in self.q.chunks_exact(64) {
            b.extend((0..32).map(|l| (pair[l] & 0x0F) | ((pair[32 + l] & 0x0F) << 4)));
        }
        b
    }
}

/// One Q6_K super-block taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Q6kBlock {
    /// f16 bits of the super-block scale.
    pub d: u16,
    /// The scale of each 16 weights.
    pub sc: [i8; 16],
    /// The 6-bit quants (0..64, 32 meaning zero), in weight order.
    pub q: [u8; QK_K],
}

/// Where weight `i` of a Q6_K super-block keeps its bits: (byte of `ql`,
/// high nibble?, byte of `qh`, shift in it).
fn q6k_place(i: usize) -> (usize, bool, usize, usize) {
    let (n, r) = (i / 128, i % 128);
    let (quarter, l) = (r / 32, r % 32);
    (
        64 * n + l + 32 * (quarter & 1),
        quarter >= 2,
        32 * n + l,
        2 * quarter,
    )
}

impl Q6kBlock {
    /// Reads one super-block (`Q6K_BYTES` bytes).
    pub fn from_ggml(b: &[u8]) -> Self {
        let (ql, qh) = (&b[..128], &b[128..192]);
        let mut out = Self {
            d: f16_bits(b, 208),
            sc: std::array::from_fn(|k| b[192 + k] as i8),
            q: [0; QK_K],
        };
        for (i, q) in out.q.iter_mut().enumerate() {
            let (lo, high, hi, shift) = q6k_place(i);
            let nib = if high { ql[lo] >> 4 } else { ql[lo] & 0x0F };
            *q = nib | (((qh[hi] >> shift) & 3) << 4);
        }
        out
    }

    /// The GGML bytes (the inverse of `from_ggml`).
    pub fn to_ggml(&self) -> Vec<u8> {
        let mut b = vec![0u8; Q6K_BYTES];
        for (i, &q) in self.q.iter().enumerate() {
            let (lo, high, hi, shift) = q6k_place(i);
            b[lo] |= if high { (q & 0x0F) << 4 } else { q & 0x0F };
            b[128 + hi] |= (q >> 4) << shift;
        }
        for (k, &s) in self.sc.iter().enumerate() {
            b[192 + k] = s as u8;
        }
        b[208..210].copy_from_slice(&self.d.to_le_bytes());
        b
    }
}

/// Dequantizes one Q4_K super-block as ggml's `dequantize_row_q4_K` does.
pub fn dequantize_q4k(b: &[u8]) -> Vec<f32> {
    dequantize_scaled(&Q4kBlock::from_ggml(b))
}

/// Dequantizes one Q5_K super-block as ggml's `dequantize_row_q5_K` does.
pub fn dequantize_q5k(b: &[u8]) -> Vec<f32> {
    dequantize_scaled(&Q4kBlock::from_ggml_q5k(b))
}

/// `(d·sc_j)·q - (dmin·m_j)`, sub-block by sub-block.
fn dequantize_scaled(k: &Q4kBlock) -> Vec<f32> {
    let (d, dmin) = (f32_of(k.d), f32_of(k.dmin));
    let mut y = Vec::with_capacity(QK_K);
    for j in 0..8 {
        let (dj, mj) = (d * f32::from(k.sc[j]), dmin * f32::from(k.m[j]));
        y.extend(k.q[32 * j..][..32].iter().map(|&q| dj * f32::from(q) - mj));
    }
    y
}

/// Dequantizes one Q6_K super-block as ggml's `dequantize_row_q6_K` does.
pub fn dequantize_q6k(b: &[u8]) -> Vec<f32> {
    let k = Q6kBlock::from_ggml(b);
    let d = f32_of(k.d);
    (0..QK_K)
        .map(|i| d * f32::from(k.sc[i / 16]) * f32::from(i32::from(k.q[i]) as i8 - 32))
        .collect()
}

fn round_clamp(v: f32, lo: f32, hi: f32) -> f32 {
    v.round().clamp(lo, hi)
}

/// Quantizes 256 weights into one Q4_K super-block: each sub-block's
/// range to 4 bits, its step and (non-positive) minimum to 6 bits of the
/// super-block's (a plain quantizer, not ggml's search for the best
/// scales; for tests and benchmarks).
pub fn quantize_q4k(x: &[f32]) -> Vec<u8> {
    quantize_scaled(x, 15.0).to_ggml()
}

/// Quantizes 256 weights into one Q5_K super-block (as `quantize_q4k`,
/// with 5-bit quants).
pub fn quantize_q5k(x: &[f32]) -> Vec<u8> {
    quantize_scaled(x, 31.0).to_ggml_q5k()
}

fn quantize_scaled(x: &[f32], top: f32) -> Q4kBlock {
    let subs: Vec<(f32, f32)> = x
        .chunks_exact(32)
        .map(|s| {
            let min = s.iter().copied().fold(0.0f32, f32::min);
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            ((max - min) / top, -min)
        })
        .collect();
    let d = f16::from_f32(subs.iter().fold(0.0f32, |a, s| a.max(s.0)) / 63.0);
    let dmin = f16::from_f32(subs.iter().fold(0.0f32, |a, s| a.max(s.1)) / 63.0);
    let inv = |v: f32, by: f16| {
        if by.to_f32() > 0.0 {
            v / by.to_f32()
        } else {
            0.0
        }
    };
    let mut k = Q4kBlock {
        d: d.to_bits(),
        dmin: dmin.to_bits(),
        sc: [0; 8],
        m: [0; 8],
        q: [0; QK_K],
    };
    for (j, (s, &(step, neg_min))) in x.chunks_exact(32).zip(&subs).enumerate() {
        k.sc[j] = round_clamp(inv(step, d), 0.0, 63.0) as u8;
        k.m[j] = round_clamp(inv(neg_min, dmin), 0.0, 63.0) as u8;
        let dj = d.to_f32() * f32::from(k.sc[j]);
        let mj = dmin.to_f32() * f32::from(k.m[j]);
        for (q, &v) in k.q[32 * j..][..32].iter_mut().zip(s) {
            *q = if dj > 0.0 {
                round_clamp((v + mj) / dj, 0.0, top) as u8
            } else {
                0
            };
        }
    }
    k
}

/// Quantizes 256 weights into one Q6_K super-block: each 16 weights'
/// step from their largest magnitude, in 8 signed bits of the
/// super-block's (for tests and benchmarks).
pub fn quantize_q6k(x: &[f32]) -> Vec<u8> {
    let steps: Vec<f32> = x
        .chunks_exact(16)
        .map(|s| s.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 31.0)
        .collect();
    let d = f16::from_f32(steps.iter().fold(0.0f32, |a, &s| a.max(s)) / 127.0);
    let mut k = Q6kBlock {
        d: d.to_bits(),
        sc: [0; 16],
        q: [32; QK_K],
    };
    for (i, (s, &step)) in x.chunks_exact(16).zip(&steps).enumerate() {
        let sc = if d.to_f32() > 0.0 {
            round_clamp(step / d.to_f32(), -128.0, 127.0)
        } else {
            0.0
        };
        k.sc[i] = sc as i8;
        let di = d.to_f32() * sc;
        for (q, &v) in k.q[16 * i..][..16].iter_mut().zip(s) {
            *q = if di != 0.0 {
                (round_clamp(v / di, -32.0, 31.0) + 32.0) as u8
            } else {
                32
            };
        }
    }
    k.to_ggml()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| ((i + seed) * 131 % 251) as u8).collect()
    }

    #[test]
    fn super_blocks_come_apart_and_back_bit_for_bit() {
        for seed in 0..20 {
            let b = bytes(Q4K_BYTES, seed);
            assert_eq!(Q4kBlock::from_ggml(&b).to_ggml(), b, "Q4_K seed {seed}");
            let b = bytes(Q6K_BYTES, seed);
            assert_eq!(Q6kBlock::from_ggml(&b).to_ggml(), b, "Q6_K seed {seed}");
            let b = bytes(Q5K_BYTES, seed);
            assert_eq!(
                Q5kBlock::from_ggml_q5k(&b).to_ggml_q5k(),
                b,
                "Q5_K seed {seed}"
            );
        }
    }

    /// ggml's `dequantize_row_q6_K` loop, transcribed as it is written.
    fn ggml_q6k(b: &[u8]) -> Vec<f32> {
        let d = f32_of(f16_bits(b, 208));
        let mut y = vec![0.0; QK_K];
        let (mut ql, mut qh, mut sc) = (&b[..128], &b[128..192], &b[192..208]);
        for n in 0..2 {
            let y = &mut y[128 * n..];
            for l in 0..32 {
                let is = l / 16;
                let q = |v: u8| i32::from(v) - 32;
                let q1 = q((ql[l] & 0xF) | ((qh[l] & 3) << 4));
                let q2 = q((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
                let q3 = q((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                let q4 = q((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
                let s = |k: usize| f32::from(sc[k] as i8);
                y[l] = d * s(is) * q1 as f32;
                y[l + 32] = d * s(is + 2) * q2 as f32;
                y[l + 64] = d * s(is + 4) * q3 as f32;
                y[l + 96] = d * s(is + 6) * q4 as f32;
            }
            (ql, qh, sc) = (&ql[64..], &qh[32..], &sc[8..]);
        }
        y
    }

    #[test]
    fn q6k_dequantizes_as_ggml_writes_it() {
        for seed in 0..10 {
            let mut b = bytes(Q6K_BYTES, seed);
            b[208..].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            let (got, want) = (dequantize_q6k(&b), ggml_q6k(&b));
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "seed {seed}");
        }
    }

    #[test]
    fn the_plain_quantizers_stay_within_a_step() {
        let x: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let q4 = dequantize_q4k(&quantize_q4k(&x));
        let q6 = dequantize_q6k(&quantize_q6k(&x));
        let q5 = dequantize_q5k(&quantize_q5k(&x));
        let err = |y: &[f32]| {
            y.iter()
                .zip(&x)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max)
        };
        // Steps of about 2/15 and 1/31, plus the 6- and 8-bit scale rounding.
        assert!(err(&q4) <= 0.1, "Q4_K error {}", err(&q4));
        assert!(err(&q6) <= 0.025, "Q6_K error {}", err(&q6));
        assert!(err(&q5) <= 0.05, "Q5_K error {}", err(&q5));
        assert_eq!(dequantize_q6k(&quantize_q6k(&[0.0; QK_K])), vec![0.0; QK_K]);
    }
}
