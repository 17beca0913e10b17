//! BERT-family sentence embeddings (all-MiniLM-L6-v2 and its kin) from a
//! Hugging Face folder: `config.json`, `tokenizer.json`, `model.safetensors`
//! and the sentence-transformers `1_Pooling/config.json`.
//!
//! Pooling follows sentence-transformers: mean over real (unpadded) tokens,
//! then L2 normalisation. The shipped tokenizer pads every input to 128 and
//! truncates there; we pad to the longest input of the batch and truncate at
//! the model's position limit instead.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use crate::error::{EngineError, Result};

/// Inputs embedded per forward pass (bounds activation memory).
const SUB_BATCH: usize = 32;

/// A loaded embedding model.
pub struct BertEmbedder {
    model: BertModel,
    tokenizer: Tokenizer,
    /// Output vector length.
    pub dimensions: usize,
    /// The most tokens one input may have (longer inputs are truncated).
    pub max_tokens: usize,
    device: Device,
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
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| load_err(&dir.join(name).display().to_string(), e))
        };
        let config: Config =
            serde_json::from_str(&read("config.json")?).map_err(|e| load_err("config.json", e))?;
        check_pooling(&read("1_Pooling/config.json").unwrap_or_default())?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| load_err("tokenizer.json", e))?;
        let max_tokens = config.max_position_embeddings;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..Default::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..Default::default()
            }))
            .map_err(|e| load_err("tokenizer truncation", e))?;
        let weights = dir.join("model.safetensors");
        // Read, not memory-mapped: the crate forbids unsafe code.
        let vb = VarBuilder::from_buffered_safetensors(
            std::fs::read(&weights).map_err(|e| load_err(&weights.display().to_string(), e))?,
            DType::F32,
            device,
        )
        .map_err(|e| load_err("model.safetensors", e))?;
        let model = BertModel::load(vb, &config).map_err(|e| load_err("BERT weights", e))?;
        Ok(Self {
            model,
            tokenizer,
            dimensions: config.hidden_size,
            max_tokens,
            device: device.clone(),
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
            let len = chunk
                .iter()
                .map(|c| c.len().min(self.max_tokens))
                .max()
                .unwrap_or(0);
            let (mut ids, mut mask) = (Vec::new(), Vec::new());
            for c in chunk {
                let n = c.len().min(self.max_tokens);
                ids.extend_from_slice(&c[..n]);
                ids.extend(std::iter::repeat_n(0, len - n));
                mask.extend((0..len).map(|j| u32::from(j < n)));
            }
            let types = vec![0; ids.len()];
            let (vecs, n) = self.pool(ids, types, mask, (chunk.len(), len))?;
            out.extend(vecs);
            tokens += n.iter().sum::<usize>();
        }
        Ok((out, tokens))
    }

    fn embed_batch(&self, inputs: &[String]) -> Result<(Vec<Vec<f32>>, Vec<usize>)> {
        let enc = self
            .tokenizer
            .encode_batch(inputs.to_vec(), true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let rows = enc.len();
        let len = enc.first().map_or(0, |e| e.len());
        let flat = |f: &dyn Fn(&tokenizers::Encoding) -> &[u32]| -> Vec<u32> {
            enc.iter().flat_map(|e| f(e).iter().copied()).collect()
        };
        let ids = flat(&|e| e.get_ids());
        let types = flat(&|e| e.get_type_ids());
        let mask = flat(&|e| e.get_attention_mask());
        self.pool(ids, types, mask, (rows, len))
    }

    /// The encoder over padded `(rows, len)` ids, mean-pooled over the mask
    /// and L2-normalized; also each row's number of real (unmasked) tokens.
    fn pool(
        &self,
        ids: Vec<u32>,
        types: Vec<u32>,
        mask: Vec<u32>,
        (rows, len): (usize, usize),
    ) -> Result<(Vec<Vec<f32>>, Vec<usize>)> {
        let tokens: Vec<usize> = mask
            .chunks(len.max(1))
            .map(|row| row.iter().filter(|&&m| m == 1).count())
            .collect();
        let ids = Tensor::from_vec(ids, (rows, len), &self.device)?;
        let types = Tensor::from_vec(types, (rows, len), &self.device)?;
        let mask = Tensor::from_vec(mask, (rows, len), &self.device)?;
        let hidden = self.model.forward(&ids, &types, Some(&mask))?; // (rows, len, dim)
        let maskf = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&maskf)?.sum(1)?;
        let counts = maskf.sum(1)?.clamp(1e-9, f64::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        let unit = mean.broadcast_div(&norm)?;
        Ok((unit.to_vec2::<f32>()?, tokens))
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
