//! `BlockPool`: the fixed set of KV blocks, their reference counts, and the
//! prefix cache over them (after vLLM v1's `BlockPool`).
//!
//! A block is either in use (`ref_cnt > 0`) or free. Free blocks wait in an
//! LRU queue; a free block that still holds a full, hashed prefix stays
//! findable by its hash until it is handed out again (then the hash is
//! evicted). Cached blocks also keep their tokens, so a hash collision can
//! never serve another prefix's keys and values.

use std::collections::{BTreeMap, HashMap};

/// Index of a block in the pool (and in `KvStorage`).
pub type BlockId = u32;

/// Identity of a full block: the hash of its tokens chained with its parent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

#[derive(Debug, Clone, Default)]
struct Block {
    ref_cnt: u32,
    /// Set while the block is registered in the prefix cache.
    cached: Option<(BlockHash, Vec<u32>)>,
    /// Position in the free queue while free.
    free_stamp: Option<u64>,
}

/// The pool of KV blocks.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    /// Free blocks, oldest release first.
    free: BTreeMap<u64, BlockId>,
    next_stamp: u64,
    cache: HashMap<BlockHash, BlockId>,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> Self {
        let mut pool = Self {
            blocks: vec![Block::default(); num_blocks],
            free: BTreeMap::new(),
            next_stamp: 0,
            cache: HashMap::new(),
        };
        for id in 0..num_blocks as BlockId {
            pool.push_free(id);
        }
        pool
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Fraction of blocks in use.
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.free.len() as f64 / self.blocks.len() as f64
    }

    fn push_free(&mut self, id: BlockId) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.free.insert(stamp, id);
        self.blocks[id as usize].free_stamp = Some(stamp);
    }

    /// Takes `n` blocks (all or none), evicting their cached prefixes.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free.len() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let (_, id) = self.free.pop_first()?;
            let b = &mut self.blocks[id as usize];
            b.free_stamp = None;
            b.ref_cnt = 1;
            if let Some((hash, _)) = b.cached.take()
                && self.cache.get(&hash) == Some(&id)
            {
                self.cache.remove(&hash);
            }
            out.push(id);
        }
        Some(out)
    }

    /// Finds the cached block holding exactly `tokens` under `hash`.
    pub fn lookup(&self, hash: BlockHash, tokens: &[u32]) -> Option<BlockId> {
        let id = *self.cache.get(&hash)?;
        let (_, toks) = self.blocks[id as usize].cached.as_ref()?;
        (toks.as_slice() == tokens).then_some(id)
    }

    /// Takes a reference on cached blocks found by `lookup`.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for &id in ids {
            let b = &mut self.blocks[id as usize];
            if let Some(stamp) = b.free_stamp.take() {
                self.free.remove(&stamp);
            }
            b.ref_cnt += 1;
        }
    }

    /// Drops one reference on each block; unreferenced blocks become free
    /// (in the given order, so pass a sequence's tail first to evict it first).
    pub fn free(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_cnt > 0, "block {id} freed twice");
            b.ref_cnt = b.ref_cnt.saturating_sub(1);
            if b.ref_cnt == 0 {
                self.push_free(id);
            }
        }
    }

    /// Registers a full block under `hash` (first holder wins on duplicates).
    pub fn cache(&mut self, id: BlockId, hash: BlockHash, tokens: &[u32]) {
        let b = &mut self.blocks[id as usize];
        if b.cached.is_some() {
            return;
        }
        b.cached = Some((hash, tokens.to_vec()));
        self.cache.entry(hash).or_insert(id);
    }

    /// Drops every cached prefix (admin flush; blocks in use are untouched).
    pub fn reset_cache(&mut self) {
        self.cache.clear();
        for b in &mut self.blocks {
            b.cached = None;
        }
    }

    /// Reference count of a block (tests and assertions).
    pub fn ref_cnt(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_cnt
    }

    /// Checks the pool's internal invariants; returns the first violation.
    pub fn check(&self) -> Result<(), String> {
        let free_ids: std::collections::HashSet<BlockId> = self.free.values().copied().collect();
        if free_ids.len() != self.free.len() {
            return Err("a block is queued as free twice".into());
        }
        for (id, b) in self.blocks.iter().enumerate() {
            let queued = free_ids.contains(&(id as BlockId));
            if queued != (b.ref_cnt == 0) {
                return Err(format!(
                    "block {id}: ref_cnt {} but queued={queued}",
                    b.ref_cnt
                ));
            }
            if queued != b.free_stamp.is_some() {
                return Err(format!("block {id}: stale free stamp"));
            }
        }
        for (hash, &id) in &self.cache {
            match &self.blocks[id as usize].cached {
                Some((h, _)) if h == hash => {}
                _ => {
                    return Err(format!(
                        "cache entry {hash:?} points at block {id} holding something else"
                    ));
                }
            }
        }
        Ok(())
    }
}
