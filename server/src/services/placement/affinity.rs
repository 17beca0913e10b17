//! Which prompt prefixes each executor ran lately, as chained block
//! hashes: what its prefix cache likely holds, so placement can credit an
//! executor for the prompt tokens it will not compute again.

/// Tokens per block of prompt-prefix hashes (affinity granularity).
pub const AFFINITY_BLOCK: usize = 16;
/// Prefix blocks remembered per executor.
const AFFINITY_BLOCKS: usize = 16_384;

/// The chained hashes of the whole `AFFINITY_BLOCK`-token blocks of
/// `prompt`: block `i`'s hash covers every token before its end, so equal
/// hashes mean equal prefixes.
pub fn prefix_hashes(prompt: &[u32]) -> Vec<u64> {
    use std::hash::{Hash, Hasher};
    let mut out = Vec::with_capacity(prompt.len() / AFFINITY_BLOCK);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for block in prompt.chunks_exact(AFFINITY_BLOCK) {
        block.hash(&mut h);
        out.push(h.finish());
    }
    out
}

/// Which prompt prefixes each executor ran lately (what its prefix cache
/// likely holds): bounded, oldest forgotten first.
#[derive(Debug, Default)]
pub struct Affinity {
    executors: std::collections::HashMap<String, Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    set: std::collections::HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

impl Affinity {
    /// `key` ran a prompt with these prefix hashes.
    pub fn record(&mut self, key: &str, hashes: &[u64]) {
        let seen = self.executors.entry(key.to_string()).or_default();
        for &h in hashes {
            if seen.set.insert(h) {
                seen.order.push_back(h);
            }
        }
        while seen.order.len() > AFFINITY_BLOCKS {
            if let Some(old) = seen.order.pop_front() {
                seen.set.remove(&old);
            }
        }
    }

    /// Prompt tokens `key` likely has cached: the longest run of leading
    /// blocks it ran before.
    pub fn cached_tokens(&self, key: &str, hashes: &[u64]) -> usize {
        let Some(seen) = self.executors.get(key) else {
            return 0;
        };
        hashes.iter().take_while(|h| seen.set.contains(h)).count() * AFFINITY_BLOCK
    }

    /// Forgets an executor (it left).
    pub fn forget(&mut self, key: &str) {
        self.executors.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_credits_the_longest_remembered_prefix_and_forgets_the_oldest() {
        let prompt: Vec<u32> = (0..100).collect();
        let h = prefix_hashes(&prompt);
        assert_eq!(h.len(), 6, "whole blocks only");
        let mut a = Affinity::default();
        assert_eq!(a.cached_tokens("x", &h), 0);
        a.record("x", &h[..3]);
        assert_eq!(a.cached_tokens("x", &h), 48);
        // Another prompt sharing the first block only.
        let mut other = prompt.clone();
        other[20] = 999;
        assert_eq!(a.cached_tokens("x", &prefix_hashes(&other)), 16);
        // Bounded: old blocks go first.
        for i in 0..AFFINITY_BLOCKS as u32 {
            a.record("x", &prefix_hashes(&[i + 1_000; AFFINITY_BLOCK]));
        }
        assert_eq!(a.cached_tokens("x", &h), 0);
        a.forget("x");
        assert!(a.executors.is_empty());
    }
}
