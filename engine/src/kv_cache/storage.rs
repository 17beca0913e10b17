//! `KvStorage`: the paged key/value memory of one model, in f16. Each layer
//! holds `num_blocks` blocks of `block_size` positions; within a block the
//! layout is `[kv_head][slot][head_dim]`, so one head's keys for a whole
//! block are contiguous (converted to f32 in one call by attention).
//!
//! Values are kept as raw f16 bits in zero-initialised `u16` vectors: the
//! allocator hands those out as untouched pages, so resident memory grows
//! with the blocks actually used, not with the configured budget.

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

/// Keys and values of one layer (f16 bits).
#[derive(Debug)]
pub struct LayerKv {
    k: Vec<u16>,
    v: Vec<u16>,
}

impl LayerKv {
    /// `len` keys starting at `at`, as f16.
    pub fn k(&self, at: usize, len: usize) -> &[f16] {
        self.k[at..at + len].reinterpret_cast()
    }

    /// `len` values starting at `at`, as f16.
    pub fn v(&self, at: usize, len: usize) -> &[f16] {
        self.v[at..at + len].reinterpret_cast()
    }
}

/// The whole paged cache.
#[derive(Debug)]
pub struct KvStorage {
    pub layout: KvLayout,
    pub layers: Vec<LayerKv>,
}

impl KvStorage {
    /// Allocates (zeroed) storage for `layout`.
    pub fn new(layout: KvLayout) -> Self {
        let n = layout.num_blocks * layout.block_len();
        let layers = (0..layout.n_layer)
            .map(|_| LayerKv {
                k: vec![0u16; n],
                v: vec![0u16; n],
            })
            .collect();
        Self { layout, layers }
    }

    /// Offset of `(block, kv_head, slot)`'s vector in a layer's K or V.
    pub fn offset(&self, block: u32, head: usize, slot: usize) -> usize {
        let l = &self.layout;
        ((block as usize * l.n_kv_head + head) * l.block_size + slot) * l.head_dim
    }

    /// Writes one position's keys and values (`n_kv_head * head_dim` each).
    pub fn write(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let hd = self.layout.head_dim;
        for h in 0..self.layout.n_kv_head {
            let at = self.offset(block, h, slot);
            let lk = &mut self.layers[layer];
            for (dst, src) in lk.k[at..at + hd].iter_mut().zip(&k[h * hd..(h + 1) * hd]) {
                *dst = f16::from_f32(*src).to_bits();
            }
            for (dst, src) in lk.v[at..at + hd].iter_mut().zip(&v[h * hd..(h + 1) * hd]) {
                *dst = f16::from_f32(*src).to_bits();
            }
        }
    }
}
