//! BERT-family sentence embeddings (all-MiniLM-L6-v2 and its kin) from a
//! Hugging Face folder: `config.json`, `tokenizer.json`, `model.safetensors`
//! and the sentence-transformers `1_Pooling/config.json`.
//!
//! The encoder is `bert_encoder::BertEncoder` with f32 weights on the CPU
//! backend; this file owns the tokenizer and the batching. Pooling follows
//! sentence-transformers: mean over the input's tokens, then L2
//! normalisation. The shipped tokenizer pads every input to 128 and
//! truncates there; we never pad (a batch runs unpadded) and truncate at
//! the model's position limit instead.

use std::path::Path;

use tokenizers::{Tokenizer, TruncationParams};

use super::bert_encoder::{BertEncoder, Precision};
use crate::error::{EngineError, Result};

/// Inputs embedded per forward pass (bounds activation memory).
const SUB_BATCH: usize = 32;

/// A loaded embedding model.
pub struct BertEmbedder {
    model: BertEncoder,
    tokenizer: Tokenizer,
    /// Output vector length.
    pub dimensions: usize,
    /// The most tokens one input may have (longer inputs are truncated).
    pub max_tokens: usize,
}

impl std::fmt::Debug for BertEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEmbedder")
            .field("dimensions", &self.dimensions)
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

fn load_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Load(format!("{what}: {e}"))
}

impl BertEmbedder {
    /// Loads the model folder `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| load_err(&dir.join(name).display().to_string(), e))
        };
        check_pooling(&read("1_Pooling/config.json").unwrap_or_default())?;
        let model = BertEncoder::load(dir, Precision::F32)?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| load_err("tokenizer.json", e))?;
        let max_tokens = model.max_positions();
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..Default::default()
            }))
            .map_err(|e| load_err("tokenizer truncation", e))?;
        Ok(Self {
            dimensions: model.hidden(),
            model,
            tokenizer,
            max_tokens,
        })
    }

    /// Embeds `inputs`; returns one unit vector per input and the number of
    /// tokens processed (after truncation, without padding).
    pub fn embed(&self, inputs: &[String]) -> Result<(Vec<Vec<f32>>, usize)> {
        let (vecs, counts) = self.embed_each(inputs)?;
        Ok((vecs, counts.iter().sum()))
    }

    /// Like `embed`, with each input's token count.
    pub fn embed_each(&self, inputs: &[String]) -> Result<(Vec<Vec<f32>>, Vec<usize>)> {
        let mut out = Vec::with_capacity(inputs.len());
        let mut counts = Vec::with_capacity(inputs.len());
        for chunk in inputs.chunks(SUB_BATCH) {
            let (vecs, n) = self.embed_batch(chunk)?;
            out.extend(vecs);
            counts.extend(n);
        }
        Ok((out, counts))
    }

    /// Its tokenizer (unpadded, truncating at `max_tokens`), to count an
    /// input's tokens where the model is not.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Size of the tokenizer's vocabulary (token ids are below it).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Embeds pre-tokenized inputs, used as given (no special tokens are
    /// added), each truncated to `max_tokens`.
    pub fn embed_ids(&self, inputs: &[Vec<u32>]) -> Result<(Vec<Vec<f32>>, usize)> {
        let vocab = self.tokenizer.get_vocab_size(true) as u32;
        for (i, ids) in inputs.iter().enumerate() {
            if ids.is_empty() {
                return Err(EngineError::Validation {
                    field: "input",
                    message: format!("input {i} has no tokens"),
                });
            }
            if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
                return Err(EngineError::Validation {
                    field: "input",
                    message: format!("token id {bad} is outside the vocabulary (size {vocab})"),
                });
            }
        }
        let mut out = Vec::with_capacity(inputs.len());
        let mut tokens = 0;
        for chunk in inputs.chunks(SUB_BATCH) {
            let seqs: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
            out.extend(self.model.encode(&seqs)?);
            tokens += seqs
                .iter()
                .map(|s| s.len().min(self.max_tokens))
                .sum::<usize>();
        }
        Ok((out, tokens))
    }

    fn embed_batch(&self, inputs: &[String]) -> Result<(Vec<Vec<f32>>, Vec<usize>)> {
        let enc = self
            .tokenizer
            .encode_batch(inputs.to_vec(), true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let seqs: Vec<&[u32]> = enc.iter().map(|e| e.get_ids()).collect();
        let counts = seqs.iter().map(|s| s.len().min(self.max_tokens)).collect();
        Ok((self.model.encode(&seqs)?, counts))
    }
}

/// Only mean pooling is implemented; refuse models configured otherwise.
fn check_pooling(json: &str) -> Result<()> {
    if json.is_empty() {
        return Ok(());
    }
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| load_err("1_Pooling/config.json", e))?;
    if v.get("pooling_mode_mean_tokens")
        .and_then(serde_json::Value::as_bool)
        == Some(false)
    {
        return Err(EngineError::Load(
            "only mean-pooling sentence-transformers models are supported".into(),
        ));
    }
    Ok(())
}
