//! What the GPU backends (`wgpu`, `cuda`) share on the host side: the
//! quantized weight layout their matmul kernels read (each 32-weight GGML
//! block repacked into whole 32-bit words: the scale, and Q4_1's min, as
//! f32, then the block's bytes) and the kernels' fixed sizes. The GPU
//! kernels have no Q5 or K-quant formats yet: Q5_0, Q5_1, Q4_K, Q5_K and
//! Q6_K are requantized to Q8_0 on upload (a finer step than theirs, but not
//! their exact values).

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

/// A quantized matrix as the kernels read it: the words, the format's
/// `kind` and the words per 32-weight block. Blocks are stored block
/// column by block column (block `b` of row `r` is block `b * rows + r`):
/// the matmul kernels give each output row its own thread, and
/// neighbouring threads then read neighbouring blocks.
pub fn repack(q: &QMatrix) -> Result<(Vec<u32>, u32, u32), KernelError> {
    let (kind, head, wpb) = match q.ty {
        QuantType::Q4_0 => (KIND_Q4_0, 2, 5),
        QuantType::Q4_1 => (KIND_Q4_1, 4, 6),
        QuantType::Q8_0 => (KIND_Q8_0, 2, 9),
        QuantType::Q5_0
        | QuantType::Q5_1
        | QuantType::Q4K
        | QuantType::Q5K
        | QuantType::Q6K
        | QuantType::Iq4Nl
        | QuantType::Iq4Xs => {
            return repack(&q.requantize(QuantType::Q8_0)?);
        }
    };
    let (nb, w) = (q.blocks_per_row(), wpb as usize);
    let block = q.ty.block_bytes();
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32().to_bits();
    let mut words = vec![0u32; q.rows * nb * w];
    for r in 0..q.rows {
        for (b, bytes) in q.ggml_row(r).chunks_exact(block).enumerate() {
            let out = &mut words[(b * q.rows + r) * w..][..w];
            out[0] = f16(&bytes[0..2]);
            let at = if kind == KIND_Q4_1 {
                out[1] = f16(&bytes[2..4]);
                2
            } else {
                1
            };
            for (o, c) in out[at..].iter_mut().zip(bytes[head..].chunks_exact(4)) {
                *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
    Ok((words, kind, wpb))
}

/// Per query row of a paged attention call: its position and where its
/// block table starts in the joined tables, and the joined tables.
pub fn paged_queries(queries: &[(usize, &[u32])]) -> (Vec<u32>, Vec<u32>) {
    let mut info = Vec::with_capacity(2 * queries.len());
    let mut tables = Vec::new();
    for &(pos, table) in queries {
        info.extend([pos as u32, tables.len() as u32]);
        tables.extend_from_slice(table);
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

/// Each row's rotary `cos` values, then each row's `sin` values (half a
/// head wide), as the rope kernels read them.
pub fn rope_rows(positions: &[usize], cos: &[f32], sin: &[f32], head_dim: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut cs = Vec::with_capacity(2 * positions.len() * half);
    for table in [cos, sin] {
        for &pos in positions {
            cs.extend_from_slice(&table[pos * half..(pos + 1) * half]);
        }
    }
    cs
}

/// A KV write's destinations as the kernels read them: (block, slot) words.
pub fn slot_words(slots: &[(u32, usize)]) -> Vec<u32> {
    slots.iter().flat_map(|&(b, s)| [b, s as u32]).collect()
}
