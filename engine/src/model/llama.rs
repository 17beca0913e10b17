//! Batched llama-family decoder over GGUF weights (Llama, Mistral, SmolLM2,
//! Qwen2 shapes), in plain Rust on top of `kernels`.
//!
//! One forward pass takes the chunks of many sequences, each at its own
//! position, as one `[tokens, hidden]` matrix: every weight matrix is read
//! once per step for the whole batch (the point of continuous batching),
//! through the quantized SIMD matmul. Keys and values go to the paged
//! `KvStorage` at the slots the sequence's block table names, and attention
//! reads them from there, block by block.
//! RoPE follows llama.cpp: GGUF llama weights store Q/K rows for the
//! interleaved layout (pairs `2i, 2i+1`); Qwen2 uses NeoX halves.

use std::io::{Read, Seek};

use candle_core::Device;
use candle_core::quantized::gguf_file::Content;

use super::attention::{AttnShape, paged_attention};
use super::ops::{add_in_place, rms_norm, swiglu};
use super::weights::{Linear, MultiLinear, vector};
use super::{ModelBatch, SeqChunk};
use crate::error::{EngineError, Result};
use crate::kv_cache::{KvLayout, KvStorage};
use crate::tokenizer::gguf::Meta;

/// Architecture hyper-parameters read from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub architecture: String,
    pub n_layer: usize,
    pub hidden: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_neox: bool,
    pub context_length: usize,
    pub vocab_size: usize,
}

impl LlamaConfig {
    /// Reads the `{arch}.*` keys llama.cpp writes.
    pub fn from_gguf(ct: &Content) -> Result<Self> {
        let meta = Meta(&ct.metadata);
        let arch = meta.string("general.architecture")?.to_string();
        let rope_neox = match arch.as_str() {
            "llama" | "mistral" => false,
            "qwen2" => true,
            other => {
                return Err(EngineError::Load(format!(
                    "architecture `{other}` is not supported (llama, mistral, qwen2)"
                )));
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let n_head = meta.u32(&key("attention.head_count"))? as usize;
        let hidden = meta.u32(&key("embedding_length"))? as usize;
        let vocab_size = ct
            .tensor_infos
            .get("token_embd.weight")
            .map(|t| t.shape.dims()[0])
            .ok_or_else(|| EngineError::Load("GGUF has no token_embd.weight".into()))?;
        let config = Self {
            n_layer: meta.u32(&key("block_count"))? as usize,
            hidden,
            n_head,
            n_kv_head: meta
                .u32(&key("attention.head_count_kv"))
                .map_or(n_head, |v| v as usize),
            head_dim: hidden / n_head.max(1),
            rms_eps: meta
                .f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            rope_theta: meta.f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rope_neox,
            context_length: meta
                .u32(&key("context_length"))
                .map_or(2048, |v| v as usize),
            vocab_size,
            architecture: arch,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<()> {
        let ok = self.n_head > 0
            && self.n_kv_head > 0
            && self.n_head.is_multiple_of(self.n_kv_head)
            && self.head_dim.is_multiple_of(2)
            && self.head_dim * self.n_head == self.hidden;
        if ok {
            Ok(())
        } else {
            Err(EngineError::Load(format!(
                "inconsistent attention shape: {self:?}"
            )))
        }
    }

    /// The KV layout for `num_blocks` blocks of `block_size` positions.
    pub fn kv_layout(&self, block_size: usize, num_blocks: usize) -> KvLayout {
        KvLayout {
            n_layer: self.n_layer,
            n_kv_head: self.n_kv_head,
            head_dim: self.head_dim,
            block_size,
            num_blocks,
        }
    }
}

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V projections (stacked when their formats allow).
    qkv: MultiLinear,
    /// Q, K, V biases (Qwen2), if any.
    bias: Option<[Vec<f32>; 3]>,
    wo: Linear,
    ffn_norm: Vec<f32>,
    /// Gate and up projections (stacked when their formats allow).
    gate_up: MultiLinear,
    w_down: Linear,
}

/// The loaded model: weights plus RoPE tables. Immutable; KV lives outside.
#[derive(Debug)]
pub struct Llama {
    pub config: LlamaConfig,
    embed: Linear,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Linear,
    /// `cos`/`sin` of position `p`, pair `i` at `p * head_dim / 2 + i`.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

struct Loader<'a, R> {
    ct: &'a Content,
    reader: &'a mut R,
}

impl<R: Read + Seek> Loader<'_, R> {
    fn qtensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor> {
        self.ct
            .tensor(self.reader, name, &Device::Cpu)
            .map_err(|e| EngineError::Load(format!("tensor `{name}`: {e}")))
    }

    fn linear(&mut self, name: &str) -> Result<Linear> {
        let qt = self.qtensor(name)?;
        Linear::from_qtensor(name, &qt)
    }

    fn vector(&mut self, name: &str) -> Result<Vec<f32>> {
        let qt = self.qtensor(name)?;
        vector(name, &qt)
    }

    fn has(&self, name: &str) -> bool {
        self.ct.tensor_infos.contains_key(name)
    }

    fn layer(&mut self, i: usize) -> Result<Layer> {
        let p = format!("blk.{i}");
        let bias = if self.has(&format!("{p}.attn_q.bias")) {
            Some([
                self.vector(&format!("{p}.attn_q.bias"))?,
                self.vector(&format!("{p}.attn_k.bias"))?,
                self.vector(&format!("{p}.attn_v.bias"))?,
            ])
        } else {
            None
        };
        Ok(Layer {
            attn_norm: self.vector(&format!("{p}.attn_norm.weight"))?,
            qkv: MultiLinear::new(vec![
                self.linear(&format!("{p}.attn_q.weight"))?,
                self.linear(&format!("{p}.attn_k.weight"))?,
                self.linear(&format!("{p}.attn_v.weight"))?,
            ])?,
            bias,
            wo: self.linear(&format!("{p}.attn_output.weight"))?,
            ffn_norm: self.vector(&format!("{p}.ffn_norm.weight"))?,
            gate_up: MultiLinear::new(vec![
                self.linear(&format!("{p}.ffn_gate.weight"))?,
                self.linear(&format!("{p}.ffn_up.weight"))?,
            ])?,
            w_down: self.linear(&format!("{p}.ffn_down.weight"))?,
        })
    }
}

impl Llama {
    /// Loads a GGUF file's weights (quantized ones stay quantized).
    pub fn load<R: Read + Seek>(ct: &Content, reader: &mut R) -> Result<Self> {
        let config = LlamaConfig::from_gguf(ct)?;
        let mut ld = Loader { ct, reader };
        let embed = ld.linear("token_embd.weight")?;
        let lm_head = if ld.has("output.weight") {
            ld.linear("output.weight")?
        } else {
            embed.clone()
        };
        let norm = ld.vector("output_norm.weight")?;
        let layers = (0..config.n_layer)
            .map(|i| ld.layer(i))
            .collect::<Result<Vec<_>>>()?;
        let (cos, sin) = rope_tables(&config);
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            lm_head,
            cos,
            sin,
        })
    }

    /// Runs one step over `batch`, writing each chunk's keys and values into
    /// `kv` at the slots of its block table. Returns one logits row per
    /// chunk, for its last `num_logits()` positions, in batch order.
    pub fn forward(&self, batch: &ModelBatch, kv: &mut KvStorage) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let tokens = self.check_batch(batch, kv)?;
        let t = tokens.len();
        let mut x = Vec::with_capacity(t * c.hidden);
        for tok in &tokens {
            x.extend(self.embed.row(tok.id as usize)?);
        }
        for (li, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, c.rms_eps);
            let attn = self.attention(li, layer, &h, &tokens, batch, kv)?;
            add_in_place(&mut x, &layer.wo.forward(&attn, t)?);
            let h = rms_norm(&x, &layer.ffn_norm, c.rms_eps);
            let gate = swiglu(&layer.gate_up.forward_concat(&h, t)?, layer.w_down.cols());
            add_in_place(&mut x, &layer.w_down.forward(&gate, t)?);
        }
        let rows = logit_rows(&batch.chunks);
        let mut last = Vec::with_capacity(rows.len() * c.hidden);
        for &r in &rows {
            last.extend_from_slice(&x[r * c.hidden..(r + 1) * c.hidden]);
        }
        let last = rms_norm(&last, &self.norm, c.rms_eps);
        let logits = self.lm_head.forward(&last, rows.len())?;
        Ok(logits
            .chunks(self.lm_head.rows())
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// Flattens the batch into tokens, checking positions and block tables.
    fn check_batch(&self, batch: &ModelBatch, kv: &KvStorage) -> Result<Vec<TokenRef>> {
        let bs = kv.layout.block_size;
        let mut out = Vec::with_capacity(batch.num_tokens());
        for (ci, chunk) in batch.chunks.iter().enumerate() {
            let end = chunk.start_pos + chunk.tokens.len();
            if end > self.config.context_length {
                return Err(EngineError::Execution(format!(
                    "position {end} is past the context length {}",
                    self.config.context_length
                )));
            }
            if chunk.block_table.len() * bs < end {
                return Err(EngineError::Execution(format!(
                    "{}: block table too short for {end} positions",
                    chunk.seq
                )));
            }
            if let Some(&b) = chunk
                .block_table
                .iter()
                .find(|&&b| b as usize >= kv.layout.num_blocks)
            {
                return Err(EngineError::Execution(format!(
                    "block {b} is outside the KV cache"
                )));
            }
            for (i, &id) in chunk.tokens.iter().enumerate() {
                if id as usize >= self.config.vocab_size {
                    return Err(EngineError::Execution(format!(
                        "token {id} is outside the vocabulary"
                    )));
                }
                out.push(TokenRef {
                    id,
                    pos: chunk.start_pos + i,
                    chunk: ci,
                });
            }
        }
        Ok(out)
    }

    /// Self-attention of one layer for every token of the batch.
    fn attention(
        &self,
        li: usize,
        layer: &Layer,
        h: &[f32],
        tokens: &[TokenRef],
        batch: &ModelBatch,
        kv: &mut KvStorage,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let t = tokens.len();
        let (qd, kd) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        let [mut q, mut k, mut v]: [Vec<f32>; 3] = layer
            .qkv
            .forward(h, t)?
            .try_into()
            .map_err(|_| EngineError::Execution("q/k/v split".into()))?;
        if let Some([bq, bk, bv]) = &layer.bias {
            add_rows(&mut q, bq);
            add_rows(&mut k, bk);
            add_rows(&mut v, bv);
        }
        let bs = kv.layout.block_size;
        for (i, tok) in tokens.iter().enumerate() {
            self.rope(&mut q[i * qd..(i + 1) * qd], tok.pos);
            self.rope(&mut k[i * kd..(i + 1) * kd], tok.pos);
            let block = batch.chunks[tok.chunk].block_table[tok.pos / bs];
            kv.write(
                li,
                block,
                tok.pos % bs,
                &k[i * kd..(i + 1) * kd],
                &v[i * kd..(i + 1) * kd],
            );
        }
        let shape = AttnShape {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            block_size: bs,
        };
        let queries: Vec<(usize, &[u32])> = tokens
            .iter()
            .map(|tok| (tok.pos, batch.chunks[tok.chunk].block_table.as_slice()))
            .collect();
        Ok(paged_attention(&q, &queries, kv, li, shape))
    }

    /// Rotates every head of one token's q or k at `pos`, in place.
    fn rope(&self, x: &mut [f32], pos: usize) {
        let hd = self.config.head_dim;
        let half = hd / 2;
        let (cos, sin) = (
            &self.cos[pos * half..(pos + 1) * half],
            &self.sin[pos * half..(pos + 1) * half],
        );
        for head in x.chunks_exact_mut(hd) {
            for i in 0..half {
                let (a, b) = if self.config.rope_neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

/// One token of the flattened batch.
#[derive(Debug, Clone, Copy)]
struct TokenRef {
    id: u32,
    pos: usize,
    chunk: usize,
}

/// Rows (in the flattened batch) whose logits the chunks want: the last
/// `num_logits()` positions of each chunk, in order.
fn logit_rows(chunks: &[SeqChunk]) -> Vec<usize> {
    let mut rows = Vec::new();
    let mut end = 0;
    for c in chunks {
        end += c.tokens.len();
        rows.extend(end - c.num_logits()..end);
    }
    rows
}

fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// `cos`/`sin` tables for every position and rotary pair.
fn rope_tables(c: &LlamaConfig) -> (Vec<f32>, Vec<f32>) {
    let half = c.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / c.rope_theta.powf((2 * i) as f32 / c.head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(c.context_length * half);
    let mut sin = Vec::with_capacity(c.context_length * half);
    for p in 0..c.context_length {
        for f in &inv {
            let (s, co) = (p as f32 * f).sin_cos();
            cos.push(co);
            sin.push(s);
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use kernels::reference;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::model::max_diff;

    fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn tiny_llama(rope_neox: bool) -> Llama {
        let config = LlamaConfig {
            architecture: "llama".into(),
            n_layer: 0,
            hidden: 32,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 8,
            rms_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_neox,
            context_length: 64,
            vocab_size: 4,
        };
        let (cos, sin) = rope_tables(&config);
        let dense = |rows, cols| Linear::Dense {
            w: candle_core::Tensor::zeros((rows, cols), candle_core::DType::F32, &Device::Cpu)
                .expect("zeros"),
            rows,
            cols,
        };
        Llama {
            embed: dense(4, 32),
            lm_head: dense(4, 32),
            layers: Vec::new(),
            norm: vec![1.0; 32],
            config,
            cos,
            sin,
        }
    }

    #[test]
    fn rope_matches_the_reference_in_both_layouts() {
        let mut rng = StdRng::seed_from_u64(3);
        for neox in [false, true] {
            let m = tiny_llama(neox);
            for pos in [0usize, 1, 17, 63] {
                let x = random(&mut rng, 32);
                let mut got = x.clone();
                m.rope(&mut got, pos);
                let mut want = x;
                for head in want.chunks_mut(8) {
                    if neox {
                        reference::rope_neox(head, pos, 10_000.0);
                    } else {
                        reference::rope_interleaved(head, pos, 10_000.0);
                    }
                }
                assert!(max_diff(&got, &want) < 1e-5, "neox={neox} pos={pos}");
            }
        }
    }

    #[test]
    fn batches_past_the_context_or_the_block_table_are_errors() {
        let m = tiny_llama(false);
        let mut kv = KvStorage::new(m.config.kv_layout(4, 4));
        let chunk = |start, table: Vec<u32>| SeqChunk {
            seq: crate::request::RequestId(1),
            tokens: vec![1, 2],
            start_pos: start,
            want_logits: true,
            block_table: table,
            draft: Vec::new(),
        };
        let mut err = |b: SeqChunk| m.forward(&ModelBatch { chunks: vec![b] }, &mut kv).is_err();
        assert!(err(chunk(63, vec![0; 16])), "past the context");
        assert!(err(chunk(3, vec![0])), "table too short");
        assert!(err(chunk(0, vec![9])), "block outside the cache");
        assert!(!err(chunk(0, vec![0])));
    }
}
