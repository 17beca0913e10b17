//! GGML K-quant weights brought into the formats the kernels run, so that
//! they stay quantized in memory:
//!
//! - Q4_K (super-blocks of 256: f16 `d` and `dmin`, twelve bytes of packed
//!   6-bit sub-block scales and mins, 128 bytes of nibbles) is exactly eight
//!   Q4_1 blocks per super-block, `w = (d·sc)·q - (dmin·m)`: the nibbles are
//!   reordered and each sub-block's scale and min rounded to f16
//!   (relative error at most 2^-11 on the scales, far below the 4-bit step);
//! - every other K-quant (and Q5_0/Q5_1) goes through f32 into Q8_0, whose
//!   step is finer than theirs (the engine does that with candle's
//!   dequantizer and `QMatrix::quantize`).

use half::f16;

use crate::quant::KernelError;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K super-block.
pub const Q4K_BYTES: usize = 2 + 2 + 12 + QK_K / 2;

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

/// Transcodes Q4_K bytes (whole super-blocks) into Q4_1 blocks, in order.
pub fn q4k_to_q4_1(src: &[u8]) -> Result<Vec<u8>, KernelError> {
    if !src.len().is_multiple_of(Q4K_BYTES) {
        return Err(KernelError::Shape {
            what: "Q4_K bytes (whole super-blocks)",
            expected: src.len().div_ceil(Q4K_BYTES) * Q4K_BYTES,
            got: src.len(),
        });
    }
    let mut out = Vec::with_capacity(src.len() / Q4K_BYTES * 8 * 20);
    for sb in src.chunks_exact(Q4K_BYTES) {
        let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
        let dmin = f16::from_le_bytes([sb[2], sb[3]]).to_f32();
        let (scales, qs) = (&sb[4..16], &sb[16..]);
        for j in 0..8 {
            let (sc, m) = scale_min(scales, j);
            // Sub-block j: low (even j) or high (odd j) nibbles of 32 bytes.
            let bytes = &qs[32 * (j / 2)..32 * (j / 2) + 32];
            let nib = |l: usize| {
                if j % 2 == 0 {
                    bytes[l] & 0x0F
                } else {
                    bytes[l] >> 4
                }
            };
            out.extend_from_slice(&f16::from_f32(d * f32::from(sc)).to_le_bytes());
            out.extend_from_slice(&f16::from_f32(-dmin * f32::from(m)).to_le_bytes());
            out.extend((0..16).map(|l| nib(l) | (nib(l + 16) << 4)));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{QMatrix, QuantType};

    /// GGML's own Q4_K dequantization, written out directly.
    fn dequantize_q4k(sb: &[u8]) -> Vec<f32> {
        let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
        let dmin = f16::from_le_bytes([sb[2], sb[3]]).to_f32();
        let mut y = Vec::with_capacity(QK_K);
        let mut q = &sb[16..];
        let mut is = 0;
        for _ in 0..4 {
            let (sc1, m1) = scale_min(&sb[4..16], is);
            let (sc2, m2) = scale_min(&sb[4..16], is + 1);
            let (d1, mm1) = (d * f32::from(sc1), dmin * f32::from(m1));
            let (d2, mm2) = (d * f32::from(sc2), dmin * f32::from(m2));
            y.extend(q[..32].iter().map(|&b| d1 * f32::from(b & 0x0F) - mm1));
            y.extend(q[..32].iter().map(|&b| d2 * f32::from(b >> 4) - mm2));
            q = &q[32..];
            is += 2;
        }
        y
    }

    #[test]
    fn q4k_becomes_q4_1_with_the_same_values() {
        // Two super-blocks of pseudo-random bytes, with sane f16 scales.
        let mut src: Vec<u8> = (0..2 * Q4K_BYTES).map(|i| (i * 131 % 251) as u8).collect();
        for (k, sb) in src.chunks_exact_mut(Q4K_BYTES).enumerate() {
            sb[0..2].copy_from_slice(&f16::from_f32(0.01 * (k + 1) as f32).to_le_bytes());
            sb[2..4].copy_from_slice(&f16::from_f32(0.004).to_le_bytes());
        }
        let q41 = q4k_to_q4_1(&src).expect("transcode");
        let m = QMatrix::new(QuantType::Q4_1, 2, QK_K, &q41).expect("matrix");
        for (r, sb) in src.chunks_exact(Q4K_BYTES).enumerate() {
            let want = dequantize_q4k(sb);
            let got = m.dequantize_row(r);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 2e-3 * w.abs().max(0.05),
                    "row {r}: {g} vs {w}"
                );
            }
        }
        assert!(q4k_to_q4_1(&src[..100]).is_err());
    }
}
