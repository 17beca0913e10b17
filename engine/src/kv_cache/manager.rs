//! `KvManager`: per-sequence block tables over the `BlockPool`, with
//! automatic prefix caching (after vLLM v1's `KVCacheManager`), and an
//! optional second group of blocks for sliding-window layers (after vLLM's
//! hybrid KV cache manager and llama.cpp's `kv_cache_iswa`).
//!
//! A sequence's table maps position `p` to block `table[p / block_size]`,
//! slot `p % block_size`. Full blocks are hashed in a chain (each hash
//! covers the block's tokens and its parent's hash) and registered in the
//! pool, so a later sequence with the same prefix reuses them instead of
//! recomputing.
//!
//! With a sliding group (`Sliding`), a sequence holds two tables: the full
//! one, read by full-attention layers, and one for the sliding-window
//! layers, drawn from a pool of its own whose ids follow the full pool's
//! (`Sliding::offset`, so one `KvStorage` holds both). Before each chunk
//! (`slide`) the sliding blocks wholly behind the window of the chunk's
//! first position are released and marked `HOLE`: a sliding layer keeps
//! about `window / block_size + 1` blocks however long the sequence grows.
//! Sliding blocks are registered in their pool's prefix cache under the
//! same chain hashes, and a prefix hit counts only as far as the sliding
//! blocks of the window before it are cached too.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::block_pool::{BlockHash, BlockId, BlockPool};
use crate::request::RequestId;

/// A sliding-window table's entry for a block released behind the window
/// (never read: attention starts at the window).
pub const HOLE: BlockId = BlockId::MAX;

/// The blocks of the sliding-window layers.
#[derive(Debug)]
struct Sliding {
    window: usize,
    pool: BlockPool,
    /// Added to this pool's ids in the tables (the full pool's size).
    offset: BlockId,
}

impl Sliding {
    /// Drops one reference on each (global, non-hole) id, in order.
    fn free(&mut self, ids: impl Iterator<Item = BlockId>) {
        let offset = self.offset;
        self.pool
            .free(ids.filter(|&b| b != HOLE).map(|b| b - offset));
    }
}

/// One sequence's blocks and how many of them are registered as cached.
#[derive(Debug, Clone, Default)]
struct Table {
    blocks: Vec<BlockId>,
    /// The sliding-window layers' blocks (as long as `blocks`, `HOLE`
    /// behind the window); empty without a sliding group.
    swa: Vec<BlockId>,
    /// Leading full blocks already registered in the prefix cache.
    num_cached: usize,
    /// Hash of the last registered block (the chain's parent).
    last_hash: Option<BlockHash>,
}

/// What the prefix cache holds for a prompt: the full pool's blocks of
/// its longest usable cached prefix, and the sliding ones (`None` behind
/// the window).
struct Hit {
    hashes: Vec<BlockHash>,
    full: Vec<BlockId>,
    swa: Vec<Option<BlockId>>,
}

/// Block tables of every live sequence.
#[derive(Debug)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    tables: HashMap<RequestId, Table>,
    sliding: Option<Sliding>,
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
            sliding: None,
            prefix_queries: 0,
            prefix_hits: 0,
        }
    }

    /// Adds a group of `num_blocks` blocks for the sliding-window layers
    /// (a window of `window` positions), numbered after the full pool's.
    pub fn with_sliding(mut self, window: usize, num_blocks: usize) -> Self {
        self.sliding = Some(Sliding {
            window: window.max(1),
            pool: BlockPool::new(num_blocks),
            offset: self.pool.num_blocks() as BlockId,
        });
        self
    }

    /// The sliding group's window, if the sliding layers keep their own.
    pub fn window(&self) -> Option<usize> {
        self.sliding.as_ref().map(|s| s.window)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The full-attention layers' pool (every layer's without a sliding group).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The sliding-window layers' pool, if they have their own.
    pub fn sliding_pool(&self) -> Option<&BlockPool> {
        self.sliding.as_ref().map(|s| &s.pool)
    }

    /// Fraction of blocks in use, of the fuller group.
    pub fn usage(&self) -> f64 {
        let swa = self.sliding_pool().map_or(0.0, BlockPool::usage);
        self.pool.usage().max(swa)
    }

    /// Block ids both groups use together (the storage's size).
    pub fn num_block_ids(&self) -> usize {
        self.pool.num_blocks() + self.sliding_pool().map_or(0, BlockPool::num_blocks)
    }

    /// Positions the whole pool can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.pool.num_blocks() * self.block_size
    }

    /// The blocks of `seq` (empty if unknown).
    pub fn table(&self, seq: RequestId) -> &[BlockId] {
        self.tables.get(&seq).map_or(&[], |t| t.blocks.as_slice())
    }

    /// The sliding-window layers' blocks of `seq` (`HOLE` behind the
    /// window); empty without a sliding group.
    pub fn swa_table(&self, seq: RequestId) -> &[BlockId] {
        self.tables.get(&seq).map_or(&[], |t| t.swa.as_slice())
    }

    /// The longest cached prefix of `tokens` usable as a start (never the
    /// last token; with a sliding group, only as far as the sliding blocks
    /// of the window before its end are cached too, and those from
    /// position `keep` on).
    fn hit(&self, tokens: &[u32], keep: usize) -> Hit {
        let bs = self.block_size;
        let full_blocks = tokens.len().saturating_sub(1) / bs;
        let mut hit = Hit {
            hashes: Vec::new(),
            full: Vec::new(),
            swa: Vec::new(),
        };
        for chunk in tokens.chunks(bs).take(full_blocks) {
            let hash = chain_hash(hit.hashes.last().copied(), chunk);
            let Some(id) = self.pool.lookup(hash, chunk) else {
                break;
            };
            hit.hashes.push(hash);
            hit.full.push(id);
        }
        let Some(s) = &self.sliding else {
            return hit;
        };
        let found: Vec<Option<BlockId>> = (hit.hashes.iter().zip(tokens.chunks(bs)))
            .map(|(&h, chunk)| s.pool.lookup(h, chunk))
            .collect();
        // The longest prefix whose next position's window is all cached.
        let lo = |k: usize| ((k * bs + 1).saturating_sub(s.window) / bs).min(keep / bs);
        let mut k = hit.full.len();
        while k > 0 && !found[lo(k)..k].iter().all(Option::is_some) {
            k -= 1;
        }
        let lo = lo(k);
        hit.hashes.truncate(k);
        hit.full.truncate(k);
        hit.swa = (0..k).map(|i| found[i].filter(|_| i >= lo)).collect();
        hit
    }

    /// Starts `seq` from the longest cached prefix of `tokens` (never the
    /// last token: its logits must be computed). Returns the tokens reused.
    pub fn start(&mut self, seq: RequestId, tokens: &[u32]) -> usize {
        self.start_keeping(seq, tokens, usize::MAX)
    }

    /// `start`, where the sliding layers' rows from position `keep` on
    /// will be read (exported): a cached prefix counts only as far as
    /// their blocks are cached too.
    pub fn start_keeping(&mut self, seq: RequestId, tokens: &[u32], keep: usize) -> usize {
        let hit = self.hit(tokens, keep);
        self.pool.touch(&hit.full);
        let mut table = Table {
            num_cached: hit.full.len(),
            last_hash: hit.hashes.last().copied(),
            ..Table::default()
        };
        if let Some(s) = &mut self.sliding {
            let held: Vec<BlockId> = hit.swa.iter().flatten().copied().collect();
            s.pool.touch(&held);
            table.swa = (hit.swa.iter())
                .map(|b| b.map_or(HOLE, |b| b + s.offset))
                .collect();
        }
        table.blocks = hit.full;
        let reused = table.blocks.len() * self.block_size;
        self.prefix_queries += tokens.len() as u64;
        self.prefix_hits += reused as u64;
        self.tables.insert(seq, table);
        reused
    }

    /// The leading tokens of `tokens` whose blocks the prefix cache holds
    /// now (whole blocks, never the last token), without taking them.
    pub fn cached_prefix(&self, tokens: &[u32]) -> usize {
        self.hit(tokens, usize::MAX).full.len() * self.block_size
    }

    /// Makes room for `seq` to hold `total` positions; all or nothing.
    pub fn allocate(&mut self, seq: RequestId, total: usize) -> bool {
        let have = self.tables.get(&seq).map_or(0, |t| t.blocks.len());
        let need = total.div_ceil(self.block_size).saturating_sub(have);
        if need == 0 {
            return true;
        }
        let swa_free = self.sliding_pool().map_or(usize::MAX, BlockPool::num_free);
        if need > self.pool.num_free() || need > swa_free {
            return false;
        }
        // Both pools have the room (checked above): neither allocation fails.
        let full = self.pool.allocate(need).unwrap_or_default();
        let swa =
            (self.sliding.as_mut()).map(|s| (s.offset, s.pool.allocate(need).unwrap_or_default()));
        let table = self.tables.entry(seq).or_default();
        table.blocks.extend(full);
        if let Some((offset, swa)) = swa {
            table.swa.extend(swa.into_iter().map(|b| b + offset));
        }
        true
    }

    /// Whether `seq` could hold `total` positions if every block it does
    /// not hold were free (a request that never could must not wait).
    pub fn could_hold(&self, seq: RequestId, total: usize) -> bool {
        let (full, swa) = self.held(seq);
        let need = total.div_ceil(self.block_size);
        let have = self.table(seq).len();
        let new = need.saturating_sub(have);
        new <= self.pool.num_blocks() - full
            && self
                .sliding_pool()
                .is_none_or(|p| new <= p.num_blocks() - swa)
    }

    /// Before a chunk of `seq` that starts at position `first`: releases
    /// its sliding blocks wholly behind `first`'s window (no later position
    /// reads them), oldest first.
    pub fn slide(&mut self, seq: RequestId, first: usize) {
        let (Some(s), Some(t)) = (&mut self.sliding, self.tables.get_mut(&seq)) else {
            return;
        };
        let behind = ((first + 1).saturating_sub(s.window) / self.block_size).min(t.swa.len());
        let released: Vec<BlockId> = t.swa[..behind]
            .iter_mut()
            .map(|b| std::mem::replace(b, HOLE))
            .collect();
        s.free(released.into_iter());
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
            if let Some(s) = &mut self.sliding
                && let Some(&b) = t.swa.get(i).filter(|&&b| b != HOLE)
            {
                s.pool.cache(b - s.offset, hash, chunk);
            }
            t.last_hash = Some(hash);
            t.num_cached += 1;
        }
    }

    /// Releases `seq`'s blocks (tail first, so the tail is evicted first).
    /// Forgets every cached prefix (their KV is gone from the executor);
    /// blocks in use are untouched.
    pub fn reset_cache(&mut self) {
        self.pool.reset_cache();
        if let Some(s) = self.sliding.as_mut() {
            s.pool.reset_cache();
        }
    }

    pub fn free(&mut self, seq: RequestId) {
        if let Some(t) = self.tables.remove(&seq) {
            self.pool.free(t.blocks.into_iter().rev());
            if let Some(s) = &mut self.sliding {
                s.free(t.swa.into_iter().rev());
            }
        }
    }

    /// Blocks `seq` holds now: (full, sliding).
    pub fn held(&self, seq: RequestId) -> (usize, usize) {
        self.tables.get(&seq).map_or((0, 0), |t| {
            (t.blocks.len(), t.swa.iter().filter(|&&b| b != HOLE).count())
        })
    }

    /// Number of sequences holding blocks.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    /// Checks pool invariants and that reference counts equal table usage.
    pub fn check(&self) -> Result<(), String> {
        let full = self.tables.values().flat_map(|t| t.blocks.iter().copied());
        check_refs(&self.pool, full, 0)?;
        if let Some(s) = &self.sliding {
            let swa = self.tables.values().flat_map(|t| t.swa.iter().copied());
            check_refs(&s.pool, swa.filter(|&b| b != HOLE), s.offset)?;
            if let Some(t) = self.tables.values().find(|t| t.swa.len() != t.blocks.len()) {
                return Err(format!(
                    "{} sliding blocks beside {} full ones",
                    t.swa.len(),
                    t.blocks.len()
                ));
            }
        }
        Ok(())
    }
}

/// Checks `pool`'s invariants and that each block's reference count is
/// the number of times `used` (ids less `offset`) names it.
fn check_refs(
    pool: &BlockPool,
    used: impl Iterator<Item = BlockId>,
    offset: BlockId,
) -> Result<(), String> {
    pool.check()?;
    let mut refs: HashMap<BlockId, u32> = HashMap::new();
    for b in used {
        let local = b
            .checked_sub(offset)
            .filter(|&l| (l as usize) < pool.num_blocks())
            .ok_or_else(|| format!("block {b} is outside its pool"))?;
        *refs.entry(local).or_default() += 1;
    }
    for id in 0..pool.num_blocks() as BlockId {
        let want = refs.get(&id).copied().unwrap_or(0);
        if pool.ref_cnt(id) != want {
            return Err(format!(
                "block {}: ref_cnt {} but {want} tables use it",
                id + offset,
                pool.ref_cnt(id)
            ));
        }
    }
    Ok(())
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
    fn a_sliding_layer_keeps_only_the_window_s_blocks() {
        // Window 10, blocks of 4: position p reads p - 9..=p.
        let mut m = KvManager::new(64, 4).with_sliding(10, 8);
        let id = RequestId(1);
        m.start(id, &[1]);
        for pos in 0..200 {
            m.slide(id, pos);
            assert!(m.allocate(id, pos + 1), "position {pos}");
            let swa = m.swa_table(id);
            let first = (pos + 1).saturating_sub(10);
            // Every block the window touches is held, none wholly before it.
            for (b, &id) in swa.iter().enumerate() {
                let behind = (b + 1) * 4 <= first;
                assert_eq!(id == HOLE, behind, "position {pos}, block {b}");
            }
            assert!(m.held(id).1 <= 10 / 4 + 2);
            m.check().expect("invariants");
        }
        assert_eq!(m.held(id), (50, 3));
        assert_eq!(m.table(id).len(), 50, "full layers keep every block");
        m.free(id);
        assert_eq!(m.sliding_pool().map(BlockPool::num_free), Some(8));
        m.check().expect("invariants");
    }

    #[test]
    fn a_prefix_hit_needs_the_window_s_sliding_blocks_cached() {
        let mut m = KvManager::new(64, 4).with_sliding(6, 16);
        let a: Vec<u32> = (0..30).collect();
        let id = RequestId(1);
        m.start(id, &a);
        // Prefill in chunks of 8, sliding between them, as the scheduler does.
        for start in (0..30).step_by(8) {
            m.slide(id, start);
            assert!(m.allocate(id, (start + 8).min(30)));
            m.cache_computed(id, &a, (start + 8).min(30));
        }
        m.free(id);
        // Every block stays cached in both pools: the whole prefix (7
        // blocks, 28 tokens) is usable, its window (blocks 5 and 6) held.
        let mut b = a.clone();
        b.push(77);
        assert_eq!(m.cached_prefix(&b), 28);
        assert_eq!(m.start(RequestId(2), &b), 28);
        let swa = m.swa_table(RequestId(2)).to_vec();
        assert_eq!(swa.iter().filter(|&&x| x != HOLE).count(), 2);
        assert!(swa[..5].iter().all(|&x| x == HOLE));
        m.free(RequestId(2));
        m.check().expect("invariants");
        // Evict the sliding pool's cached blocks: only the full pool still
        // holds the prefix, and a hit without its window is no hit.
        let other: Vec<u32> = (1000..1064).collect();
        m.start(RequestId(3), &other);
        assert!(m.allocate(RequestId(3), 64));
        assert_eq!(m.cached_prefix(&b), 0);
        m.free(RequestId(3));
        m.check().expect("invariants");
    }

    #[test]
    fn random_operations_keep_refcounts_balanced_and_free_everything() {
        for seed in 0..60u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut m = KvManager::new(rng.random_range(4..40), rng.random_range(1..6));
            // Half the seeds also keep a sliding group of their own size.
            if seed % 2 == 1 {
                m = m.with_sliding(rng.random_range(1..12), rng.random_range(2..30));
            }
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
                        m.slide(*id, toks.len() - 1);
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
            if let Some(p) = m.sliding_pool() {
                assert_eq!(p.num_free(), p.num_blocks(), "seed {seed}: sliding leaked");
            }
            assert_eq!(m.num_tables(), 0);
        }
    }
}
