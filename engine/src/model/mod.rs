//! Models: the batched llama-family decoder, the BERT encoder for
//! embeddings, and the batch description a forward pass takes.

pub mod bert;
pub mod bert_encoder;
pub mod config;
pub mod llama;
pub mod moe;
mod proj;
pub mod rope;
pub mod weights;

use crate::kv_cache::BlockId;
use crate::request::RequestId;

/// One sequence's share of a step: `tokens` at positions
/// `start_pos..start_pos + tokens.len()` (a prefill chunk or one decode token).
#[derive(Debug, Clone)]
pub struct SeqChunk {
    pub seq: RequestId,
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    /// Whether the step needs this sequence's next-token logits (only for
    /// the chunk that ends its prompt, and for decode tokens).
    pub want_logits: bool,
    /// The sequence's KV blocks, covering at least `start_pos + tokens.len()`.
    pub block_table: Vec<BlockId>,
    /// The sliding-window layers' blocks where they have their own
    /// (`KvManager::with_sliding`; `HOLE` behind the window), else empty:
    /// every layer reads `block_table`.
    pub swa_table: Vec<BlockId>,
    /// Speculative tokens at the end of `tokens` (prompt-lookup drafts): the
    /// chunk then wants logits for its last `draft.len() + 1` positions.
    pub draft: Vec<u32>,
}

impl SeqChunk {
    /// The block table a layer with attention window `window` (0: none)
    /// reads.
    pub fn table_for(&self, window: usize) -> &[BlockId] {
        if window > 0 && !self.swa_table.is_empty() {
            &self.swa_table
        } else {
            &self.block_table
        }
    }

    /// Logits rows this chunk produces.
    pub fn num_logits(&self) -> usize {
        if self.want_logits {
            self.draft.len() + 1
        } else {
            0
        }
    }
}

/// Everything one forward pass runs: chunks of many sequences together.
#[derive(Debug, Clone, Default)]
pub struct ModelBatch {
    pub chunks: Vec<SeqChunk>,
}

impl ModelBatch {
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// Largest absolute difference of two equal-length slices (test helper).
#[cfg(test)]
pub(crate) fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
