//! What the GPU backends (`wgpu`, `cuda`) share on the host side: the
//! quantized weight layout their matmul kernels read (each 32-weight GGML
//! block repacked into whole 32-bit words: the scale, and Q4_1's min, as
//! f32, then the block's bytes) and the kernels' fixed sizes. Every other
//! format is expanded into such blocks exactly (`repack`), so the GPU
//! computes with the file's values as the CPU does.

use crate::cpu::kv::KvLayout;
use crate::quant::{KernelError, QMatrix, QuantType};

/// Threads of one workgroup / thread block in the reduction kernels.
pub const WG: usize = 64;
/// Rows of x one matmul workgroup computes (the kernels' `TM`).
pub const TILE_M: usize = 4;
/// Words of one quantized activation block (the kernels' `XQ_WORDS`: the
/// scale, the scale times the sum of the codes, then 32 codes).
pub const XQ_WORDS: usize = 10;
/// The widest head the attention kernels take (64 threads, 4 values each).
pub const MAX_HEAD_DIM: usize = 256;

/// The kernels' code for a matrix's format (their `kind`).
pub const KIND_Q4_0: u32 = 0;
pub const KIND_Q4_1: u32 = 1;
pub const KIND_Q8_0: u32 = 2;
pub const KIND_F32: u32 = 3;
/// Q8_0's bytes with an f32 min after the scale: `w = d * q + m`.
pub const KIND_Q8_MIN: u32 = 4;
/// Q8_0's bytes with two scales, one per 16 weights.
pub const KIND_Q8_HALVES: u32 = 5;

/// A quantized matrix as the kernels read it: the words, the format's
/// `kind` and the words per 32-weight block. Blocks are stored block
/// column by block column (block `b` of row `r` is block `b * rows + r`):
/// the matmul kernels give each output row its own thread, and
/// neighbouring threads then read neighbouring blocks.
///
/// Each format is expanded into the kernels' block kinds exactly, each
/// weight the value ggml's dequantization gives: Q4_K's sub-blocks as
/// Q4_1 blocks (scale `d * sc`, min `-dmin * m`); Q5_0, IQ4_NL and IQ4_XS
/// as Q8_0 blocks (the integers `q - 16` or the table's values, scale `d`,
/// or IQ4_XS's `d * (ls - 32)`); Q5_1 and Q5_K's sub-blocks as Q8_0 bytes
/// with a min (`KIND_Q8_MIN`); Q6_K's as Q8_0 bytes (`q - 32`) with a
/// scale per 16 weights (`KIND_Q8_HALVES`, scales `d * sc`).
pub fn repack(q: &QMatrix) -> Result<(Vec<u32>, u32, u32), KernelError> {
    let (kind, wpb) = match q.ty {
        QuantType::Q4_0 => (KIND_Q4_0, 5),
        QuantType::Q4_1 | QuantType::Q4K => (KIND_Q4_1, 6),
        QuantType::Q8_0 | QuantType::Q5_0 | QuantType::Iq4Nl | QuantType::Iq4Xs => (KIND_Q8_0, 9),
        QuantType::Q5_1 | QuantType::Q5K => (KIND_Q8_MIN, 10),
        QuantType::Q6K => (KIND_Q8_HALVES, 10),
    };
    let (nb, w) = (q.blocks_per_row(), wpb as usize);
    let mut words = vec![0u32; q.rows * nb * w];
    for r in 0..q.rows {
        for (b, blk) in gpu_blocks(q.ty, &q.ggml_row(r)).into_iter().enumerate() {
            let out = &mut words[(b * q.rows + r) * w..][..w];
            out[0] = blk.d.to_bits();
            let at = if matches!(kind, KIND_Q4_0 | KIND_Q8_0) {
                1
            } else {
                out[1] = blk.m.to_bits();
                2
            };
            for (o, c) in out[at..].iter_mut().zip(blk.bytes.chunks_exact(4)) {
                *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
    Ok((words, kind, wpb))
}

/// One 32-weight block as the kernels read it: scale, second word (Q4_1's
/// and `KIND_Q8_MIN`'s min, `KIND_Q8_HALVES`'s second scale) and the quant
/// bytes in GGML's order for the kind (nibbles: byte `j` holds weights `j`
/// and `j + 16`; the Q8 kinds: one signed byte a weight).
struct GpuBlock {
    d: f32,
    m: f32,
    bytes: Vec<u8>,
}

/// The blocks of one row's GGML bytes in format `ty` (one the kernels read
/// exactly: see `repack`).
fn gpu_blocks(ty: QuantType, row: &[u8]) -> Vec<GpuBlock> {
    use crate::iquant::{Iq4xsBlock, KVALUES};
    use crate::kquant::{Q4kBlock, Q6kBlock};
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    let table = |i: u8| KVALUES[usize::from(i)] as u8;
    let nibbles = |q: &[u8]| (0..16).map(|l| q[l] | (q[l + 16] << 4)).collect();
    let chunks = row.chunks_exact(ty.block_bytes());
    match ty {
        // Q4_K's nibbles go into Q4_1 blocks, Q5_K's 5-bit values into
        // Q8 bytes with a min.
        QuantType::Q4K | QuantType::Q5K => chunks
            .flat_map(|b| {
                let q5 = ty == QuantType::Q5K;
                let k = if q5 {
                    Q4kBlock::from_ggml_q5k(b)
                } else {
                    Q4kBlock::from_ggml(b)
                };
                let (d, dmin) = (f16(&k.d.to_le_bytes()), f16(&k.dmin.to_le_bytes()));
                (0..8)
                    .map(|j| {
                        let q = &k.q[32 * j..][..32];
                        GpuBlock {
                            d: d * f32::from(k.sc[j]),
                            m: -(dmin * f32::from(k.m[j])),
                            bytes: if q5 { q.to_vec() } else { nibbles(q) },
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
        QuantType::Iq4Xs => chunks
            .flat_map(|b| {
                let k = Iq4xsBlock::from_ggml(b);
                let d = f16(&k.d.to_le_bytes());
                (0..8)
                    .map(|j| GpuBlock {
                        d: d * f32::from(k.ls[j]),
                        m: 0.0,
                        bytes: k.q[32 * j..][..32].iter().map(|&i| table(i)).collect(),
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
        QuantType::Iq4Nl => chunks
            .map(|b| GpuBlock {
                d: f16(b),
                m: 0.0,
                bytes: (0..32)
                    .map(|j| {
                        table(if j < 16 {
                            b[2 + j] & 0x0F
                        } else {
                            b[2 + j - 16] >> 4
                        })
                    })
                    .collect(),
            })
            .collect(),
        QuantType::Q5_0 => chunks
            .map(|b| {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let q = |j: usize| {
                    let low = if j < 16 {
                        b[6 + j] & 0x0F
                    } else {
                        b[6 + j - 16] >> 4
                    };
                    (low | ((((qh >> j) & 1) as u8) << 4)) as i8 - 16
                };
                GpuBlock {
                    d: f16(b),
                    m: 0.0,
                    bytes: (0..32).map(|j| q(j) as u8).collect(),
                }
            })
            .collect(),
        QuantType::Q6K => chunks
            .flat_map(|b| {
                let k = Q6kBlock::from_ggml(b);
                let d = f16(&k.d.to_le_bytes());
                (0..8)
                    .map(|j| GpuBlock {
                        d: d * f32::from(k.sc[2 * j]),
                        m: d * f32::from(k.sc[2 * j + 1]),
                        bytes: k.q[32 * j..][..32]
                            .iter()
                            .map(|&q| q.wrapping_sub(32))
                            .collect(),
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
        QuantType::Q5_1 => chunks
            .map(|b| {
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                let q = |j: usize| {
                    let low = if j < 16 {
                        b[8 + j] & 0x0F
                    } else {
                        b[8 + j - 16] >> 4
                    };
                    low | ((((qh >> j) & 1) as u8) << 4)
                };
                GpuBlock {
                    d: f16(b),
                    m: f16(&b[2..4]),
                    bytes: (0..32).map(q).collect(),
                }
            })
            .collect(),
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0 => chunks
            .map(|b| {
                let min = ty == QuantType::Q4_1;
                GpuBlock {
                    d: f16(b),
                    m: if min { f16(&b[2..4]) } else { 0.0 },
                    bytes: b[if min { 4 } else { 2 }..].to_vec(),
                }
            })
            .collect(),
    }
}

/// Per query row of a paged attention call: its position and where its
/// block table starts in the joined tables, and the joined tables, each
/// block id less `base` (the layer's first id, `KvLayout::layer_ids`: the
/// kernels index the layer's own buffer). Ids behind a sliding window are
/// never read, whatever they become.
pub fn paged_queries(queries: &[(usize, &[u32])], base: u32) -> (Vec<u32>, Vec<u32>) {
    let mut info = Vec::with_capacity(2 * queries.len());
    let mut tables = Vec::new();
    for &(pos, table) in queries {
        info.extend([pos as u32, tables.len() as u32]);
        tables.extend(table.iter().map(|b| b.wrapping_sub(base)));
    }
    (info, tables)
}

/// Per row of a bidirectional attention call: its sequence's first row
/// and length.
pub fn sequence_rows(seqs: &[usize]) -> Vec<u32> {
    let mut info = Vec::with_capacity(2 * seqs.iter().sum::<usize>());
    let mut start = 0u32;
    for &len in seqs {
        for _ in 0..len {
            info.extend([start, len as u32]);
        }
        start += len as u32;
    }
    info
}

/// Each row's rotary `cos` values, then each row's `sin` values (one per
/// pair of the `rot_dim` rotated dimensions), as the rope kernels read them.
pub fn rope_rows(positions: &[usize], cos: &[f32], sin: &[f32], rot_dim: usize) -> Vec<f32> {
    let half = rot_dim / 2;
    let mut cs = Vec::with_capacity(2 * positions.len() * half);
    for table in [cos, sin] {
        for &pos in positions {
            cs.extend_from_slice(&table[pos * half..(pos + 1) * half]);
        }
    }
    cs
}

/// Where each (block, layer) of `blocks` sits, in the order
/// `Backend::kv_blocks` lays them out (block by block, layer by layer):
/// the layer and the block's index in that layer's buffer, `None` for an
/// id of the other pool (`KvLayout::layer_block`), read as zeros and
/// never written.
pub fn kv_places(l: &KvLayout, blocks: &[u32]) -> Vec<(usize, Option<usize>)> {
    blocks
        .iter()
        .flat_map(|&b| (0..l.n_layer).map(move |layer| (layer, l.layer_block(layer, b))))
        .collect()
}

/// A KV write's destinations as the kernels read them: (block less
/// `base`, slot) words (see `paged_queries`).
pub fn slot_words(slots: &[(u32, usize)], base: u32) -> Vec<u32> {
    slots
        .iter()
        .flat_map(|&(b, s)| [b.wrapping_sub(base), s as u32])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weights the kernels see in `words` (kind `kind`), row by row.
    fn unpack(words: &[u32], kind: u32, wpb: usize, rows: usize, cols: usize) -> Vec<f32> {
        let nb = cols / 32;
        let mut out = vec![0.0; rows * cols];
        for r in 0..rows {
            for b in 0..nb {
                let w = &words[(b * rows + r) * wpb..][..wpb];
                let d = f32::from_bits(w[0]);
                let (m, at) = if kind == KIND_Q8_0 {
                    (0.0, 1)
                } else {
                    (f32::from_bits(w[1]), 2)
                };
                let bytes: Vec<u8> = w[at..].iter().flat_map(|x| x.to_le_bytes()).collect();
                for j in 0..32 {
                    let q = || f32::from(bytes[j] as i8);
                    let v = if kind == KIND_Q8_0 {
                        q() * d
                    } else if kind == KIND_Q8_MIN {
                        q() * d + m
                    } else if kind == KIND_Q8_HALVES {
                        q() * if j < 16 { d } else { m }
                    } else {
                        let n = if j < 16 {
                            bytes[j] & 0x0F
                        } else {
                            bytes[j - 16] >> 4
                        };
                        d * f32::from(n) + m
                    };
                    out[r * cols + b * 32 + j] = v;
                }
            }
        }
        out
    }

    #[test]
    fn every_format_reaches_the_kernels_with_ggml_s_values() {
        let (rows, cols) = (5, 512);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1013) as f32 / 506.0 - 1.0)
            .collect();
        for ty in [
            QuantType::Q4K,
            QuantType::Q5K,
            QuantType::Q6K,
            QuantType::Q5_0,
            QuantType::Q5_1,
            QuantType::Iq4Nl,
            QuantType::Iq4Xs,
            QuantType::Q4_1,
            QuantType::Q8_0,
        ] {
            let q = QMatrix::quantize(ty, rows, cols, &w).expect("quantize");
            let (words, kind, wpb) = repack(&q).expect("repack");
            let got = unpack(&words, kind, wpb as usize, rows, cols);
            let want: Vec<f32> = (0..rows).flat_map(|r| q.dequantize_row(r)).collect();
            assert_ne!(kind, KIND_Q4_0);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                // Bit for bit (Q4_K: ggml's `d1 * q - m1` is `d * q + m`).
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{ty:?} weight {i}: {g} against {e}"
                );
            }
        }
    }
}
