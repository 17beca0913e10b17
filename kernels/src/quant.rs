//! Quantized block formats (GGML layouts, as stored in GGUF files) and the
//! Q8 activation blocks the integer dot products run against.
//!
//! The 32-weight formats:
//! - `Q4_0`: f16 scale `d`, 16 bytes of nibbles; `w = d * (q - 8)`;
//! - `Q4_1`: f16 scale `d`, f16 min `m`, 16 bytes of nibbles; `w = d * q + m`;
//! - `Q8_0`: f16 scale `d`, 32 signed bytes; `w = d * q`;
//! - `Q5_0`: f16 `d`, 32 high bits (`u32`, bit `j` of weight `j`), 16
//!   bytes of nibbles; `w = d * (q - 16)` with `q` in 0..32;
//! - `Q5_1`: f16 `d`, f16 min `m`, the high bits, the nibbles;
//!   `w = d * q + m`.
//!
//! Nibble order follows GGML: byte `j` holds weight `j` in its low nibble
//! and weight `j + 16` in its high nibble. The K-quants (`Q4_K`, `Q5_K`, `Q6_K`:
//! super-blocks of 256 weights) are described in `crate::kquant`; the
//! kernels read them in their own blocks too, 32 weights at a time. So
//! are the non-linear IQ4_NL and IQ4_XS (`crate::iquant`).

use half::f16;

use crate::{iquant, kquant, layout};

/// Weights (and activations) per quantization block.
pub const QK: usize = 32;

/// A supported weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q8_0,
    Q5_0,
    Q5_1,
    /// GGML's Q4_K (4.5 bits a weight).
    Q4K,
    /// GGML's Q5_K (5.5 bits a weight).
    Q5K,
    /// GGML's Q6_K (6.5625 bits a weight).
    Q6K,
    /// GGML's IQ4_NL (4.5 bits a weight, a non-linear table).
    Iq4Nl,
    /// GGML's IQ4_XS (4.25 bits a weight: IQ4_NL's table in super-blocks).
    Iq4Xs,
}

impl QuantType {
    /// Bytes of one GGML block (`block_weights` weights).
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q4K => kquant::Q4K_BYTES,
            Self::Q5K => kquant::Q5K_BYTES,
            Self::Q6K => kquant::Q6K_BYTES,
            Self::Iq4Nl => iquant::IQ4NL_BYTES,
            Self::Iq4Xs => iquant::IQ4XS_BYTES,
        }
    }

    /// Weights of one GGML block: 32, or 256 for a K-quant super-block.
    pub const fn block_weights(self) -> usize {
        if self.is_k() { kquant::QK_K } else { QK }
    }

    /// Whether this format has super-blocks of 256 weights (the K-quants
    /// and IQ4_XS, kept in `crate::klayout`).
    pub const fn is_k(self) -> bool {
        matches!(self, Self::Q4K | Self::Q5K | Self::Q6K | Self::Iq4Xs)
    }
}

/// Errors of kernel inputs (shapes and sizes that do not fit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("the column count {cols} is not a multiple of {block} (the format's block)")]
    Unaligned { cols: usize, block: usize },
    /// A GPU backend's device could not be opened or used.
    #[error("GPU: {0}")]
    Device(String),
}

/// A quantized weight matrix: `rows` output features, each a row of `cols`
/// inputs (`cols / 32` blocks per row), stored in the interleaved layout of
/// `crate::layout` (16 rows per group) that the kernels read.
#[derive(Debug, Clone)]
pub struct QMatrix {
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    data: Packed,
}

/// A matrix's packed bytes: its own buffer, or its span of a buffer it
/// shares with the matrices split from the same stack (`split_groups`:
/// the experts of a layer, contiguous in memory as in the file).
#[derive(Debug, Clone)]
struct Packed {
    buf: std::sync::Arc<Vec<u8>>,
    start: usize,
    len: usize,
}

impl Packed {
    fn new(buf: Vec<u8>) -> Self {
        crate::cpu::pages::prefer_huge(&buf);
        let len = buf.len();
        Self {
            buf: std::sync::Arc::new(buf),
            start: 0,
            len,
        }
    }
}

impl std::ops::Deref for Packed {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl QMatrix {
    /// Takes raw GGML block bytes (row-major), checking their length, and
    /// repacks them.
    pub fn new(ty: QuantType, rows: usize, cols: usize, ggml: &[u8]) -> Result<Self, KernelError> {
        check_cols(ty, cols)?;
        let expected = rows * cols / ty.block_weights() * ty.block_bytes();
        if ggml.len() != expected {
            return Err(KernelError::Shape {
                what: "quantized bytes",
                expected,
                got: ggml.len(),
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            data: Packed::new(layout::pack(ty, rows, cols, ggml)),
        })
    }

    /// 32-weight blocks per row (a K-quant super-block holds eight).
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Bytes of the packed weights (what one pass over them reads).
    pub fn data_len(&self) -> usize {
        self.data.len()
    }

    /// Groups of `layout::GROUP` rows (the last one may be padded).
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(layout::GROUP)
    }

    /// The packed bytes of group `g`: `blocks_per_row` group blocks.
    pub fn group(&self, g: usize) -> &[u8] {
        let len = layout::group_bytes(self.ty, self.cols);
        &self.data[g * len..(g + 1) * len]
    }

    /// The GGML bytes of row `r`.
    pub fn ggml_row(&self, r: usize) -> Vec<u8> {
        layout::read_row(self.ty, self.group(r / layout::GROUP), r % layout::GROUP)
    }

    /// The same matrix in memory of its own (a `clone` shares the buffer):
    /// for benchmarks that cycle through copies to read from memory.
    pub fn copy(&self) -> QMatrix {
        QMatrix {
            data: Packed::new(self.data.to_vec()),
            ..self.clone()
        }
    }

    /// Splits a stack of matrices of `rows_each` rows (a multiple of
    /// `layout::GROUP`) into them, in order, without a copy: they share
    /// this matrix's buffer, one span each (a layer's experts, loaded as
    /// one stack, so they lie together on huge pages: `cpu::pages`).
    pub fn split_groups(self, rows_each: usize) -> Result<Vec<QMatrix>, KernelError> {
        if rows_each == 0
            || !rows_each.is_multiple_of(layout::GROUP)
            || !self.rows.is_multiple_of(rows_each)
        {
            return Err(KernelError::Shape {
                what: "rows of each stacked matrix (a multiple of 16 dividing the stack)",
                expected: self.rows,
                got: rows_each,
            });
        }
        let bytes = rows_each / layout::GROUP * layout::group_bytes(self.ty, self.cols);
        Ok((0..self.rows / rows_each)
            .map(|i| QMatrix {
                ty: self.ty,
                rows: rows_each,
                cols: self.cols,
                data: Packed {
                    buf: self.data.buf.clone(),
                    start: self.data.start + i * bytes,
                    len: bytes,
                },
            })
            .collect())
    }

    /// Stacks matrices with the same format and width into one (their rows
    /// in order), so several projections of one input run as one matmul.
    pub fn concat(parts: &[&QMatrix]) -> Result<Self, KernelError> {
        let first = parts.first().ok_or(KernelError::Shape {
            what: "matrices to stack",
            expected: 1,
            got: 0,
        })?;
        let mut ggml = Vec::new();
        let mut rows = 0;
        for p in parts {
            if p.ty != first.ty || p.cols != first.cols {
                return Err(KernelError::Shape {
                    what: "stacked matrix width",
                    expected: first.cols,
                    got: p.cols,
                });
            }
            ggml.extend((0..p.rows).flat_map(|r| p.ggml_row(r)));
            rows += p.rows;
        }
        Self::new(first.ty, rows, first.cols, &ggml)
    }

    /// Dequantizes row `r` (the reference for every kernel).
    pub fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let bb = self.ty.block_bytes();
        let row = self.ggml_row(r);
        match self.ty {
            QuantType::Q4K => row
                .chunks_exact(bb)
                .flat_map(kquant::dequantize_q4k)
                .collect(),
            QuantType::Q5K => row
                .chunks_exact(bb)
                .flat_map(kquant::dequantize_q5k)
                .collect(),
            QuantType::Q6K => row
                .chunks_exact(bb)
                .flat_map(kquant::dequantize_q6k)
                .collect(),
            QuantType::Iq4Xs => row
                .chunks_exact(bb)
                .flat_map(iquant::dequantize_iq4xs)
                .collect(),
            QuantType::Iq4Nl
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q8_0
            | QuantType::Q5_0
            | QuantType::Q5_1 => row
                .chunks_exact(bb)
                .flat_map(|b| dequantize_block(self.ty, b))
                .collect(),
        }
    }

    /// The same weights in another format (through f32: lossy unless
    /// `ty`'s step is finer): for a backend without kernels for this one.
    pub fn requantize(&self, ty: QuantType) -> Result<Self, KernelError> {
        let w: Vec<f32> = (0..self.rows)
            .flat_map(|r| self.dequantize_row(r))
            .collect();
        Self::quantize(ty, self.rows, self.cols, &w)
    }

    /// Quantizes `rows x cols` f32 weights (row-major) into `ty`, as GGML's
    /// reference quantizers do. Used by tests and benchmarks.
    pub fn quantize(
        ty: QuantType,
        rows: usize,
        cols: usize,
        w: &[f32],
    ) -> Result<Self, KernelError> {
        if w.len() != rows * cols {
            return Err(KernelError::Shape {
                what: "weights",
                expected: rows * cols,
                got: w.len(),
            });
        }
        check_cols(ty, cols)?;
        let data: Vec<u8> = match ty {
            QuantType::Q4K => w
                .chunks_exact(kquant::QK_K)
                .flat_map(kquant::quantize_q4k)
                .collect(),
            QuantType::Q5K => w
                .chunks_exact(kquant::QK_K)
                .flat_map(kquant::quantize_q5k)
                .collect(),
            QuantType::Q6K => w
                .chunks_exact(kquant::QK_K)
                .flat_map(kquant::quantize_q6k)
                .collect(),
            QuantType::Iq4Xs => w
                .chunks_exact(kquant::QK_K)
                .flat_map(iquant::quantize_iq4xs)
                .collect(),
            QuantType::Iq4Nl
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q8_0
            | QuantType::Q5_0
            | QuantType::Q5_1 => w
                .chunks_exact(QK)
                .flat_map(|b| quantize_block(ty, b))
                .collect(),
        };
        Self::new(ty, rows, cols, &data)
    }
}

/// Refuses a row width that is not whole blocks of `ty`.
fn check_cols(ty: QuantType, cols: usize) -> Result<(), KernelError> {
    if cols.is_multiple_of(ty.block_weights()) {
        Ok(())
    } else {
        Err(KernelError::Unaligned {
            cols,
            block: ty.block_weights(),
        })
    }
}

pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Dequantizes one 32-weight block (K-quants: `kquant`).
fn dequantize_block(ty: QuantType, b: &[u8]) -> [f32; QK] {
    let mut out = [0.0; QK];
    match ty {
        QuantType::Q4_0 | QuantType::Q4_1 => {
            let d = f16_at(b, 0);
            let (m, qs) = if ty == QuantType::Q4_1 {
                (f16_at(b, 2), &b[4..20])
            } else {
                (-8.0 * d, &b[2..18])
            };
            for j in 0..16 {
                out[j] = d * f32::from(qs[j] & 0x0F) + m;
                out[j + 16] = d * f32::from(qs[j] >> 4) + m;
            }
        }
        QuantType::Q5_0 | QuantType::Q5_1 => {
            let d = f16_at(b, 0);
            let (m, at) = if ty == QuantType::Q5_1 {
                (f16_at(b, 2), 4)
            } else {
                (0.0, 2)
            };
            let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            let qs = &b[at + 4..at + 20];
            let high = |j: usize| (((qh >> j) & 1) << 4) as u8;
            for j in 0..16 {
                let (q0, q1) = ((qs[j] & 0x0F) | high(j), (qs[j] >> 4) | high(j + 16));
                if ty == QuantType::Q5_0 {
                    out[j] = f32::from(i16::from(q0) - 16) * d;
                    out[j + 16] = f32::from(i16::from(q1) - 16) * d;
                } else {
                    out[j] = f32::from(q0) * d + m;
                    out[j + 16] = f32::from(q1) * d + m;
                }
            }
        }
        QuantType::Iq4Nl => return iquant::dequantize_iq4nl(b),
        QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Iq4Xs => {
            unreachable!("a K-quant block is 256 weights")
        }
        QuantType::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = d * f32::from(q as i8);
            }
        }
    }
    out
}

/// Quantizes one 32-weight block (K-quants: `kquant`).
fn quantize_block(ty: QuantType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ty.block_bytes());
    match ty {
        QuantType::Q4_0 => {
            // Scale by the value of largest magnitude, mapped to -8.
            let max = x
                .iter()
                .copied()
                .fold(0.0f32, |a, v| if v.abs() > a.abs() { v } else { a });
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
            let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
            out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
        }
        QuantType::Q4_1 => {
            let min = x.iter().copied().fold(f32::INFINITY, f32::min);
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
            out.extend_from_slice(&f16::from_f32(min).to_bits().to_le_bytes());
            let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
        }
        QuantType::Q5_0 | QuantType::Q5_1 => quantize_q5(ty, x, &mut out),
        QuantType::Iq4Nl => out = iquant::quantize_iq4nl(x),
        QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Iq4Xs => {
            unreachable!("a K-quant block is 256 weights")
        }
        QuantType::Q8_0 => {
            let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
            out.extend(
                x.iter()
                    .map(|v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
            );
        }
    }
    out
}

/// Q5_0 or Q5_1 of 32 weights, as ggml's reference quantizers.
fn quantize_q5(ty: QuantType, x: &[f32], out: &mut Vec<u8>) {
    let (d, min) = if ty == QuantType::Q5_0 {
        let max = x
            .iter()
            .copied()
            .fold(0.0f32, |a, v| if v.abs() > a.abs() { v } else { a });
        (max / -16.0, 0.0)
    } else {
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        ((max - min) / 31.0, min)
    };
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| -> u8 {
        let t = if ty == QuantType::Q5_0 {
            v * id + 16.5
        } else {
            (v - min) * id + 0.5
        };
        (t as i32).clamp(0, 31) as u8
    };
    out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
    if ty == QuantType::Q5_1 {
        out.extend_from_slice(&f16::from_f32(min).to_bits().to_le_bytes());
    }
    let qs: Vec<u8> = x.iter().map(|&v| q(v)).collect();
    let qh = qs
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (u32::from(v >> 4) << j));
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend((0..16).map(|j| (qs[j] & 0x0F) | ((qs[j + 16] & 0x0F) << 4)));
}

/// One activation block quantized to 8 bits: `x ~ d * q`, with `s = d * sum(q)`
/// kept for the formats whose offset is a float (Q4_1, as GGML's Q8_1;
/// Q4_K's mins), and the integer offsets of the formats whose weights are
/// stored as unsigned integers `u = q + k` (Q4_0: k = 8, Q8_0: k = 128,
/// Q6_K: k = 32 with a scale per 16 weights, so per half block):
/// `sum (u - k) x = sum u x - k sum(q)`, so their block sums are exact
/// integers and a block costs one multiply-add fewer.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(16))]
pub struct Q8Block {
    pub d: f32,
    pub s: f32,
    /// The sums of `qs[..16]` and of `qs[16..]` (Q6_K's halves).
    pub halves: [i16; 2],
    /// `-128 * sum(qs)`: Q8_0's offset (Q4_0's, `-8 * sum`, is this `>> 4`).
    pub off8: i32,
    pub qs: [i8; QK],
}

impl Q8Block {
    /// The block of `qs` with scale `d` (the sum and offsets from `sum`,
    /// the sum of `qs`).
    pub fn new(d: f32, sum: i32, qs: [i8; QK]) -> Self {
        let low: i32 = qs[..QK / 2].iter().map(|&q| i32::from(q)).sum();
        // Each half is at most 16 * 128 in magnitude.
        let half = |v: i32| v as i16;
        Self {
            d,
            s: d * sum as f32,
            halves: [half(low), half(sum - low)],
            off8: -128 * sum,
            qs,
        }
    }

    /// Q4_0's integer offset, `-8 * sum(qs)`.
    #[inline(always)]
    pub fn off4(&self) -> i32 {
        self.off8 >> 4
    }

    /// Q5_0's integer offset, `-16 * sum(qs)`.
    #[inline(always)]
    pub fn off5(&self) -> i32 {
        self.off8 >> 3
    }
}

impl QuantType {
    /// Activations sharing one Q8 scale against this format: 32, or 256
    /// for the K-quants, as ggml's Q8_K (so their sums are computed on
    /// the same activation values as llama.cpp's).
    pub const fn act_span(self) -> usize {
        self.block_weights()
    }
}

/// Quantizes activation rows to Q8 blocks, every `span` values (32 or
/// 256, dividing the row width) sharing one scale.
pub fn quantize_activations(x: &[f32], span: usize) -> Vec<Q8Block> {
    debug_assert!(span.is_multiple_of(QK) && x.len().is_multiple_of(span));
    x.chunks_exact(span)
        .flat_map(|s| {
            let floor = if span > QK { amax(s) } else { 0.0 };
            s.chunks_exact(QK)
                .map(move |b| quantize_block_q8_at(b, floor))
        })
        .collect()
}

/// The largest magnitude in `b` (eight partial maxima: a shape the
/// compiler turns into vector code).
pub fn amax(b: &[f32]) -> f32 {
    let mut m = [0.0f32; 8];
    for c in b.chunks_exact(8) {
        for (mi, v) in m.iter_mut().zip(c) {
            *mi = mi.max(v.abs());
        }
    }
    m.iter().fold(0.0f32, |a, &v| a.max(v))
}

/// One block of 32 activations to Q8 (round half away from zero, as GGML).
pub fn quantize_block_q8(b: &[f32]) -> Q8Block {
    quantize_block_q8_at(b, 0.0)
}

/// One block of 32 activations to Q8 with the scale of the larger of its
/// own largest magnitude and `floor` (its span's, for a shared scale).
pub fn quantize_block_q8_at(b: &[f32], floor: f32) -> Q8Block {
    let amax = amax(b).max(floor);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, v) in qs.iter_mut().zip(b) {
        // Round half away from zero without a libm call.
        let t = v * id;
        *q = (t + 0.5f32.copysign(t)) as i8;
    }
    let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
    Q8Block::new(d, sum, qs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    #[test]
    fn quantize_then_dequantize_stays_within_one_step() {
        let w = ramp(64);
        for (ty, step) in [
            (QuantType::Q4_0, 2.0 / 7.0),
            (QuantType::Q4_1, 2.0 / 15.0),
            (QuantType::Q8_0, 1.0 / 127.0),
            (QuantType::Q5_0, 2.0 / 15.0),
            (QuantType::Q5_1, 2.0 / 31.0),
        ] {
            let m = QMatrix::quantize(ty, 2, 32, &w).expect("quantize");
            let back: Vec<f32> = (0..2).flat_map(|r| m.dequantize_row(r)).collect();
            let err = w
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err <= step * 1.01, "{ty:?}: error {err} > {step}");
        }
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        assert!(matches!(
            QMatrix::new(QuantType::Q4_1, 2, 32, &[0; 39]),
            Err(KernelError::Shape { .. })
        ));
        assert_eq!(
            QMatrix::new(QuantType::Q8_0, 1, 33, &[]).err(),
            Some(KernelError::Unaligned {
                cols: 33,
                block: 32
            })
        );
    }

    #[test]
    fn stacking_keeps_rows_in_order_and_refuses_mismatches() {
        let a = QMatrix::quantize(QuantType::Q4_1, 2, 32, &ramp(64)).expect("a");
        let b = QMatrix::quantize(QuantType::Q4_1, 1, 32, &ramp(32)).expect("b");
        let ab = QMatrix::concat(&[&a, &b]).expect("stack");
        assert_eq!(ab.rows, 3);
        assert_eq!(ab.dequantize_row(2), b.dequantize_row(0));
        assert_eq!(ab.dequantize_row(1), a.dequantize_row(1));
        let c = QMatrix::quantize(QuantType::Q8_0, 1, 32, &ramp(32)).expect("c");
        assert!(QMatrix::concat(&[&a, &c]).is_err());
    }

    #[test]
    fn activation_blocks_keep_their_sum() {
        let x = ramp(64);
        let q = quantize_activations(&x, 32);
        for (b, chunk) in q.iter().zip(x.chunks(32)) {
            let sum: f32 = chunk.iter().sum();
            assert!((b.s - sum).abs() < 0.05, "{} vs {sum}", b.s);
            let qsum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
            assert_eq!((b.off4(), b.off8), (-8 * qsum, -128 * qsum));
            let low: i32 = b.qs[..16].iter().map(|&q| i32::from(q)).sum();
            assert_eq!(b.halves, [low as i16, (qsum - low) as i16]);
            assert_eq!(b.s, b.d * qsum as f32);
        }
    }
}
