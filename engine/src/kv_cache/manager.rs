//! `KvManager`: per-sequence block tables over the `BlockPool`, with
//! automatic prefix caching (after vLLM v1's `KVCacheManager`).
//!
//! A sequence's table maps position `p` to block `table[p / block_size]`,
//! slot `p % block_size`. Full blocks are hashed in a chain (each hash
//! covers the block's tokens and its parent's hash) and registered in the
//! pool, so a later sequence with the same prefix reuses them instead of
//! recomputing.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::block_pool::{BlockHash, BlockId, BlockPool};
use crate::request::RequestId;

/// One sequence's blocks and how many of them are registered as cached.
#[derive(Debug, Clone, Default)]
struct Table {
    blocks: Vec<BlockId>,
    /// Leading full blocks already registered in the prefix cache.
    num_cached: usize,
    /// Hash of the last registered block (the chain's parent).
    last_hash: Option<BlockHash>,
}

/// Block tables of every live sequence.
#[derive(Debug)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    tables: HashMap<RequestId, Table>,
    /// Prompt tokens looked up in / found in the prefix cache.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
}

fn chain_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = DefaultHasher::new();
    parent.map(|p| p.0).hash(&mut h);
    tokens.hash(&mut h);
    BlockHash(h.finish())
}

impl KvManager {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            pool: BlockPool::new(num_blocks),
            block_size,
            tables: HashMap::new(),
            prefix_queries: 0,
            prefix_hits: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Positions the whole pool can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.pool.num_blocks() * self.block_size
    }

    /// The blocks of `seq` (empty if unknown).
    pub fn table(&self, seq: RequestId) -> &[BlockId] {
        self.tables.get(&seq).map_or(&[], |t| t.blocks.as_slice())
    }

    /// Starts `seq` from the longest cached prefix of `tokens` (never the
    /// last token: its logits must be computed). Returns the tokens reused.
    pub fn start(&mut self, seq: RequestId, tokens: &[u32]) -> usize {
        let bs = self.block_size;
        let mut table = Table::default();
        let full = tokens.len().saturating_sub(1) / bs;
        for chunk in tokens.chunks(bs).take(full) {
            let hash = chain_hash(table.last_hash, chunk);
            let Some(id) = self.pool.lookup(hash, chunk) else {
                break;
            };
            self.pool.touch(&[id]);
            table.blocks.push(id);
            table.last_hash = Some(hash);
        }
        table.num_cached = table.blocks.len();
        let hit = table.blocks.len() * bs;
        self.prefix_queries += tokens.len() as u64;
        self.prefix_hits += hit as u64;
        self.tables.insert(seq, table);
        hit
    }

    /// The leading tokens of `tokens` whose blocks the prefix cache holds
    /// now (whole blocks, never the last token), without taking them.
    pub fn cached_prefix(&self, tokens: &[u32]) -> usize {
        let bs = self.block_size;
        let full = tokens.len().saturating_sub(1) / bs;
        let mut parent = None;
        let mut hit = 0;
        for chunk in tokens.chunks(bs).take(full) {
            let hash = chain_hash(parent, chunk);
            if self.pool.lookup(hash, chunk).is_none() {
                break;
            }
            parent = Some(hash);
            hit += bs;
        }
        hit
    }

    /// Makes room for `seq` to hold `total` positions; all or nothing.
    pub fn allocate(&mut self, seq: RequestId, total: usize) -> bool {
        let have = self.tables.get(&seq).map_or(0, |t| t.blocks.len());
        let need = total.div_ceil(self.block_size).saturating_sub(have);
        if need == 0 {
            return true;
        }
        match self.pool.allocate(need) {
            Some(new) => {
                self.tables.entry(seq).or_default().blocks.extend(new);
                true
            }
            None => false,
        }
    }

    /// Registers `seq`'s blocks that are now full of computed positions.
    pub fn cache_computed(&mut self, seq: RequestId, tokens: &[u32], num_computed: usize) {
        let bs = self.block_size;
        let Some(t) = self.tables.get_mut(&seq) else {
            return;
        };
        let full = (num_computed.min(tokens.len()) / bs).min(t.blocks.len());
        while t.num_cached < full {
            let i = t.num_cached;
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let hash = chain_hash(t.last_hash, chunk);
            self.pool.cache(t.blocks[i], hash, chunk);
            t.last_hash = Some(hash);
            t.num_cached += 1;
        }
    }

    /// Releases `seq`'s blocks (tail first, so the tail is evicted first).
    pub fn free(&mut self, seq: RequestId) {
        if let Some(t) = self.tables.remove(&seq) {
            self.pool.free(t.blocks.into_iter().rev());
        }
    }

    /// Number of sequences holding blocks.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    /// Checks pool invariants and that reference counts equal table usage.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut refs: HashMap<BlockId, u32> = HashMap::new();
        for t in self.tables.values() {
            for &b in &t.blocks {
                *refs.entry(b).or_default() += 1;
            }
        }
        for id in 0..self.pool.num_blocks() as BlockId {
            let want = refs.get(&id).copied().unwrap_or(0);
            if self.pool.ref_cnt(id) != want {
                return Err(format!(
                    "block {id}: ref_cnt {} but {want} tables use it",
                    self.pool.ref_cnt(id)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn a_shared_prefix_is_reused_and_outlives_its_first_owner() {
        let mut m = KvManager::new(16, 4);
        let a: Vec<u32> = (0..10).collect();
        assert_eq!(m.start(RequestId(1), &a), 0);
        assert!(m.allocate(RequestId(1), a.len()));
        m.cache_computed(RequestId(1), &a, a.len());
        m.free(RequestId(1));
        // 10 tokens = 2 full blocks + 2; the second request reuses 8 tokens.
        let mut b = a.clone();
        b.extend([99, 98, 97]);
        assert_eq!(m.start(RequestId(2), &b), 8);
        assert!(m.allocate(RequestId(2), b.len()));
        assert_eq!(m.table(RequestId(2)).len(), 4);
        // A different prefix hits nothing.
        assert_eq!(m.start(RequestId(3), &[5, 5, 5, 5, 5, 5]), 0);
        m.check().expect("invariants");
    }

    #[test]
    fn the_last_token_is_never_served_from_cache() {
        let mut m = KvManager::new(8, 4);
        let a: Vec<u32> = (0..8).collect();
        m.start(RequestId(1), &a);
        assert!(m.allocate(RequestId(1), 8));
        m.cache_computed(RequestId(1), &a, 8);
        m.free(RequestId(1));
        assert_eq!(
            m.start(RequestId(2), &a),
            4,
            "the second block holds the last token"
        );
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut m = KvManager::new(3, 4);
        m.start(RequestId(1), &[1]);
        assert!(!m.allocate(RequestId(1), 13));
        assert_eq!(m.pool().num_free(), 3);
        assert!(m.allocate(RequestId(1), 12));
        assert_eq!(m.pool().num_free(), 0);
        m.check().expect("invariants");
    }

    #[test]
    fn random_operations_keep_refcounts_balanced_and_free_everything() {
        for seed in 0..30u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut m = KvManager::new(rng.random_range(4..40), rng.random_range(1..6));
            let mut live: Vec<(RequestId, Vec<u32>)> = Vec::new();
            for step in 0..600u64 {
                match rng.random_range(0..4) {
                    0 => {
                        // Few distinct prefixes, so hits are common.
                        let base = rng.random_range(0..3u32);
                        let len = rng.random_range(1..30);
                        let toks: Vec<u32> = (0..len)
                            .map(|i| {
                                if i < 12 {
                                    base * 100 + i
                                } else {
                                    rng.random_range(0..5)
                                }
                            })
                            .collect();
                        let id = RequestId(step);
                        let hit = m.start(id, &toks);
                        assert!(hit < toks.len() && hit.is_multiple_of(m.block_size()));
                        if m.allocate(id, toks.len()) {
                            m.cache_computed(id, &toks, toks.len());
                            live.push((id, toks));
                        } else {
                            m.free(id);
                        }
                    }
                    1 if !live.is_empty() => {
                        let (id, _) = live.swap_remove(rng.random_range(0..live.len()));
                        m.free(id);
                    }
                    _ if !live.is_empty() => {
                        let i = rng.random_range(0..live.len());
                        let (id, toks) = &mut live[i];
                        toks.push(rng.random_range(0..5));
                        if m.allocate(*id, toks.len()) {
                            m.cache_computed(*id, toks, toks.len());
                        } else {
                            toks.pop();
                        }
                    }
                    _ => {}
                }
                m.check()
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
                let mut seen = std::collections::HashSet::new();
                for (id, _) in &live {
                    for &b in m.table(*id) {
                        // Only cached (shared, read-only) blocks may appear twice.
                        if !seen.insert(b) {
                            assert!(m.pool().ref_cnt(b) > 1);
                        }
                    }
                }
            }
            for (id, _) in live.drain(..) {
                m.free(id);
            }
            assert_eq!(
                m.pool().num_free(),
                m.pool().num_blocks(),
                "seed {seed}: blocks leaked"
            );
            assert_eq!(m.num_tables(), 0);
        }
    }
}
