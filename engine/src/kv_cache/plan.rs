//! Sizing the KV cache from a memory budget: how many blocks it buys and,
//! for a model whose sliding-window layers keep blocks of their own
//! (`KvManager::with_sliding`), how it splits between the two groups.
//!
//! The split never leaves either group smaller than one shared table
//! would be: the sliding group gets what every running sequence's window
//! and one step's prefill need (`max_num_seqs` windows, plus the step's
//! tokens) but no more blocks than one table of the whole budget would
//! have, and the full-attention layers take the rest, which is at least
//! that many. A short sequence therefore finds room as before, and long
//! ones find more of it.

use crate::scheduler::SchedulerConfig;

/// How many blocks each group gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPlan {
    /// Blocks of the full-attention layers (every layer's without a
    /// sliding group).
    pub full_blocks: usize,
    /// The sliding group: its window and its blocks.
    pub sliding: Option<(usize, usize)>,
}

impl KvPlan {
    /// Block ids of both groups together (the storage's `num_blocks`).
    pub fn total_blocks(&self) -> usize {
        self.full_blocks + self.sliding.map_or(0, |(_, n)| n)
    }
}

/// The plan for `memory` bytes of blocks costing `layer_block` bytes per
/// layer, over `n_layer` layers of which `sliding` (window, layers) slide;
/// `max_len` is the longest sequence served. `None` when the budget buys
/// no block.
pub fn plan(
    memory: usize,
    layer_block: usize,
    n_layer: usize,
    sliding: Option<(usize, usize)>,
    sched: &SchedulerConfig,
    block_size: usize,
) -> Option<KvPlan> {
    let per_block = layer_block.max(1) * n_layer.max(1);
    let plain = memory / per_block;
    if plain == 0 {
        return None;
    }
    let single = KvPlan {
        full_blocks: plain,
        sliding: None,
    };
    let Some((window, n_sliding)) = sliding.filter(|&(w, n)| w > 0 && n > 0 && n < n_layer) else {
        return Some(single);
    };
    let bs = block_size.max(1);
    let step = sched.max_num_batched_tokens.div_ceil(bs);
    // One sequence's most: its window, the step's tokens, a partial block
    // at each end.
    let one = window.div_ceil(bs) + step + 2;
    let want = sched.max_num_seqs * (window.div_ceil(bs) + 2) + step;
    let swa = want.min(plain);
    if window >= sched.max_model_len || swa < one {
        return Some(single);
    }
    let full = (memory - swa * n_sliding * layer_block) / ((n_layer - n_sliding) * layer_block);
    Some(KvPlan {
        full_blocks: full,
        sliding: Some((window, swa)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(seqs: usize, step: usize, len: usize) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: seqs,
            max_num_batched_tokens: step,
            max_model_len: len,
            ..SchedulerConfig::default()
        }
    }

    #[test]
    fn gemma3_4b_keeps_windows_for_every_sequence_and_gives_the_rest_to_full_layers() {
        // Gemma 3 4B at f16: 34 layers (29 sliding over 1024), 64 KiB per
        // layer per block of 16, 8 GiB.
        let lb = 16 * 2 * 4 * 256 * 2;
        let p = plan(
            8 << 30,
            lb,
            34,
            Some((1024, 29)),
            &sched(16, 256, 32768),
            16,
        )
        .expect("a plan");
        let plain = (8usize << 30) / (34 * lb);
        assert_eq!(p.sliding, Some((1024, 16 * 66 + 16)));
        assert!(p.full_blocks >= 5 * plain, "{} vs {plain}", p.full_blocks);
        let bytes = p.full_blocks * 5 * lb + 1072 * 29 * lb;
        assert!(bytes <= 8 << 30);
    }

    #[test]
    fn neither_group_is_smaller_than_one_shared_table() {
        for mem in [1usize << 20, 64 << 20, 1 << 30, 16 << 30] {
            for seqs in [1, 16, 256] {
                let s = sched(seqs, 512, 8192);
                let p = plan(mem, 4096, 26, Some((512, 21)), &s, 16).expect("a plan");
                let plain = mem / (26 * 4096);
                assert!(p.full_blocks >= plain);
                if let Some((_, swa)) = p.sliding {
                    assert!(swa <= plain && swa >= 512 / 16 + 32 + 2);
                    assert!(p.full_blocks * 5 * 4096 + swa * 21 * 4096 <= mem);
                }
            }
        }
    }

    #[test]
    fn no_split_without_both_kinds_of_layer_or_past_the_context() {
        let s = sched(4, 256, 2048);
        let one = |sliding| plan(1 << 30, 4096, 8, sliding, &s, 16).expect("a plan");
        assert_eq!(one(None).sliding, None);
        assert_eq!(one(Some((512, 8))).sliding, None, "every layer slides");
        assert_eq!(
            one(Some((4096, 4))).sliding,
            None,
            "the window spans the context"
        );
        assert!(one(Some((512, 4))).sliding.is_some());
        assert_eq!(plan(100, 4096, 8, None, &s, 16), None);
    }
}
