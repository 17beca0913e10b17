//! `KvStorage`: the paged key/value memory of one model, in f16 or Q8_0
//! (`KvDtype`). Each layer holds `num_blocks` blocks of `block_size`
//! positions; within a block the layout is `[kv_head][slot][head_dim]`, so
//! one head's keys for a whole block are contiguous (read in one call by
//! attention). A Q8_0 block keeps beside its quants one f32 scale per
//! `q8_group(head_dim)` values of a row: about half the bytes of f16, so
//! twice the positions in the same memory and half the bytes a decode step
//! reads at long contexts.
//!
//! Blocks are allocated on first write, so resident memory follows the
//! blocks actually used (the pool reuses warm blocks first), not the
//! configured budget. Blocks move between backends and machines as f16
//! bits whatever the storage (`block_bits`, `set_block_bits`).

use std::borrow::Cow;

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::attention::KvRows;

/// How cached keys and values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// Half precision, as computed (rounded once).
    #[default]
    F16,
    /// 8-bit integers with an f32 scale per group of values (llama.cpp's
    /// `q8_0` cache type).
    Q8_0,
}

impl KvDtype {
    /// Parses a `--kv-cache-dtype` value: `auto`, `f16` (`fp16`,
    /// `float16`, `half`) or `q8_0` (`q8`, `int8`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "f16" | "fp16" | "float16" | "half" => Some(Self::F16),
            "q8_0" | "q8" | "int8" => Some(Self::Q8_0),
            _ => None,
        }
    }

    /// The name `parse` takes back.
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        }
    }

    /// Bytes one row of `head_dim` values takes (scales included).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            Self::F16 => 2 * head_dim,
            Self::Q8_0 => head_dim + 4 * head_dim / q8_group(head_dim),
        }
    }
}

/// Values sharing one Q8_0 scale in a row of `head_dim`: 32 (llama.cpp's
/// block) where it divides the row, else the whole row.
pub fn q8_group(head_dim: usize) -> usize {
    if head_dim.is_multiple_of(32) {
        32
    } else {
        head_dim.max(1)
    }
}

/// Geometry of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layer: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    pub dtype: KvDtype,
    /// Where the sliding-window layers keep blocks of their own: `None`
    /// when every layer reads one table.
    pub sliding: Option<SlidingBlocks>,
}

/// The block ids of a cache whose sliding-window layers keep a pool of
/// their own (vLLM's hybrid allocator): ids `0..first` are the other
/// layers' blocks, `first..num_blocks` the sliding layers'. Each layer
/// stores only its own pool's blocks, so a backend that allocates every
/// block up front (the GPUs) sizes each layer by its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingBlocks {
    /// Bit `i`: layer `i` slides.
    pub layers: u128,
    /// The sliding pool's first block id.
    pub first: u32,
}

impl SlidingBlocks {
    /// The most layers the mask covers; a deeper model keeps one table.
    pub const MAX_LAYERS: usize = 128;

    /// The mask of the layers for which `slides` is true, `None` past
    /// `MAX_LAYERS` layers.
    pub fn mask(n_layer: usize, mut slides: impl FnMut(usize) -> bool) -> Option<u128> {
        (n_layer <= Self::MAX_LAYERS).then(|| {
            (0..n_layer)
                .filter(|&l| slides(l))
                .fold(0, |m, l| m | 1 << l)
        })
    }

    /// Whether layer `layer` slides.
    pub fn slides(&self, layer: usize) -> bool {
        layer < Self::MAX_LAYERS && self.layers >> layer & 1 == 1
    }
}

impl KvLayout {
    /// Bytes one cached position takes across all layers (K and V).
    pub fn bytes_per_token(
        n_layer: usize,
        n_kv_head: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> usize {
        2 * n_layer * n_kv_head * dtype.row_bytes(head_dim)
    }

    /// Values in one block of one layer's K (or V).
    pub fn block_len(&self) -> usize {
        self.n_kv_head * self.block_size * self.head_dim
    }

    /// The block ids layer `layer` stores: its pool's.
    pub fn layer_ids(&self, layer: usize) -> std::ops::Range<u32> {
        let num = self.num_blocks as u32;
        match self.sliding {
            Some(s) if s.slides(layer) => s.first..num,
            Some(s) => 0..s.first.min(num),
            None => 0..num,
        }
    }

    /// Where block `block` sits among layer `layer`'s blocks; `None` for
    /// an id of the other pool.
    pub fn layer_block(&self, layer: usize, block: u32) -> Option<usize> {
        let ids = self.layer_ids(layer);
        ids.contains(&block).then(|| (block - ids.start) as usize)
    }

    /// Blocks of one layer's keys (or values) the whole cache stores: what
    /// a backend that allocates them up front holds.
    pub fn layer_blocks(&self) -> usize {
        (0..self.n_layer).map(|l| self.layer_ids(l).len()).sum()
    }

    /// The layout capped to fit a backend that holds at most `per_layer`
    /// blocks in one layer and `total` blocks over all layers
    /// (`layer_blocks`), or `None` when not one block fits. The sliding
    /// pool is kept whole (what it holds was sized for the running
    /// sequences' windows) and the other layers' pool shrinks; where the
    /// sliding pool does not fit beside one block of the other, every
    /// layer reads one table again.
    pub fn capped(mut self, per_layer: usize, total: usize) -> Option<KvLayout> {
        if let Some(s) = self.sliding {
            let swa = self.num_blocks.saturating_sub(s.first as usize);
            let n_swa = (0..self.n_layer).filter(|&l| s.slides(l)).count();
            let n_full = self.n_layer - n_swa;
            let left = total.saturating_sub(n_swa * swa) / n_full.max(1);
            let full = match n_full {
                // No layer holds the other pool's blocks.
                0 => s.first as usize,
                _ => (s.first as usize).min(per_layer).min(left),
            };
            let held = n_swa == 0 || (swa <= per_layer && n_swa * swa <= total);
            if held && full > 0 {
                self.sliding = Some(SlidingBlocks {
                    first: full as u32,
                    ..s
                });
                self.num_blocks = full + swa;
                return Some(self);
            }
            self.sliding = None;
        }
        self.num_blocks = self
            .num_blocks
            .min(per_layer)
            .min(total / self.n_layer.max(1));
        (self.num_blocks > 0).then_some(self)
    }
}

/// One block of one layer's keys (or values).
#[derive(Debug, Clone)]
enum Block {
    F16(Box<[u16]>),
    /// Quants, and one scale per `group` values.
    Q8 {
        q: Box<[i8]>,
        d: Box<[f32]>,
    },
}

impl Block {
    /// A block of zeros in `l`'s format.
    fn zeroed(l: &KvLayout) -> Self {
        let len = l.block_len();
        match l.dtype {
            KvDtype::F16 => Block::F16(vec![0u16; len].into_boxed_slice()),
            KvDtype::Q8_0 => Block::Q8 {
                q: vec![0i8; len].into_boxed_slice(),
                d: vec![0.0f32; len / q8_group(l.head_dim)].into_boxed_slice(),
            },
        }
    }

    /// Rows `at / hd .. at / hd + rows` (row starts `hd` apart) for attention.
    fn rows(&self, at: usize, rows: usize, hd: usize) -> KvRows<'_> {
        match self {
            Block::F16(x) => KvRows::F16(x[at..at + rows * hd].reinterpret_cast()),
            Block::Q8 { q, d } => {
                let group = q8_group(hd);
                KvRows::Q8 {
                    q: &q[at..at + rows * hd],
                    d: &d[at / group..(at + rows * hd) / group],
                    group,
                }
            }
        }
    }

    /// Stores one row of `x.len()` values starting at value `at`.
    fn write_row(&mut self, at: usize, x: &[f32]) {
        match self {
            Block::F16(b) => {
                for (dst, src) in b[at..at + x.len()].iter_mut().zip(x) {
                    *dst = f16::from_f32(*src).to_bits();
                }
            }
            Block::Q8 { q, d } => {
                let group = q8_group(x.len());
                let groups = x.chunks(group).zip(q[at..at + x.len()].chunks_mut(group));
                for (gi, (xs, qs)) in groups.enumerate() {
                    d[at / group + gi] = quantize_group(xs, qs);
                }
            }
        }
    }

    /// Appends the row of `hd` values starting at `at` as f16 bits.
    fn row_bits(&self, at: usize, hd: usize, out: &mut Vec<u16>) {
        match self {
            Block::F16(b) => out.extend_from_slice(&b[at..at + hd]),
            Block::Q8 { .. } => {
                let KvRows::Q8 { q, d, group } = self.rows(at, 1, hd) else {
                    unreachable!("a Q8 block gives Q8 rows")
                };
                out.extend(
                    q.iter()
                        .enumerate()
                        .map(|(i, &v)| f16::from_f32(f32::from(v) * d[i / group]).to_bits()),
                );
            }
        }
    }

    /// The whole block as f16 bits (rows `hd` long).
    fn bits(&self, hd: usize) -> Cow<'_, [u16]> {
        match self {
            Block::F16(b) => Cow::Borrowed(b),
            Block::Q8 { q, .. } => {
                let mut out = Vec::with_capacity(q.len());
                for at in (0..q.len()).step_by(hd) {
                    self.row_bits(at, hd, &mut out);
                }
                Cow::Owned(out)
            }
        }
    }

    /// A block in `l`'s format from f16 bits (`block_len` of them).
    fn from_bits(l: &KvLayout, bits: Box<[u16]>) -> Self {
        if l.dtype == KvDtype::F16 {
            return Block::F16(bits);
        }
        let mut b = Block::zeroed(l);
        let mut row = vec![0.0f32; l.head_dim];
        for (r, src) in bits.chunks_exact(l.head_dim).enumerate() {
            bits_to_f32(src, &mut row);
            b.write_row(r * l.head_dim, &row);
        }
        b
    }
}

/// Quantizes one group to `q` with the largest magnitude mapped to 127;
/// returns the scale (zero for a group of zeros).
fn quantize_group(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// f16 bits to f32s (`half`'s slice converter).
fn bits_to_f32(bits: &[u16], out: &mut [f32]) {
    let halves: &[f16] = bits.reinterpret_cast();
    halves.convert_to_f32_slice(out);
}

/// Keys and values of one layer, per block, allocated lazily.
#[derive(Debug)]
pub struct LayerKv {
    k: Vec<Option<Block>>,
    v: Vec<Option<Block>>,
}

/// The whole paged cache.
#[derive(Debug)]
pub struct KvStorage {
    pub layout: KvLayout,
    layers: Vec<LayerKv>,
    /// Blocks (of one layer's keys or values) holding memory.
    written: usize,
    /// Zeros returned for blocks never written (never read in practice).
    zeros: Block,
}

impl KvStorage {
    /// Creates the cache; no block memory is allocated yet.
    pub fn new(layout: KvLayout) -> Self {
        let layers = (0..layout.n_layer)
            .map(|_| LayerKv {
                k: vec![None; layout.num_blocks],
                v: vec![None; layout.num_blocks],
            })
            .collect();
        Self {
            layout,
            layers,
            written: 0,
            zeros: Block::zeroed(&layout),
        }
    }

    fn block<'a>(&'a self, blocks: &'a [Option<Block>], block: u32) -> &'a Block {
        blocks[block as usize].as_ref().unwrap_or(&self.zeros)
    }

    /// Keys of `head` for the first `slots` positions of `block`.
    pub fn k(&self, layer: usize, block: u32, head: usize, slots: usize) -> KvRows<'_> {
        let l = &self.layout;
        let at = head * l.block_size * l.head_dim;
        self.block(&self.layers[layer].k, block)
            .rows(at, slots, l.head_dim)
    }

    /// Values of `head` for the first `slots` positions of `block`.
    pub fn v(&self, layer: usize, block: u32, head: usize, slots: usize) -> KvRows<'_> {
        let l = &self.layout;
        let at = head * l.block_size * l.head_dim;
        self.block(&self.layers[layer].v, block)
            .rows(at, slots, l.head_dim)
    }

    /// Writes one position's keys and values (`n_kv_head * head_dim` each).
    pub fn write(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let l = self.layout;
        let lk = &mut self.layers[layer];
        for (blocks, x) in [(&mut lk.k, k), (&mut lk.v, v)] {
            let b = &mut blocks[block as usize];
            self.written += usize::from(b.is_none());
            write_heads(b.get_or_insert_with(|| Block::zeroed(&l)), &l, slot, x);
        }
    }

    /// One block of one layer as f16 bits: (keys, values); zeros for a
    /// block never written. For moving blocks (`transfer`).
    pub fn block_bits(&self, layer: usize, block: u32) -> (Cow<'_, [u16]>, Cow<'_, [u16]>) {
        let (l, hd) = (&self.layers[layer], self.layout.head_dim);
        (
            self.block(&l.k, block).bits(hd),
            self.block(&l.v, block).bits(hd),
        )
    }

    /// Replaces one block of one layer (`block_len` f16 values each).
    pub fn set_block_bits(&mut self, layer: usize, block: u32, k: Box<[u16]>, v: Box<[u16]>) {
        debug_assert_eq!(k.len(), self.layout.block_len());
        let l = self.layout;
        let lk = &mut self.layers[layer];
        for (blocks, bits) in [(&mut lk.k, k), (&mut lk.v, v)] {
            let b = &mut blocks[block as usize];
            self.written += usize::from(b.is_none());
            *b = Some(Block::from_bits(&l, bits));
        }
    }

    /// One position's keys and values of one layer as f16 bits, appended
    /// to `k` and `v` (`n_kv_head * head_dim` each, heads in order);
    /// zeros for a block never written.
    pub fn read_slot_bits(
        &self,
        layer: usize,
        block: u32,
        slot: usize,
        k: &mut Vec<u16>,
        v: &mut Vec<u16>,
    ) {
        let lk = &self.layers[layer];
        let (kb, vb) = (self.block(&lk.k, block), self.block(&lk.v, block));
        let (bs, hd) = (self.layout.block_size, self.layout.head_dim);
        for h in 0..self.layout.n_kv_head {
            let at = (h * bs + slot) * hd;
            kb.row_bits(at, hd, k);
            vb.row_bits(at, hd, v);
        }
    }

    /// Writes one position's keys and values of one layer from f16 bits
    /// (`n_kv_head * head_dim` each, heads in order).
    pub fn write_slot_bits(&mut self, layer: usize, block: u32, slot: usize, k: &[u16], v: &[u16]) {
        let mut kf = vec![0.0f32; k.len()];
        let mut vf = vec![0.0f32; v.len()];
        bits_to_f32(k, &mut kf);
        bits_to_f32(v, &mut vf);
        self.write(layer, block, slot, &kf, &vf);
    }

    /// Bytes the blocks written so far hold, over every layer (keys and
    /// values, scales included).
    pub fn allocated_bytes(&self) -> usize {
        let l = &self.layout;
        self.written * l.n_kv_head * l.block_size * l.dtype.row_bytes(l.head_dim)
    }

    /// Blocks holding memory in the first layer (for memory accounting).
    pub fn allocated_blocks(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |l| l.k.iter().filter(|b| b.is_some()).count())
    }
}

fn write_heads(block: &mut Block, l: &KvLayout, slot: usize, x: &[f32]) {
    let hd = l.head_dim;
    for h in 0..l.n_kv_head {
        block.write_row((h * l.block_size + slot) * hd, &x[h * hd..(h + 1) * hd]);
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn layout(dtype: KvDtype, head_dim: usize) -> KvLayout {
        KvLayout {
            n_layer: 2,
            n_kv_head: 3,
            head_dim,
            block_size: 4,
            num_blocks: 5,
            dtype,
            sliding: None,
        }
    }

    fn row_values(rows: KvRows<'_>) -> Vec<f32> {
        match rows {
            KvRows::F16(x) => x.iter().map(|v| v.to_f32()).collect(),
            KvRows::Q8 { q, d, group } => q
                .iter()
                .enumerate()
                .map(|(i, &v)| f32::from(v) * d[i / group])
                .collect(),
        }
    }

    #[test]
    fn q8_rows_hold_every_value_within_half_a_step_of_its_group() {
        let mut rng = StdRng::seed_from_u64(3);
        for hd in [64usize, 24, 8] {
            let l = layout(KvDtype::Q8_0, hd);
            let mut kv = KvStorage::new(l);
            let width = l.n_kv_head * hd;
            // Rows of very different sizes, one all zeros, one with an outlier.
            let mut rows = Vec::new();
            for slot in 0..4 {
                let spread = [1e-3f32, 1.0, 40.0, 0.0][slot];
                let mut k: Vec<f32> = (0..width)
                    .map(|_| rng.random_range(-spread..=spread))
                    .collect();
                if slot == 1 {
                    k[5] = 90.0;
                }
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                kv.write(1, 2, slot, &k, &v);
                rows.push(k);
            }
            let group = q8_group(hd);
            for (slot, k) in rows.iter().enumerate() {
                for h in 0..l.n_kv_head {
                    let all = row_values(kv.k(1, 2, h, 4));
                    let got = &all[slot * hd..(slot + 1) * hd];
                    let want = &k[h * hd..(h + 1) * hd];
                    for (g, (gs, ws)) in got.chunks(group).zip(want.chunks(group)).enumerate() {
                        let amax = ws.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                        for (a, b) in gs.iter().zip(ws) {
                            assert!(
                                (a - b).abs() <= amax / 254.0 * 1.0001,
                                "hd {hd} slot {slot} head {h} group {g}: {a} vs {b}"
                            );
                        }
                    }
                    let back = row_values(kv.v(1, 2, h, 4));
                    assert_eq!(
                        &back[slot * hd..(slot + 1) * hd],
                        &got.iter().map(|x| -x).collect::<Vec<_>>()[..]
                    );
                }
            }
        }
    }

    #[test]
    fn blocks_move_as_f16_bits_between_f16_and_q8_caches() {
        let mut rng = StdRng::seed_from_u64(4);
        let (lf, lq) = (layout(KvDtype::F16, 64), layout(KvDtype::Q8_0, 64));
        let mut f = KvStorage::new(lf);
        let width = lf.n_kv_head * 64;
        for slot in 0..4 {
            let k: Vec<f32> = (0..width).map(|_| rng.random_range(-2.0..2.0)).collect();
            f.write(0, 1, slot, &k, &k);
        }
        // f16 -> q8 -> f16: each value within the quantization step.
        let mut q = KvStorage::new(lq);
        let (k, v) = f.block_bits(0, 1);
        q.set_block_bits(0, 3, k.to_vec().into(), v.to_vec().into());
        let (qk, _) = q.block_bits(0, 3);
        for (a, b) in qk.iter().zip(k.iter()) {
            let (a, b) = (f16::from_bits(*a).to_f32(), f16::from_bits(*b).to_f32());
            assert!((a - b).abs() <= 2.0 / 254.0 + 2e-3, "{a} vs {b}");
        }
        // Q8 -> f16 bits -> Q8 again moves no value by more than f16's
        // rounding (the same grid comes back).
        let mut q2 = KvStorage::new(lq);
        q2.set_block_bits(0, 0, qk.to_vec().into(), qk.to_vec().into());
        for (a, b) in q2.block_bits(0, 0).0.iter().zip(qk.iter()) {
            let (a, b) = (f16::from_bits(*a).to_f32(), f16::from_bits(*b).to_f32());
            assert!((a - b).abs() <= 2e-3 * b.abs().max(1e-3), "{a} vs {b}");
        }
        // One slot through the slot API matches the block.
        let (mut sk, mut sv) = (Vec::new(), Vec::new());
        q.read_slot_bits(0, 3, 2, &mut sk, &mut sv);
        let mut q3 = KvStorage::new(lq);
        q3.write_slot_bits(0, 4, 2, &sk, &sv);
        let (mut sk2, mut sv2) = (Vec::new(), Vec::new());
        q3.read_slot_bits(0, 4, 2, &mut sk2, &mut sv2);
        assert_eq!((sk, sv), (sk2, sv2));
    }

    #[test]
    fn memory_is_counted_as_blocks_are_first_written() {
        for dtype in [KvDtype::F16, KvDtype::Q8_0] {
            let l = layout(dtype, 64);
            let mut kv = KvStorage::new(l);
            assert_eq!(kv.allocated_bytes(), 0);
            let row = vec![1.0f32; l.n_kv_head * 64];
            kv.write(0, 1, 0, &row, &row);
            kv.write(0, 1, 3, &row, &row);
            let block = l.n_kv_head * l.block_size * dtype.row_bytes(64);
            assert_eq!(kv.allocated_bytes(), 2 * block, "one block's K and V");
            kv.write(1, 4, 2, &row, &row);
            let (k, v) = kv.block_bits(0, 1);
            let (k, v): (Box<[u16]>, Box<[u16]>) = (k.to_vec().into(), v.to_vec().into());
            kv.set_block_bits(1, 0, k.clone(), v.clone());
            kv.set_block_bits(1, 4, k, v);
            assert_eq!(kv.allocated_bytes(), 6 * block);
        }
    }

    #[test]
    fn dtypes_parse_and_size_their_rows() {
        assert_eq!(KvDtype::parse("auto"), Some(KvDtype::F16));
        assert_eq!(KvDtype::parse("Q8_0"), Some(KvDtype::Q8_0));
        assert_eq!(KvDtype::parse("fp8"), None);
        assert_eq!(KvDtype::F16.row_bytes(64), 128);
        assert_eq!(KvDtype::Q8_0.row_bytes(64), 72);
        assert_eq!(KvDtype::Q8_0.row_bytes(24), 28);
        assert_eq!(
            KvLayout::bytes_per_token(2, 3, 64, KvDtype::Q8_0),
            2 * 2 * 3 * 72
        );
    }

    /// Six layers, layers 0, 1, 3 and 4 sliding; blocks 0..10 the other
    /// layers', 10..14 the sliding ones'.
    fn sliding_layout() -> KvLayout {
        KvLayout {
            n_layer: 6,
            num_blocks: 14,
            sliding: Some(SlidingBlocks {
                layers: SlidingBlocks::mask(6, |l| l % 3 < 2).expect("fits"),
                first: 10,
            }),
            ..layout(KvDtype::F16, 8)
        }
    }

    #[test]
    fn each_layer_stores_its_own_pools_blocks() {
        let l = sliding_layout();
        assert_eq!(l.layer_ids(0), 10..14);
        assert_eq!(l.layer_ids(2), 0..10);
        assert_eq!(l.layer_block(4, 12), Some(2));
        assert_eq!(
            l.layer_block(4, 3),
            None,
            "a full-pool id on a sliding layer"
        );
        assert_eq!(l.layer_block(5, 3), Some(3));
        assert_eq!(l.layer_block(5, 10), None, "a sliding id on a full layer");
        assert_eq!(l.layer_blocks(), 4 * 4 + 2 * 10);
        let plain = KvLayout { sliding: None, ..l };
        assert_eq!(plain.layer_ids(0), 0..14);
        assert_eq!(plain.layer_blocks(), 6 * 14);
        assert_eq!(SlidingBlocks::mask(129, |_| true), None);
        assert!(SlidingBlocks::mask(128, |_| true).is_some_and(|m| m == u128::MAX));
    }

    #[test]
    fn capping_shrinks_the_full_pool_and_keeps_the_sliding_one_whole() {
        let l = sliding_layout();
        assert_eq!(l.capped(100, 1000), Some(l), "it fits");
        let c = l.capped(7, 1000).expect("fits");
        assert_eq!((c.num_blocks, c.sliding.map(|s| s.first)), (11, Some(7)));
        // 16 blocks go to the sliding layers; 12 left for two full layers.
        let c = l.capped(100, 28).expect("fits");
        assert_eq!((c.num_blocks, c.sliding.map(|s| s.first)), (10, Some(6)));
        // The sliding pool alone is wider than a layer: one table.
        let c = l.capped(3, 1000).expect("fits");
        assert_eq!((c.num_blocks, c.sliding), (3, None));
        // Nothing left for the full layers beside it: one table.
        let c = l.capped(100, 17).expect("fits");
        assert_eq!((c.num_blocks, c.sliding), (2, None));
        assert_eq!(l.capped(0, 1000), None);
    }

    #[test]
    fn capped_layouts_fit_what_they_were_capped_to() {
        let mut rng = StdRng::seed_from_u64(43);
        for _ in 0..2000 {
            let n_layer = rng.random_range(1..10);
            let num_blocks = rng.random_range(1..50);
            let mut l = KvLayout {
                n_layer,
                num_blocks,
                ..layout(KvDtype::F16, 8)
            };
            if rng.random_bool(0.7) {
                let layers = SlidingBlocks::mask(n_layer, |_| rng.random_bool(0.6)).expect("fits");
                let first = rng.random_range(0..=num_blocks) as u32;
                l.sliding = Some(SlidingBlocks { layers, first });
            }
            let (per_layer, total) = (rng.random_range(0..60), rng.random_range(0..400));
            let Some(c) = l.capped(per_layer, total) else {
                continue;
            };
            assert!(
                c.num_blocks > 0 && c.num_blocks <= l.num_blocks,
                "{l:?} -> {c:?}"
            );
            assert!(c.layer_blocks() <= total, "{l:?} -> {c:?}");
            if l.layer_blocks() <= total && (0..n_layer).all(|i| l.layer_ids(i).len() <= per_layer)
            {
                assert!(
                    c == l || l.sliding.is_some_and(|s| s.first == 0),
                    "{l:?} -> {c:?}"
                );
            }
            assert!((0..n_layer).all(|i| c.layer_ids(i).len() <= per_layer));
            if let (Some(s), Some(was)) = (c.sliding, l.sliding) {
                assert_eq!(
                    c.num_blocks - s.first as usize,
                    l.num_blocks - was.first as usize
                );
                assert!(s.first > 0);
            }
        }
    }
}
