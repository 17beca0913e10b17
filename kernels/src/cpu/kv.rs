//! `KvStorage`: the paged key/value memory of one model, in f16. Each layer
//! holds `num_blocks` blocks of `block_size` positions; within a block the
//! layout is `[kv_head][slot][head_dim]`, so one head's keys for a whole
//! block are contiguous (converted to f32 in one call by attention).
//!
//! Blocks are allocated on first write, so resident memory follows the
//! blocks actually used (the pool reuses warm blocks first), not the
//! configured budget.

use half::f16;
use half::slice::HalfBitsSliceExt;

/// Geometry of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layer: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub num_blocks: usize,
}

impl KvLayout {
    /// Bytes one cached position takes across all layers (K and V, f16).
    pub fn bytes_per_token(n_layer: usize, n_kv_head: usize, head_dim: usize) -> usize {
        2 * n_layer * n_kv_head * head_dim * std::mem::size_of::<f16>()
    }

    /// Values in one block of one layer's K (or V).
    pub fn block_len(&self) -> usize {
        self.n_kv_head * self.block_size * self.head_dim
    }
}

/// Keys and values of one layer: per block, f16 bits, allocated lazily.
#[derive(Debug)]
pub struct LayerKv {
    k: Vec<Option<Box<[u16]>>>,
    v: Vec<Option<Box<[u16]>>>,
}

/// The whole paged cache.
#[derive(Debug)]
pub struct KvStorage {
    pub layout: KvLayout,
    layers: Vec<LayerKv>,
    /// Zeros returned for blocks never written (never read in practice).
    zeros: Box<[u16]>,
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
            zeros: vec![0u16; layout.block_len()].into_boxed_slice(),
        }
    }

    fn head_range(&self, head: usize, slots: usize) -> std::ops::Range<usize> {
        let l = &self.layout;
        let at = head * l.block_size * l.head_dim;
        at..at + slots * l.head_dim
    }

    /// Keys of `head` for the first `slots` positions of `block`, as f16.
    pub fn k(&self, layer: usize, block: u32, head: usize, slots: usize) -> &[f16] {
        let data = self.layers[layer].k[block as usize]
            .as_deref()
            .unwrap_or(&self.zeros);
        data[self.head_range(head, slots)].reinterpret_cast()
    }

    /// Values of `head` for the first `slots` positions of `block`, as f16.
    pub fn v(&self, layer: usize, block: u32, head: usize, slots: usize) -> &[f16] {
        let data = self.layers[layer].v[block as usize]
            .as_deref()
            .unwrap_or(&self.zeros);
        data[self.head_range(head, slots)].reinterpret_cast()
    }

    /// Writes one position's keys and values (`n_kv_head * head_dim` each).
    pub fn write(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let l = self.layout;
        let fresh = || vec![0u16; l.block_len()].into_boxed_slice();
        let lk = &mut self.layers[layer];
        write_heads(lk.k[block as usize].get_or_insert_with(fresh), &l, slot, k);
        write_heads(lk.v[block as usize].get_or_insert_with(fresh), &l, slot, v);
    }

    /// One block of one layer as f16 bits: (keys, values); zeros for a
    /// block never written. For moving blocks (`transfer`).
    pub fn block_bits(&self, layer: usize, block: u32) -> (&[u16], &[u16]) {
        let l = &self.layers[layer];
        let zeros: &[u16] = &self.zeros;
        let k = l.k[block as usize].as_deref().unwrap_or(zeros);
        let v = l.v[block as usize].as_deref().unwrap_or(zeros);
        (k, v)
    }

    /// Replaces one block of one layer (`block_len` values each).
    pub fn set_block_bits(&mut self, layer: usize, block: u32, k: Box<[u16]>, v: Box<[u16]>) {
        debug_assert_eq!(k.len(), self.layout.block_len());
        let l = &mut self.layers[layer];
        l.k[block as usize] = Some(k);
        l.v[block as usize] = Some(v);
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
        let (kb, vb) = self.block_bits(layer, block);
        let (bs, hd) = (self.layout.block_size, self.layout.head_dim);
        for h in 0..self.layout.n_kv_head {
            let at = (h * bs + slot) * hd;
            k.extend_from_slice(&kb[at..at + hd]);
            v.extend_from_slice(&vb[at..at + hd]);
        }
    }

    /// Writes one position's keys and values of one layer from f16 bits
    /// (`n_kv_head * head_dim` each, heads in order).
    pub fn write_slot_bits(&mut self, layer: usize, block: u32, slot: usize, k: &[u16], v: &[u16]) {
        let l = self.layout;
        let fresh = || vec![0u16; l.block_len()].into_boxed_slice();
        let lk = &mut self.layers[layer];
        let (kb, vb) = (
            lk.k[block as usize].get_or_insert_with(fresh),
            lk.v[block as usize].get_or_insert_with(fresh),
        );
        let hd = l.head_dim;
        for h in 0..l.n_kv_head {
            let at = (h * l.block_size + slot) * hd;
            kb[at..at + hd].copy_from_slice(&k[h * hd..(h + 1) * hd]);
            vb[at..at + hd].copy_from_slice(&v[h * hd..(h + 1) * hd]);
        }
    }

    /// Blocks holding memory in the first layer (for memory accounting).
    pub fn allocated_blocks(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |l| l.k.iter().filter(|b| b.is_some()).count())
    }
}

fn write_heads(block: &mut [u16], l: &KvLayout, slot: usize, x: &[f32]) {
    let hd = l.head_dim;
    for h in 0..l.n_kv_head {
        let at = (h * l.block_size + slot) * hd;
        for (dst, src) in block[at..at + hd].iter_mut().zip(&x[h * hd..(h + 1) * hd]) {
            *dst = f16::from_f32(*src).to_bits();
        }
    }
}
