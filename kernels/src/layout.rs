//! The interleaved weight layout the matmul kernels read (after llama.cpp's
//! repacked `q4_0_8x8`, widened to 16 rows for 512-bit vectors).
//!
//! Weight rows are taken in groups of `GROUP` (16). For each group and each
//! 32-weight block there is one *group block*: the 16 rows' f16 scales `d`,
//! for Q4_1 their 16 f16 mins, then the quants, arranged so that one
//! 64-byte load holds four consecutive weights of every row, row `r` in
//! bytes `4r..4r + 4`. An integer dot product against four activation bytes
//! broadcast to every lane then yields one sum per row, with no horizontal
//! reduction, and one vector FMA scales 16 rows at once.
//!
//! - Q4_0 / Q4_1: four 64-byte loads; load `l` holds GGML quant bytes
//!   `4l..4l + 4` of each row, whose low nibbles are weights `4l..4l + 4`
//!   (chunk `l`) and high nibbles weights `16 + 4l..` (chunk `l + 4`).
//! - Q8_0: eight 64-byte loads, load `c` holding weights `4c..4c + 4`, each
//!   stored as the unsigned byte `q + 128` (so `vpdpbusd` can take it); the
//!   kernels subtract `128 * d * sum(x)` through the block offset.
//! - IQ4_NL: as Q4_0 (its 4-bit indices where Q4_0 has nibbles); the
//!   kernels map them through `iquant::KVALUES`.
//! - Q5_0 / Q5_1: one 64-byte load of high bits, then the nibbles as
//!   Q4's. In the high load, bit `c` of byte `k` of a row holds the high
//!   bit of weight `4c + k`, so one shift and one mask put chunk `c`'s at
//!   bit 4 of every byte.
//!
//! The total size equals the GGML size (rows rounded up to a multiple of
//! 16); padding rows have zero scales and zero weights. K-quants keep
//! their 256-weight super-blocks in the same manner (`crate::klayout`).

use crate::klayout;
use crate::quant::{QK, QuantType};

/// Weight rows per interleaved group.
pub const GROUP: usize = 16;

/// Bytes of one group block (16 rows x 32 weights, with scales) of a
/// 32-weight format.
pub const fn group_block_bytes(ty: QuantType) -> usize {
    quants_offset(ty) + GROUP * QK * quant_bits(ty) / 8
}

/// Where the quants start inside a group block of a 32-weight format.
pub const fn quants_offset(ty: QuantType) -> usize {
    match ty {
        QuantType::Q4_1 => 4 * GROUP,
        QuantType::Q4_0 | QuantType::Q8_0 | QuantType::Iq4Nl => 2 * GROUP,
        QuantType::Q5_0 => 2 * GROUP + 64,
        QuantType::Q5_1 => 4 * GROUP + 64,
        QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Iq4Xs => {
            panic!("K-quants: see klayout")
        }
    }
}

/// Where Q5_0's and Q5_1's load of high bits starts in a group block.
pub const fn high_offset(ty: QuantType) -> usize {
    quants_offset(ty) - 64
}

const fn quant_bits(ty: QuantType) -> usize {
    match ty {
        QuantType::Q4_0
        | QuantType::Q4_1
        | QuantType::Q5_0
        | QuantType::Q5_1
        | QuantType::Iq4Nl => 4,
        QuantType::Q8_0 => 8,
        QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Iq4Xs => {
            panic!("K-quants: see klayout")
        }
    }
}

/// Bytes of GGML quants (after the block header) of one row's block.
const fn ggml_header(ty: QuantType) -> usize {
    match ty {
        QuantType::Q4_1 => 4,
        QuantType::Q4_0 | QuantType::Q8_0 | QuantType::Iq4Nl => 2,
        QuantType::Q5_0 => 6,
        QuantType::Q5_1 => 8,
        QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Iq4Xs => {
            panic!("K-quants: see klayout")
        }
    }
}

/// Bytes of one group (16 rows) of a matrix `cols` wide.
pub const fn group_bytes(ty: QuantType, cols: usize) -> usize {
    if ty.is_k() {
        cols / crate::kquant::QK_K * klayout::super_bytes(ty)
    } else {
        cols / QK * group_block_bytes(ty)
    }
}

/// The GGML bytes of lane `lane` of a group (one row).
pub fn read_row(ty: QuantType, group: &[u8], lane: usize) -> Vec<u8> {
    if ty.is_k() {
        return klayout::read_row(ty, group, lane);
    }
    group
        .chunks_exact(group_block_bytes(ty))
        .flat_map(|gb| read_lane(ty, gb, lane))
        .collect()
}

/// Repacks `rows x cols` GGML blocks (row-major; lengths checked by the
/// caller) into the interleaved layout.
pub fn pack(ty: QuantType, rows: usize, cols: usize, ggml: &[u8]) -> Vec<u8> {
    if ty.is_k() {
        return klayout::pack(ty, rows, cols, ggml);
    }
    let nb = cols / QK;
    let bb = ty.block_bytes();
    let gbb = group_block_bytes(ty);
    let mut out = vec![0u8; rows.div_ceil(GROUP) * nb * gbb];
    if ty == QuantType::Q8_0 {
        // Padding rows hold the byte for zero, like every real weight does.
        for gb in out.chunks_exact_mut(gbb) {
            gb[quants_offset(ty)..].fill(0x80);
        }
    }
    for r in 0..rows {
        let (g, lane) = (r / GROUP, r % GROUP);
        for b in 0..nb {
            let blk = &ggml[(r * nb + b) * bb..][..bb];
            let gb = &mut out[(g * nb + b) * gbb..][..gbb];
            write_lane(ty, gb, lane, blk);
        }
    }
    out
}

/// Whether a format has an f16 min after its scale.
const fn has_min(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_1 | QuantType::Q5_1)
}

/// Whether a format has a 32-bit word of high bits (Q5_0, Q5_1).
const fn has_high(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q5_0 | QuantType::Q5_1)
}

/// Byte of lane `lane` in the high load, and the bit in it, of weight `j`.
pub(crate) fn high_at(lane: usize, j: usize) -> (usize, usize) {
    (4 * lane + j % 4, j / 4)
}

/// Copies one GGML block into lane `lane` of a group block.
fn write_lane(ty: QuantType, gb: &mut [u8], lane: usize, blk: &[u8]) {
    gb[2 * lane..2 * lane + 2].copy_from_slice(&blk[0..2]);
    if has_min(ty) {
        gb[2 * GROUP + 2 * lane..][..2].copy_from_slice(&blk[2..4]);
    }
    if has_high(ty) {
        let at = ggml_header(ty) - 4;
        let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
        let high = &mut gb[high_offset(ty)..][..64];
        for j in 0..QK {
            let (byte, bit) = high_at(lane, j);
            high[byte] = (high[byte] & !(1 << bit)) | ((((qh >> j) & 1) as u8) << bit);
        }
    }
    let qs = &blk[ggml_header(ty)..];
    let q = quants_offset(ty);
    for (c, chunk) in qs.chunks_exact(4).enumerate() {
        let dst = &mut gb[q + 64 * c + 4 * lane..][..4];
        for (d, &s) in dst.iter_mut().zip(chunk) {
            *d = if ty == QuantType::Q8_0 { s ^ 0x80 } else { s };
        }
    }
}

/// The GGML bytes of lane `lane` of a group block (the inverse of packing).
pub fn read_lane(ty: QuantType, gb: &[u8], lane: usize) -> Vec<u8> {
    let mut blk = Vec::with_capacity(ty.block_bytes());
    blk.extend_from_slice(&gb[2 * lane..2 * lane + 2]);
    if has_min(ty) {
        blk.extend_from_slice(&gb[2 * GROUP + 2 * lane..][..2]);
    }
    if has_high(ty) {
        let high = &gb[high_offset(ty)..][..64];
        let qh = (0..QK).fold(0u32, |h, j| {
            let (byte, bit) = high_at(lane, j);
            h | (u32::from((high[byte] >> bit) & 1) << j)
        });
        blk.extend_from_slice(&qh.to_le_bytes());
    }
    let q = quants_offset(ty);
    let chunks = (ty.block_bytes() - ggml_header(ty)) / 4;
    for c in 0..chunks {
        let src = &gb[q + 64 * c + 4 * lane..][..4];
        blk.extend(
            src.iter()
                .map(|&s| if ty == QuantType::Q8_0 { s ^ 0x80 } else { s }),
        );
    }
    blk
}

/// Weight `j` (0..32) of lane `lane` as the unsigned value the integer
/// kernels multiply: a nibble (Q4), five bits (Q5) or `q + 128` (Q8_0,
/// and IQ4_NL's table value `+ 128`).
pub fn unsigned_weight(ty: QuantType, gb: &[u8], lane: usize, j: usize) -> u8 {
    let q = quants_offset(ty);
    match ty {
        QuantType::Q8_0 => gb[q + 64 * (j / 4) + 4 * lane + j % 4],
        QuantType::Iq4Nl => {
            let i = unsigned_weight(QuantType::Q4_0, gb, lane, j);
            crate::iquant::KVALUES[usize::from(i)] as u8 ^ 0x80
        }
        QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Iq4Xs => {
            unreachable!("K-quants: klayout::unsigned_weight")
        }
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 => {
            let chunk = j / 4;
            let byte = gb[q + 64 * (chunk % 4) + 4 * lane + j % 4];
            let low = if chunk < 4 { byte & 0x0F } else { byte >> 4 };
            if !has_high(ty) {
                return low;
            }
            let (at, bit) = high_at(lane, j);
            low | (((gb[high_offset(ty) + at] >> bit) & 1) << 4)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_every_row_and_pads_the_last_group() {
        for ty in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q5_0,
            QuantType::Q5_1,
            QuantType::Iq4Nl,
        ] {
            let (rows, cols) = (19, 64);
            let bb = ty.block_bytes();
            let ggml: Vec<u8> = (0..rows * cols / QK * bb)
                .map(|i| (i * 37 % 251) as u8)
                .collect();
            let packed = pack(ty, rows, cols, &ggml);
            assert_eq!(packed.len(), 2 * 2 * group_block_bytes(ty));
            let gbb = group_block_bytes(ty);
            for r in 0..rows {
                for b in 0..2 {
                    let gb = &packed[((r / GROUP) * 2 + b) * gbb..][..gbb];
                    let back = read_lane(ty, gb, r % GROUP);
                    assert_eq!(back, &ggml[(r * 2 + b) * bb..][..bb], "{ty:?} row {r}");
                }
            }
        }
    }

    #[test]
    fn unsigned_weights_follow_ggml_nibble_order() {
        let ty = QuantType::Q4_0;
        let mut blk = vec![0u8; 18];
        for j in 0..16 {
            blk[2 + j] = (j as u8) | (((15 - j) as u8) << 4);
        }
        let packed = pack(ty, 1, 32, &blk);
        for j in 0..16 {
            assert_eq!(usize::from(unsigned_weight(ty, &packed, 0, j)), j);
            assert_eq!(usize::from(unsigned_weight(ty, &packed, 0, j + 16)), 15 - j);
        }
    }
}
