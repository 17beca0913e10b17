//! `BlockPool`: the fixed set of KV blocks, their reference counts, and the
//! prefix cache over them (after vLLM v1's `BlockPool`).
//!
//! A block is either in use (`ref_cnt > 0`) or free. Free blocks that hold
//! nothing reusable wait on a stack and are handed out first, most recently
//! used first (warm memory, and the cache is kept as long as possible);
//! free blocks that still hold a full, hashed prefix wait in an LRU queue,
//! stay findable by their hash, and are evicted oldest first only when no
//! empty block is left. Cached blocks also keep their tokens, so a hash
//! collision can never serve another prefix's keys and values.

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
    /// Free blocks holding nothing reusable; the top is handed out first.
    empty: Vec<BlockId>,
    /// Free blocks holding a cached prefix, oldest release first.
    free: BTreeMap<u64, BlockId>,
    next_stamp: u64,
    cache: HashMap<BlockHash, BlockId>,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> Self {
        Self {
            blocks: vec![Block::default(); num_blocks],
            empty: (0..num_blocks as BlockId).rev().collect(),
            free: BTreeMap::new(),
            next_stamp: 0,
            cache: HashMap::new(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn num_free(&self) -> usize {
        self.empty.len() + self.free.len()
    }

    /// Fraction of blocks in use.
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.num_free() as f64 / self.blocks.len() as f64
    }

    /// Queues a block that just became free.
    fn push_free(&mut self, id: BlockId) {
        if self.blocks[id as usize].cached.is_none() {
            self.empty.push(id);
            return;
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.free.insert(stamp, id);
        self.blocks[id as usize].free_stamp = Some(stamp);
    }

    /// Takes `n` blocks (all or none): empty ones first, then the least
    /// recently used cached ones, whose prefixes are evicted.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = match self.empty.pop() {
                Some(id) => id,
                None => self.free.pop_first()?.1,
            };
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
        let evicted: Vec<BlockId> = std::mem::take(&mut self.free).into_values().collect();
        for id in evicted {
            self.blocks[id as usize].free_stamp = None;
            self.empty.push(id);
        }
    }

    /// Reference count of a block (tests and assertions).
    pub fn ref_cnt(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_cnt
    }

    /// Checks the pool's internal invariants; returns the first violation.
    pub fn check(&self) -> Result<(), String> {
        let mut queued = vec![0u32; self.blocks.len()];
        for &id in self.empty.iter().chain(self.free.values()) {
            queued[id as usize] += 1;
        }
        for (id, b) in self.blocks.iter().enumerate() {
            let q = queued[id];
            if q > 1 {
                return Err(format!("block {id} is queued as free {q} times"));
            }
            if (q == 1) != (b.ref_cnt == 0) {
                return Err(format!("block {id}: ref_cnt {} but queued={q}", b.ref_cnt));
            }
            if b.free_stamp.is_some() != (q == 1 && b.cached.is_some()) {
                return Err(format!("block {id}: stale LRU stamp"));
            }
        }
        if let Some(&id) = self
            .empty
            .iter()
            .find(|&&id| self.blocks[id as usize].cached.is_some())
        {
            return Err(format!(
                "block {id} holds a cached prefix but sits with the empty blocks"
            ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_blocks_are_reused_before_cached_prefixes_are_evicted() {
        let mut p = BlockPool::new(4);
        let a = p.allocate(2).expect("room");
        assert_eq!(a, [0, 1], "fresh blocks come in id order");
        p.cache(0, BlockHash(7), &[1, 2]);
        p.free(a.iter().rev().copied());
        // Block 1 held nothing: it is handed out again first (warm memory).
        assert_eq!(p.allocate(1), Some(vec![1]));
        assert_eq!(p.lookup(BlockHash(7), &[1, 2]), Some(0));
        assert_eq!(p.allocate(2), Some(vec![2, 3]));
        // Only now is the cached prefix evicted.
        assert_eq!(p.allocate(1), Some(vec![0]));
        assert_eq!(p.lookup(BlockHash(7), &[1, 2]), None);
        assert_eq!(p.allocate(1), None);
        p.check().expect("invariants");
    }

    #[test]
    fn a_hash_match_with_other_tokens_is_not_a_hit() {
        let mut p = BlockPool::new(2);
        let a = p.allocate(1).expect("room");
        p.cache(a[0], BlockHash(3), &[9, 9]);
        assert_eq!(p.lookup(BlockHash(3), &[9, 8]), None);
        p.reset_cache();
        assert_eq!(p.lookup(BlockHash(3), &[9, 9]), None);
        p.free(a);
        p.check().expect("invariants");
    }
}
