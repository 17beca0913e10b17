//! Models: the batched llama-family decoder, the BERT encoder for
//! embeddings, and the batch description a forward pass takes.

pub mod bert;
pub mod llama;

use std::collections::HashMap;

use candle_core::Tensor;

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

/// Per-layer keys and values of one sequence, shape `(1, n_kv_heads, len, head_dim)`.
#[derive(Debug, Clone, Default)]
pub struct SeqKv {
    pub layers: Vec<(Tensor, Tensor)>,
}

impl SeqKv {
    /// Number of positions cached.
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |(k, _)| k.dims().get(2).copied().unwrap_or(0))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The KV state of every live sequence, owned by an executor.
pub type KvStore = HashMap<RequestId, SeqKv>;
