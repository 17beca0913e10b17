//! The interleaved layout of K-quant weights the kernels read: GGML's
//! super-blocks kept at their own size (no transcoding), laid out for 16
//! rows at a time like the 32-weight formats (`crate::layout`).
//!
//! For each group of 16 rows and each 256-weight super-block there is one
//! *group super-block*: the rows' f16 scales, then eight sub-blocks of 32
//! weights, each holding the rows' sub-block scales as bytes (unpacked
//! from GGML's 6-bit fields) and the quants in 64-byte loads, row `r` in
//! bytes `4r..4r + 4` of each load, so that a 4-byte activation chunk
//! broadcast to every lane meets four weights of every row.
//!
//! - Q4_K (2,368 bytes, 4.625 bits a weight against GGML's 4.5): `d`
//!   x16, `dmin` x16, then per sub-block 16 scales, 16 mins and four
//!   nibble loads (as Q4_1's: load `l` holds weights `4l..4l + 4` in its
//!   low nibbles and `16 + 4l..` in its high ones).
//! - Q5_K (2,880 bytes, 5.625 bits against 5.5): as Q4_K, with a load of
//!   fifth bits before each sub-block's nibbles, arranged as Q5_0's
//!   (`crate::layout`: bit `c` of byte `k` of a row is weight `4c + k`'s).
//! - Q6_K (3,360 bytes, 6.5625 bits, GGML's size): `d` x16, then per
//!   sub-block 16 scales of its first 16 weights, 16 of its last 16, four
//!   loads of low nibbles (as Q4_1's) and two loads of the high 2 bits:
//!   in load `p`, bits `2s..2s + 2` of byte `k` of a row hold the high
//!   bits of weight `4(4p + s) + k`, so one shift and one mask put chunk
//!   `4p + s`'s at bits 4-5 of every byte.

use crate::iquant::Iq4xsBlock;
use crate::kquant::{Q4kBlock, Q6kBlock, QK_K};
use crate::layout::{GROUP, high_at};
use crate::quant::QuantType;

/// Bytes of one group super-block (16 rows x 256 weights). Every function
/// here takes a super-block format (Q4_K, Q5_K, Q6_K, IQ4_XS).
pub const fn super_bytes(ty: QuantType) -> usize {
    let scales = if has_min(ty) { 4 } else { 2 };
    scales * GROUP + 8 * sub_bytes(ty)
}

/// Bytes of one group sub-block (16 rows x 32 weights).
pub const fn sub_bytes(ty: QuantType) -> usize {
    if matches!(ty, QuantType::Q6K) {
        Q6_HIGH + 128
    } else {
        sub_quants(ty) + 256
    }
}

/// Where sub-block `j` starts in a group super-block.
pub const fn sub_offset(ty: QuantType, j: usize) -> usize {
    super_bytes(ty) - (8 - j) * sub_bytes(ty)
}

/// Whether the format has mins (Q4_K, Q5_K; not Q6_K).
pub const fn has_min(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4K | QuantType::Q5K)
}

/// Where a sub-block's two scale arrays end (Q5_K's high load starts).
pub const SUB_SCALES: usize = 2 * GROUP;

/// Where the nibble loads start in a sub-block (IQ4_XS: after its one
/// array of scales).
pub const fn sub_quants(ty: QuantType) -> usize {
    if matches!(ty, QuantType::Q5K) {
        SUB_SCALES + 64
    } else if matches!(ty, QuantType::Iq4Xs) {
        GROUP
    } else {
        SUB_SCALES
    }
}

/// Where Q6_K's two loads of high bits start in a sub-block.
pub const Q6_HIGH: usize = SUB_SCALES + 256;

/// Puts 32 4-bit values (one row's sub-block, weight order) into lane
/// `lane` of the four nibble loads at `dst`.
pub fn put_nibbles(dst: &mut [u8], lane: usize, v: &[u8]) {
    for l in 0..4 {
        for k in 0..4 {
            let j = 4 * l + k;
            dst[64 * l + 4 * lane + k] = (v[j] & 0x0F) | ((v[j + 16] & 0x0F) << 4);
        }
    }
}

/// The 32 values `put_nibbles` put into lane `lane`.
pub fn get_nibbles(src: &[u8], lane: usize) -> [u8; 32] {
    let mut v = [0u8; 32];
    for l in 0..4 {
        for k in 0..4 {
            let b = src[64 * l + 4 * lane + k];
            v[4 * l + k] = b & 0x0F;
            v[16 + 4 * l + k] = b >> 4;
        }
    }
    v
}

/// Packs `rows x cols` GGML super-blocks (row-major; lengths checked by
/// the caller) into the group layout.
pub fn pack(ty: QuantType, rows: usize, cols: usize, ggml: &[u8]) -> Vec<u8> {
    let ns = cols / QK_K;
    let (bb, sbb) = (ty.block_bytes(), super_bytes(ty));
    let mut out = vec![0u8; rows.div_ceil(GROUP) * ns * sbb];
    if ty == QuantType::Q6K {
        // Padding rows hold the quant for zero (their scales are zero too).
        for gsb in out.chunks_exact_mut(sbb) {
            let pad = Q6kBlock {
                d: 0,
                sc: [0; 16],
                q: [32; QK_K],
            };
            (0..GROUP).for_each(|lane| write_q6k(gsb, lane, &pad));
        }
    }
    for r in 0..rows {
        let (g, lane) = (r / GROUP, r % GROUP);
        for s in 0..ns {
            let blk = &ggml[(r * ns + s) * bb..][..bb];
            let gsb = &mut out[(g * ns + s) * sbb..][..sbb];
            if ty == QuantType::Q6K {
                write_q6k(gsb, lane, &Q6kBlock::from_ggml(blk));
            } else if ty == QuantType::Iq4Xs {
                write_iq4xs(gsb, lane, &Iq4xsBlock::from_ggml(blk));
            } else if ty == QuantType::Q5K {
                write_scaled(ty, gsb, lane, &Q4kBlock::from_ggml_q5k(blk));
            } else {
                write_scaled(ty, gsb, lane, &Q4kBlock::from_ggml(blk));
            }
        }
    }
    out
}

/// The GGML bytes of lane `lane` of a group's super-blocks (the inverse
/// of packing).
pub fn read_row(ty: QuantType, group: &[u8], lane: usize) -> Vec<u8> {
    group
        .chunks_exact(super_bytes(ty))
        .flat_map(|gsb| {
            if ty == QuantType::Q6K {
                read_q6k(gsb, lane).to_ggml()
            } else if ty == QuantType::Iq4Xs {
                read_iq4xs(gsb, lane).to_ggml()
            } else if ty == QuantType::Q5K {
                read_scaled(ty, gsb, lane).to_ggml_q5k()
            } else {
                read_scaled(ty, gsb, lane).to_ggml()
            }
        })
        .collect()
}

/// Q4_K's or Q5_K's fields into lane `lane` of a group super-block.
fn write_scaled(ty: QuantType, gsb: &mut [u8], lane: usize, k: &Q4kBlock) {
    gsb[2 * lane..][..2].copy_from_slice(&k.d.to_le_bytes());
    gsb[2 * GROUP + 2 * lane..][..2].copy_from_slice(&k.dmin.to_le_bytes());
    for j in 0..8 {
        let sub = &mut gsb[sub_offset(ty, j)..][..sub_bytes(ty)];
        sub[lane] = k.sc[j];
        sub[GROUP + lane] = k.m[j];
        let q = &k.q[32 * j..][..32];
        put_nibbles(&mut sub[sub_quants(ty)..], lane, q);
        if ty == QuantType::Q5K {
            for (w, &v) in q.iter().enumerate() {
                let (at, bit) = high_at(lane, w);
                let b = &mut sub[SUB_SCALES + at];
                *b = (*b & !(1 << bit)) | (((v >> 4) & 1) << bit);
            }
        }
    }
}

fn read_scaled(ty: QuantType, gsb: &[u8], lane: usize) -> Q4kBlock {
    let bits = |at: usize| u16::from_le_bytes([gsb[at], gsb[at + 1]]);
    let mut k = Q4kBlock {
        d: bits(2 * lane),
        dmin: bits(2 * GROUP + 2 * lane),
        sc: [0; 8],
        m: [0; 8],
        q: [0; QK_K],
    };
    for j in 0..8 {
        (k.sc[j], k.m[j]) = {
            let sub = &gsb[sub_offset(ty, j)..];
            (sub[lane], sub[GROUP + lane])
        };
        for (w, q) in k.q[32 * j..][..32].iter_mut().enumerate() {
            *q = unsigned_weight(ty, gsb, lane, j, w);
        }
    }
    k
}

fn write_iq4xs(gsb: &mut [u8], lane: usize, k: &Iq4xsBlock) {
    gsb[2 * lane..][..2].copy_from_slice(&k.d.to_le_bytes());
    for j in 0..8 {
        let sub = &mut gsb[sub_offset(QuantType::Iq4Xs, j)..][..sub_bytes(QuantType::Iq4Xs)];
        sub[lane] = k.ls[j] as u8;
        put_nibbles(&mut sub[GROUP..], lane, &k.q[32 * j..][..32]);
    }
}

fn read_iq4xs(gsb: &[u8], lane: usize) -> Iq4xsBlock {
    let mut k = Iq4xsBlock {
        d: u16::from_le_bytes([gsb[2 * lane], gsb[2 * lane + 1]]),
        ls: [0; 8],
        q: [0; QK_K],
    };
    for j in 0..8 {
        let sub = &gsb[sub_offset(QuantType::Iq4Xs, j)..][..sub_bytes(QuantType::Iq4Xs)];
        k.ls[j] = sub[lane] as i8;
        k.q[32 * j..][..32].copy_from_slice(&get_nibbles(&sub[GROUP..], lane));
    }
    k
}

/// Byte `k` of lane `lane` in load `p` of the high bits, and the shift of
/// weight `w`'s two bits in it (see the module header).
fn q6_high_at(lane: usize, w: usize) -> (usize, usize) {
    let (c, k) = (w / 4, w % 4);
    (64 * (c / 4) + 4 * lane + k, 2 * (c % 4))
}

fn write_q6k(gsb: &mut [u8], lane: usize, k: &Q6kBlock) {
    gsb[2 * lane..][..2].copy_from_slice(&k.d.to_le_bytes());
    for j in 0..8 {
        let sub = &mut gsb[sub_offset(QuantType::Q6K, j)..][..sub_bytes(QuantType::Q6K)];
        sub[lane] = k.sc[2 * j] as u8;
        sub[GROUP + lane] = k.sc[2 * j + 1] as u8;
        let q = &k.q[32 * j..][..32];
        put_nibbles(&mut sub[SUB_SCALES..], lane, q);
        let high = &mut sub[Q6_HIGH..];
        for (w, &v) in q.iter().enumerate() {
            let (at, shift) = q6_high_at(lane, w);
            high[at] = (high[at] & !(3 << shift)) | ((v >> 4) << shift);
        }
    }
}

fn read_q6k(gsb: &[u8], lane: usize) -> Q6kBlock {
    let mut k = Q6kBlock {
        d: u16::from_le_bytes([gsb[2 * lane], gsb[2 * lane + 1]]),
        sc: [0; 16],
        q: [0; QK_K],
    };
    for j in 0..8 {
        let sub = &gsb[sub_offset(QuantType::Q6K, j)..][..sub_bytes(QuantType::Q6K)];
        k.sc[2 * j] = sub[lane] as i8;
        k.sc[2 * j + 1] = sub[GROUP + lane] as i8;
        let low = get_nibbles(&sub[SUB_SCALES..], lane);
        for (w, q) in k.q[32 * j..][..32].iter_mut().enumerate() {
            let (at, shift) = q6_high_at(lane, w);
            *q = low[w] | (((sub[Q6_HIGH + at] >> shift) & 3) << 4);
        }
    }
    k
}

/// Weight `w` (0..32) of sub-block `j`, lane `lane`, as the unsigned value
/// the integer kernels multiply (Q4_K: 0..16, Q5_K: 0..32, Q6_K: 0..64;
/// IQ4_XS: the index into `iquant::KVALUES`).
pub fn unsigned_weight(ty: QuantType, gsb: &[u8], lane: usize, j: usize, w: usize) -> u8 {
    let sub = &gsb[sub_offset(ty, j)..][..sub_bytes(ty)];
    let b = sub[sub_quants(ty) + 64 * ((w % 16) / 4) + 4 * lane + w % 4];
    let low = if w < 16 { b & 0x0F } else { b >> 4 };
    if ty == QuantType::Q5K {
        let (at, bit) = high_at(lane, w);
        low | (((sub[SUB_SCALES + at] >> bit) & 1) << 4)
    } else if ty == QuantType::Q6K {
        let (at, shift) = q6_high_at(lane, w);
        low | (((sub[Q6_HIGH + at] >> shift) & 3) << 4)
    } else {
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_every_row_and_pads_the_last_group() {
        for ty in [
            QuantType::Q4K,
            QuantType::Q5K,
            QuantType::Q6K,
            QuantType::Iq4Xs,
        ] {
            let (rows, cols) = (19, 512);
            let bb = ty.block_bytes();
            let ggml: Vec<u8> = (0..rows * 2 * bb).map(|i| (i * 37 % 251) as u8).collect();
            let packed = pack(ty, rows, cols, &ggml);
            assert_eq!(packed.len(), 2 * 2 * super_bytes(ty));
            for r in 0..rows {
                let group = &packed[(r / GROUP) * 2 * super_bytes(ty)..][..2 * super_bytes(ty)];
                let back = read_row(ty, group, r % GROUP);
                assert_eq!(back, &ggml[r * 2 * bb..][..2 * bb], "{ty:?} row {r}");
            }
        }
    }

    #[test]
    fn unsigned_weights_are_the_quants_in_weight_order() {
        for seed in 0..4usize {
            let ggml: Vec<u8> = (0..crate::kquant::Q6K_BYTES)
                .map(|i| ((i + seed) * 97 % 253) as u8)
                .collect();
            let packed = pack(QuantType::Q6K, 1, QK_K, &ggml);
            let want = Q6kBlock::from_ggml(&ggml);
            for i in 0..QK_K {
                let got = unsigned_weight(QuantType::Q6K, &packed, 0, i / 32, i % 32);
                assert_eq!(got, want.q[i], "weight {i}");
            }
        }
    }

    #[test]
    fn sizes_are_as_stated() {
        assert_eq!(super_bytes(QuantType::Q4K), 2368);
        assert_eq!(super_bytes(QuantType::Q5K), 2880);
        assert_eq!(super_bytes(QuantType::Q6K), 3360);
        assert_eq!(super_bytes(QuantType::Iq4Xs), 2208);
        // Q6_K keeps GGML's size: 210 bytes per row and super-block.
        assert_eq!(
            super_bytes(QuantType::Q6K),
            GROUP * crate::kquant::Q6K_BYTES
        );
    }
}
