//! Moving a sequence's KV between executors: `export` writes whole
//! blocks as bytes, `import` reads them into another executor's blocks;
//! `read_rows` and `write_rows` do the same for a range of positions, one
//! byte string per layer (what a prefill worker streams to a decode
//! worker as it goes, `KvRows`). The `_on` forms work on any backend's KV
//! (`Backend::kv_blocks`): a GPU executor's blocks move in the same bytes
//! as the CPU's; their rows take one block table per layer (sliding-window
//! layers keep their own, `KvManager::with_sliding`), and rows a layer
//! released behind its window read as zeros and are not written.
//!
//! Layout (little-endian): the magic `SYKV`, a `u16` version, the geometry
//! (`u32` layers, KV heads, head dim, block size, block count), then for
//! each block in order and each layer in it, the block's keys and values
//! as f16 bits (`n_kv_head * block_size * head_dim` each), then the SHA-256
//! of everything before it. An import checks the size, the geometry
//! against its own cache, every block id and the digest before it writes
//! anything: bytes that fail any check change nothing.

use kernels::backend::Backend;
use kernels::cpu::backend::CpuBackend;
use sha2::{Digest, Sha256};

use super::manager::HOLE;
use super::storage::{KvLayout, KvStorage};

const MAGIC: &[u8; 4] = b"SYKV";
const VERSION: u16 = 1;
const HEADER: usize = 4 + 2 + 5 * 4;
const DIGEST: usize = 32;

/// Why KV bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvTransferError {
    #[error("not KV blocks (bad magic or version)")]
    NotKv,
    #[error("KV geometry {got} does not match this cache's {want}")]
    Geometry { got: String, want: String },
    #[error("{got} KV blocks sent for {want} block ids")]
    Count { got: usize, want: usize },
    #[error("KV bytes are {got} long, expected {want}")]
    Length { got: usize, want: usize },
    #[error("block id {0} is outside the cache")]
    BlockId(u32),
    #[error("KV digest mismatch: the bytes were damaged")]
    Digest,
}

/// The KV of positions `first..first + count` of one sequence: per
/// layer, the keys of each position (`[position][kv_head][head_dim]`, f16
/// bits, little-endian), then the values likewise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRows {
    pub first: usize,
    pub count: usize,
    pub layers: Vec<Vec<u8>>,
}

impl KvRows {
    /// One past the last position.
    pub fn end(&self) -> usize {
        self.first + self.count
    }

    /// Bytes of one position of one layer (keys and values) in `l`.
    pub fn bytes_per_position(l: &KvLayout) -> usize {
        2 * l.n_kv_head * l.head_dim * 2
    }

    /// Checks the rows fit `l`: one byte string per layer, each exactly
    /// `count` positions long.
    pub fn check(&self, l: &KvLayout) -> Result<(), KvTransferError> {
        if self.layers.len() != l.n_layer {
            return Err(KvTransferError::Count {
                got: self.layers.len(),
                want: l.n_layer,
            });
        }
        let want = self.count * Self::bytes_per_position(l);
        match self.layers.iter().find(|b| b.len() != want) {
            Some(b) => Err(KvTransferError::Length { got: b.len(), want }),
            None => Ok(()),
        }
    }
}

impl KvRows {
    /// Joins consecutive row ranges (each starting where the one before
    /// ended) into one; `None` when they are empty, have gaps or differ
    /// in layers.
    pub fn concat(parts: &[KvRows]) -> Option<KvRows> {
        let first = parts.first()?;
        let n_layer = first.layers.len();
        let mut end = first.first;
        for p in parts {
            if p.first != end || p.layers.len() != n_layer {
                return None;
            }
            end = p.end();
        }
        let layers = (0..n_layer)
            .map(|l| {
                let halves = |keys: bool| {
                    parts.iter().flat_map(move |p| {
                        let (k, v) = p.layers[l].split_at(p.layers[l].len() / 2);
                        if keys { k } else { v }.iter().copied()
                    })
                };
                halves(true).chain(halves(false)).collect()
            })
            .collect();
        Some(KvRows {
            first: first.first,
            count: end - first.first,
            layers,
        })
    }
}

/// The block and slot of position `p` in `table`; `None` for a block
/// released behind a sliding window (`HOLE`).
fn slot_of(l: &KvLayout, table: &[u32], p: usize) -> Result<Option<(u32, usize)>, KvTransferError> {
    let block = *table
        .get(p / l.block_size)
        .ok_or(KvTransferError::BlockId(u32::MAX))?;
    if block == HOLE {
        return Ok(None);
    }
    if block as usize >= l.num_blocks {
        return Err(KvTransferError::BlockId(block));
    }
    Ok(Some((block, p % l.block_size)))
}

/// The KV of positions `first..first + count` of the sequence whose
/// block table is `table` (every layer's).
pub fn read_rows(
    kv: &KvStorage,
    table: &[u32],
    first: usize,
    count: usize,
) -> Result<KvRows, KvTransferError> {
    let tables = vec![table; kv.layout.n_layer];
    read_rows_on(&CpuBackend, kv, &tables, first, count)
}

/// Writes `rows` from position `from` (at or after `rows.first`) to its
/// end into the blocks of `table` (every layer's); checks everything
/// before writing.
pub fn write_rows(
    kv: &mut KvStorage,
    table: &[u32],
    rows: &KvRows,
    from: usize,
) -> Result<(), KvTransferError> {
    let tables = vec![table; kv.layout.n_layer];
    write_rows_on(&CpuBackend, kv, &tables, rows, from)
}

/// The bytes of `blocks` (in this order), with their digest.
pub fn export(kv: &KvStorage, blocks: &[u32]) -> Result<Vec<u8>, KvTransferError> {
    export_on(&CpuBackend, kv, blocks)
}

/// Checks `bytes` against `kv`'s geometry and `blocks`, then writes them.
pub fn import(kv: &mut KvStorage, blocks: &[u32], bytes: &[u8]) -> Result<(), KvTransferError> {
    import_on(&CpuBackend, kv, blocks, bytes)
}

/// Where each layer keeps positions `positions`: per layer, per position,
/// the index of its block among the distinct blocks touched (returned
/// second, in order of first use) and its slot; `None` where the layer
/// released it (`HOLE`).
type Places = Vec<Vec<Option<(usize, usize)>>>;

fn places(
    l: &KvLayout,
    tables: &[&[u32]],
    positions: std::ops::Range<usize>,
) -> Result<(Places, Vec<u32>), KvTransferError> {
    if tables.len() != l.n_layer {
        return Err(KvTransferError::Count {
            got: tables.len(),
            want: l.n_layer,
        });
    }
    let mut blocks: Vec<u32> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(tables.len());
    for table in tables {
        let mut layer = Vec::with_capacity(positions.len());
        for p in positions.clone() {
            layer.push(slot_of(l, table, p)?.map(|(b, slot)| {
                let i = *index.entry(b).or_insert_with(|| {
                    blocks.push(b);
                    blocks.len() - 1
                });
                (i, slot)
            }));
        }
        out.push(layer);
    }
    Ok((out, blocks))
}

/// Where position (block index `bi`, `slot`), layer `layer`, head `h`
/// starts in bits laid out as `Backend::kv_blocks` gives them: the keys;
/// the values are `block_len` further.
fn bit_at(l: &KvLayout, bi: usize, layer: usize, h: usize, slot: usize) -> usize {
    (bi * l.n_layer + layer) * 2 * l.block_len() + (h * l.block_size + slot) * l.head_dim
}

/// `read_rows` on any backend's KV, each layer over its own table
/// (`tables[layer]`): a position a layer released (`HOLE`) reads as zeros.
pub fn read_rows_on<B: Backend>(
    backend: &B,
    kv: &B::Kv,
    tables: &[&[u32]],
    first: usize,
    count: usize,
) -> Result<KvRows, KvTransferError> {
    let l = backend.kv_layout(kv);
    let (places, blocks) = places(&l, tables, first..first + count)?;
    let bits = backend.kv_blocks(kv, &blocks);
    let (hd, n) = (l.head_dim, l.block_len());
    let layers = places
        .iter()
        .enumerate()
        .map(|(layer, at)| {
            let mut out = Vec::with_capacity(count * KvRows::bytes_per_position(&l));
            for values in [0, n] {
                for place in at {
                    for h in 0..l.n_kv_head {
                        match *place {
                            Some((bi, slot)) => {
                                let from = bit_at(&l, bi, layer, h, slot) + values;
                                let row = &bits[from..from + hd];
                                out.extend(row.iter().flat_map(|x| x.to_le_bytes()));
                            }
                            None => out.resize(out.len() + 2 * hd, 0),
                        }
                    }
                }
            }
            out
        })
        .collect();
    Ok(KvRows {
        first,
        count,
        layers,
    })
}

/// `write_rows` on any backend's KV, each layer over its own table
/// (`tables[layer]`, positions it released skipped): the touched blocks
/// are read, the rows written into them, and the blocks written back.
pub fn write_rows_on<B: Backend>(
    backend: &B,
    kv: &mut B::Kv,
    tables: &[&[u32]],
    rows: &KvRows,
    from: usize,
) -> Result<(), KvTransferError> {
    let l = backend.kv_layout(kv);
    rows.check(&l)?;
    if from < rows.first || from > rows.end() {
        return Err(KvTransferError::Count {
            got: from,
            want: rows.first,
        });
    }
    let (places, blocks) = places(&l, tables, from..rows.end())?;
    let mut bits = backend.kv_blocks(kv, &blocks);
    let (hd, n, width) = (l.head_dim, l.block_len(), l.n_kv_head * l.head_dim);
    for (layer, (bytes, at)) in rows.layers.iter().zip(&places).enumerate() {
        let half = rows.count * 2 * width;
        for (values, part) in [(0, &bytes[..half]), (n, &bytes[half..])] {
            for (j, place) in at.iter().enumerate() {
                let Some((bi, slot)) = *place else { continue };
                let i = from - rows.first + j;
                for h in 0..l.n_kv_head {
                    let src = &part[(i * width + h * hd) * 2..(i * width + (h + 1) * hd) * 2];
                    let dst = bit_at(&l, bi, layer, h, slot) + values;
                    for (d, c) in bits[dst..dst + hd].iter_mut().zip(src.chunks_exact(2)) {
                        *d = u16::from_le_bytes([c[0], c[1]]);
                    }
                }
            }
        }
    }
    backend.set_kv_blocks(kv, &blocks, &bits);
    Ok(())
}

fn geometry(l: &KvLayout) -> String {
    format!(
        "{} layers x {} heads x {} dims, blocks of {}",
        l.n_layer, l.n_kv_head, l.head_dim, l.block_size
    )
}

/// `export` from any backend's KV.
pub fn export_on<B: Backend>(
    backend: &B,
    kv: &B::Kv,
    blocks: &[u32],
) -> Result<Vec<u8>, KvTransferError> {
    let l = backend.kv_layout(kv);
    if let Some(&b) = blocks.iter().find(|&&b| b as usize >= l.num_blocks) {
        return Err(KvTransferError::BlockId(b));
    }
    let body = blocks.len() * l.n_layer * 2 * l.block_len() * 2;
    let mut out = Vec::with_capacity(HEADER + body + DIGEST);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for v in [
        l.n_layer,
        l.n_kv_head,
        l.head_dim,
        l.block_size,
        blocks.len(),
    ] {
        out.extend_from_slice(&(v as u32).to_le_bytes());
    }
    for x in backend.kv_blocks(kv, blocks) {
        out.extend_from_slice(&x.to_le_bytes());
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    Ok(out)
}

fn u32_at(bytes: &[u8], at: usize) -> usize {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b) as usize
}

/// `import` into any backend's KV.
pub fn import_on<B: Backend>(
    backend: &B,
    kv: &mut B::Kv,
    blocks: &[u32],
    bytes: &[u8],
) -> Result<(), KvTransferError> {
    let l = backend.kv_layout(kv);
    if bytes.len() < HEADER + DIGEST || &bytes[..4] != MAGIC || bytes[4..6] != VERSION.to_le_bytes()
    {
        return Err(KvTransferError::NotKv);
    }
    let got = KvLayout {
        n_layer: u32_at(bytes, 6),
        n_kv_head: u32_at(bytes, 10),
        head_dim: u32_at(bytes, 14),
        block_size: u32_at(bytes, 18),
        num_blocks: l.num_blocks,
        dtype: l.dtype,
        sliding: l.sliding,
    };
    if got != l {
        return Err(KvTransferError::Geometry {
            got: geometry(&got),
            want: geometry(&l),
        });
    }
    let count = u32_at(bytes, 22);
    if count != blocks.len() {
        return Err(KvTransferError::Count {
            got: count,
            want: blocks.len(),
        });
    }
    let per_block = l.n_layer * 2 * l.block_len() * 2;
    let want = HEADER + count * per_block + DIGEST;
    if bytes.len() != want {
        return Err(KvTransferError::Length {
            got: bytes.len(),
            want,
        });
    }
    if let Some(&b) = blocks.iter().find(|&&b| b as usize >= l.num_blocks) {
        return Err(KvTransferError::BlockId(b));
    }
    let (data, digest) = bytes.split_at(want - DIGEST);
    if Sha256::digest(data)[..] != digest[..] {
        return Err(KvTransferError::Digest);
    }
    let bits: Vec<u16> = data[HEADER..]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    backend.set_kv_blocks(kv, blocks, &bits);
    Ok(())
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn layout(num_blocks: usize) -> KvLayout {
        KvLayout {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 4,
            block_size: 3,
            num_blocks,
            dtype: Default::default(),
            sliding: None,
        }
    }

    fn filled(seed: u64) -> KvStorage {
        let mut kv = KvStorage::new(layout(6));
        let mut rng = StdRng::seed_from_u64(seed);
        for layer in 0..2 {
            for block in [1u32, 4] {
                for slot in 0..3 {
                    let k: Vec<f32> = (0..8).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let v: Vec<f32> = (0..8).map(|_| rng.random_range(-2.0..2.0)).collect();
                    kv.write(layer, block, slot, &k, &v);
                }
            }
        }
        kv
    }

    #[test]
    fn blocks_move_to_other_ids_bit_for_bit() {
        let src = filled(1);
        let bytes = export(&src, &[4, 1]).expect("export");
        let mut dst = KvStorage::new(layout(6));
        import(&mut dst, &[0, 5], &bytes).expect("import");
        for layer in 0..2 {
            assert_eq!(src.block_bits(layer, 4), dst.block_bits(layer, 0));
            assert_eq!(src.block_bits(layer, 1), dst.block_bits(layer, 5));
        }
    }

    #[test]
    fn rows_move_position_by_position_into_other_blocks() {
        let src = filled(4);
        // Positions 2..6 of a sequence over blocks [4, 1] (slots 2 of 4,
        // then 0..3 of 1), into a sequence over blocks [0, 5, 2].
        let rows = read_rows(&src, &[4, 1], 2, 4).expect("read");
        assert_eq!(rows.layers.len(), 2);
        assert_eq!(
            rows.layers[0].len(),
            4 * KvRows::bytes_per_position(&layout(6))
        );
        let mut dst = KvStorage::new(layout(6));
        write_rows(&mut dst, &[0, 5, 2], &rows, 3).expect("write");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (mut c, mut d) = (Vec::new(), Vec::new());
        for layer in 0..2 {
            for p in 3..6 {
                src.read_slot_bits(layer, [4, 1][p / 3], p % 3, &mut a, &mut b);
                dst.read_slot_bits(layer, [0, 5, 2][p / 3], p % 3, &mut c, &mut d);
            }
        }
        assert_eq!((a, b), (c, d));
        // Position 2 was before `from`: not written.
        let (mut k, mut v) = (Vec::new(), Vec::new());
        dst.read_slot_bits(0, 0, 2, &mut k, &mut v);
        assert!(k.iter().chain(&v).all(|&x| x == 0));
        // Rows that do not fit the cache, or a table too short, change nothing.
        let mut short = rows.clone();
        short.layers[1].pop();
        let mut fresh = KvStorage::new(layout(6));
        assert!(write_rows(&mut fresh, &[0, 5, 2], &short, 2).is_err());
        assert!(write_rows(&mut fresh, &[0], &rows, 2).is_err());
        assert!(write_rows(&mut fresh, &[0, 5, 2], &rows, 1).is_err());
        assert_eq!(fresh.allocated_blocks(), 0);
        assert!(read_rows(&src, &[4], 2, 4).is_err(), "past the table");
        // Ranges read in pieces join into the range read at once.
        let parts: Vec<KvRows> = [(2, 1), (3, 2), (5, 1)]
            .iter()
            .map(|&(f, n)| read_rows(&src, &[4, 1], f, n).expect("read"))
            .collect();
        assert_eq!(KvRows::concat(&parts), Some(rows));
        assert_eq!(KvRows::concat(&[parts[0].clone(), parts[2].clone()]), None);
        assert_eq!(KvRows::concat(&[]), None);
    }

    #[test]
    fn damaged_truncated_or_foreign_bytes_change_nothing() {
        let bytes = export(&filled(2), &[1, 4]).expect("export");
        let mut dst = KvStorage::new(layout(6));
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..200 {
            let mut b = bytes.clone();
            let i = rng.random_range(0..b.len());
            b[i] ^= 1 << rng.random_range(0..8);
            assert!(import(&mut dst, &[1, 4], &b).is_err(), "flipped byte {i}");
            let cut = rng.random_range(0..b.len());
            assert!(import(&mut dst, &[1, 4], &bytes[..cut]).is_err());
        }
        assert_eq!(dst.allocated_blocks(), 0, "a refused import wrote");
        assert!(matches!(
            import(&mut dst, &[1], &bytes),
            Err(KvTransferError::Count { got: 2, want: 1 })
        ));
        assert!(matches!(
            import(&mut dst, &[1, 6], &bytes),
            Err(KvTransferError::BlockId(6))
        ));
        let mut other = KvStorage::new(KvLayout {
            head_dim: 8,
            ..layout(6)
        });
        assert!(matches!(
            import(&mut other, &[1, 4], &bytes),
            Err(KvTransferError::Geometry { .. })
        ));
        import(&mut dst, &[1, 4], &bytes).expect("intact bytes import");
    }
}
