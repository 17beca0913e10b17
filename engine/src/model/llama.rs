//! Batched llama-family decoder over GGUF weights (Llama, Mistral, SmolLM2,
//! Qwen2 shapes), written once over the compute backend
//! (`kernels::backend::Backend`; the CPU one by default).
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

use kernels::QMatrix;
use kernels::backend::{AttnShape, Backend, HostMatrix, Rope};
use kernels::cpu::backend::CpuBackend;

use super::rope::RopeSpec;
use super::weights::{Linear, vector};
use super::{ModelBatch, SeqChunk};
use crate::error::{EngineError, Result};
use crate::gguf::Gguf;
use crate::kv_cache::KvLayout;
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
    /// Rotary embedding as the file says (`rope`).
    pub rope: RopeSpec,
    pub context_length: usize,
    pub vocab_size: usize,
}

impl LlamaConfig {
    /// Reads the `{arch}.*` keys llama.cpp writes.
    pub fn from_gguf(ct: &Gguf) -> Result<Self> {
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
            .tensors
            .get("token_embd.weight")
            .map(|t| t.dims[0])
            .ok_or_else(|| EngineError::Load("GGUF has no token_embd.weight".into()))?;
        let head_dim = hidden / n_head.max(1);
        let config = Self {
            n_layer: meta.u32(&key("block_count"))? as usize,
            hidden,
            n_head,
            n_kv_head: meta
                .u32(&key("attention.head_count_kv"))
                .map_or(n_head, |v| v as usize),
            head_dim,
            rms_eps: meta
                .f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            rope: RopeSpec::from_meta(&meta, &arch, rope_neox, head_dim)?,
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
            dtype: Default::default(),
        }
    }
}

/// Several projections of the same input (Q/K/V, or gate/up): stacked
/// into one matrix when their formats allow (one matmul, one pass over the
/// input), else kept apart.
enum Proj<B: Backend> {
    Fused { w: B::Matrix, widths: Vec<usize> },
    Separate(Vec<B::Matrix>),
}

impl<B: Backend> Proj<B> {
    fn new(backend: &B, parts: Vec<Linear>) -> Result<Self> {
        let quant: Option<Vec<&QMatrix>> = parts
            .iter()
            .map(|p| match p {
                Linear::Quant(m) => Some(m.as_ref()),
                Linear::Dense { .. } | Linear::Half { .. } => None,
            })
            .collect();
        if let Some(ms) = quant
            && let Ok(stacked) = QMatrix::concat(&ms)
        {
            let widths = ms.iter().map(|m| m.rows).collect();
            let w = backend.matrix(HostMatrix::Quant(stacked)).map_err(load)?;
            return Ok(Self::Fused { w, widths });
        }
        let ws = parts
            .into_iter()
            .map(|p| backend.matrix(p.into_host()?).map_err(load))
            .collect::<Result<_>>()?;
        Ok(Self::Separate(ws))
    }

    /// Every part's output, side by side in each row.
    fn concat(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        match self {
            Self::Fused { w, .. } => b.matmul(x, w).map_err(exec),
            Self::Separate(ws) => {
                let outs = ws
                    .iter()
                    .map(|w| b.matmul(x, w).map_err(exec))
                    .collect::<Result<Vec<_>>>()?;
                Ok(b.concat_cols(&outs))
            }
        }
    }

    /// Every part's output, apart.
    fn each(&self, b: &B, x: &B::Tensor) -> Result<Vec<B::Tensor>> {
        match self {
            Self::Fused { w, widths } => Ok(b.split_cols(&b.matmul(x, w).map_err(exec)?, widths)),
            Self::Separate(ws) => ws.iter().map(|w| b.matmul(x, w).map_err(exec)).collect(),
        }
    }
}

fn load(e: kernels::KernelError) -> EngineError {
    EngineError::Load(e.to_string())
}

fn exec(e: kernels::KernelError) -> EngineError {
    EngineError::Execution(e.to_string())
}

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    /// Q, K and V projections.
    qkv: Proj<B>,
    /// Q, K, V biases (Qwen2), if any.
    bias: Option<[B::Vector; 3]>,
    wo: B::Matrix,
    ffn_norm: B::Vector,
    /// Gate and up projections.
    gate_up: Proj<B>,
    w_down: B::Matrix,
}

/// The loaded model: weights in the backend's memory plus RoPE tables.
/// Immutable; KV lives outside.
pub struct Llama<B: Backend = CpuBackend> {
    pub config: LlamaConfig,
    backend: B,
    embed: B::Matrix,
    layers: Vec<Layer<B>>,
    norm: B::Vector,
    /// `None`: tied to the embedding.
    lm_head: Option<B::Matrix>,
    rope: Rope,
}

impl<B: Backend> std::fmt::Debug for Llama<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama")
            .field("config", &self.config)
            .field("backend", &self.backend.name())
            .finish_non_exhaustive()
    }
}

struct Loader<'a, R, B> {
    ct: &'a Gguf,
    reader: &'a mut R,
    backend: &'a B,
}

impl<'a, R: Read + Seek, B: Backend> Loader<'a, R, B> {
    /// Tensor `name`'s type and shape, and its bytes from the file.
    fn raw(&mut self, name: &str) -> Result<(&'a crate::gguf::TensorInfo, Vec<u8>)> {
        let ct: &'a Gguf = self.ct;
        Ok((ct.info(name)?, ct.tensor_bytes(self.reader, name)?))
    }

    fn linear(&mut self, name: &str) -> Result<Linear> {
        let (t, bytes) = self.raw(name)?;
        Linear::from_gguf(name, t.ty, &t.dims, &bytes)
    }

    fn matrix(&mut self, name: &str) -> Result<B::Matrix> {
        let host = self.linear(name)?.into_host()?;
        self.backend.matrix(host).map_err(load)
    }

    fn vector(&mut self, name: &str) -> Result<B::Vector> {
        let (t, bytes) = self.raw(name)?;
        Ok(self.backend.vector(vector(name, t.ty, &t.dims, &bytes)?))
    }

    fn has(&self, name: &str) -> bool {
        self.ct.tensors.contains_key(name)
    }

    fn layer(&mut self, i: usize) -> Result<Layer<B>> {
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
            qkv: Proj::new(
                self.backend,
                vec![
                    self.linear(&format!("{p}.attn_q.weight"))?,
                    self.linear(&format!("{p}.attn_k.weight"))?,
                    self.linear(&format!("{p}.attn_v.weight"))?,
                ],
            )?,
            bias,
            wo: self.matrix(&format!("{p}.attn_output.weight"))?,
            ffn_norm: self.vector(&format!("{p}.ffn_norm.weight"))?,
            gate_up: Proj::new(
                self.backend,
                vec![
                    self.linear(&format!("{p}.ffn_gate.weight"))?,
                    self.linear(&format!("{p}.ffn_up.weight"))?,
                ],
            )?,
            w_down: self.matrix(&format!("{p}.ffn_down.weight"))?,
        })
    }
}

impl Llama<CpuBackend> {
    /// Loads a GGUF file's weights onto the CPU backend (quantized ones
    /// stay quantized).
    pub fn load<R: Read + Seek>(ct: &Gguf, reader: &mut R) -> Result<Self> {
        Self::load_on(CpuBackend, ct, reader)
    }
}

/// A CPU weight matrix as the host form another backend takes.
fn host_matrix(m: &kernels::cpu::backend::CpuMatrix) -> HostMatrix {
    use kernels::cpu::backend::CpuMatrix;
    match m {
        CpuMatrix::Quant(q) => HostMatrix::Quant(q.as_ref().clone()),
        CpuMatrix::Dense(p) => HostMatrix::Dense {
            data: (0..p.n).flat_map(|r| p.row(r)).collect(),
            rows: p.n,
            cols: p.k,
        },
    }
}

impl Llama<CpuBackend> {
    /// The same model with its weights moved into `backend`'s memory
    /// (quantized ones stay quantized).
    pub fn onto<B: Backend>(self, backend: B) -> Result<Llama<B>> {
        let b = &backend;
        let matrix = |m: &kernels::cpu::backend::CpuMatrix| b.matrix(host_matrix(m)).map_err(load);
        let proj = |p: &Proj<CpuBackend>| -> Result<Proj<B>> {
            Ok(match p {
                Proj::Fused { w, widths } => Proj::Fused {
                    w: matrix(w)?,
                    widths: widths.clone(),
                },
                Proj::Separate(ws) => {
                    Proj::Separate(ws.iter().map(&matrix).collect::<Result<_>>()?)
                }
            })
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    attn_norm: b.vector(l.attn_norm.clone()),
                    qkv: proj(&l.qkv)?,
                    bias: l.bias.as_ref().map(|[q, k, v]| {
                        [
                            b.vector(q.clone()),
                            b.vector(k.clone()),
                            b.vector(v.clone()),
                        ]
                    }),
                    wo: matrix(&l.wo)?,
                    ffn_norm: b.vector(l.ffn_norm.clone()),
                    gate_up: proj(&l.gate_up)?,
                    w_down: matrix(&l.w_down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Llama {
            embed: matrix(&self.embed)?,
            lm_head: self.lm_head.as_ref().map(&matrix).transpose()?,
            norm: b.vector(self.norm.clone()),
            layers,
            config: self.config,
            rope: self.rope,
            backend,
        })
    }
}

impl<B: Backend> Llama<B> {
    /// Loads a GGUF file's weights into `backend`'s memory.
    pub fn load_on<R: Read + Seek>(backend: B, ct: &Gguf, reader: &mut R) -> Result<Self> {
        let mut config = LlamaConfig::from_gguf(ct)?;
        check_shapes(ct, &config)?;
        let mut ld = Loader {
            ct,
            reader,
            backend: &backend,
        };
        // Llama 3.x: the rotary frequencies' factors.
        if ld.has("rope_freqs.weight") {
            let (t, bytes) = ld.raw("rope_freqs.weight")?;
            let factors = vector("rope_freqs.weight", t.ty, &t.dims, &bytes)?;
            config.rope = config.rope.with_freq_factors(factors, config.head_dim)?;
        }
        let embed = ld.matrix("token_embd.weight")?;
        let lm_head = if ld.has("output.weight") {
            Some(ld.matrix("output.weight")?)
        } else {
            None
        };
        let norm = ld.vector("output_norm.weight")?;
        let layers = (0..config.n_layer)
            .map(|i| ld.layer(i))
            .collect::<Result<Vec<_>>>()?;
        let rope = rope_tables(&config);
        Ok(Self {
            config,
            backend,
            embed,
            layers,
            norm,
            lm_head,
            rope,
        })
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Runs one step over `batch`, writing each chunk's keys and values into
    /// `kv` at the slots of its block table. Returns one logits row per
    /// chunk, for its last `num_logits()` positions, in batch order.
    pub fn forward(&self, batch: &ModelBatch, kv: &mut B::Kv) -> Result<Vec<Vec<f32>>> {
        let (c, b) = (&self.config, &self.backend);
        let layout = b.kv_layout(kv);
        let tokens = self.check_batch(batch, &layout)?;
        let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
        let mut x = b.embed(&self.embed, &ids).map_err(exec)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = b.rms_norm(&x, &layer.attn_norm, c.rms_eps);
            let attn = self.attention(li, layer, &h, &tokens, batch, kv)?;
            b.add(&mut x, &b.matmul(&attn, &layer.wo).map_err(exec)?);
            let h = b.rms_norm(&x, &layer.ffn_norm, c.rms_eps);
            let gate = b.swiglu(&layer.gate_up.concat(b, &h)?);
            b.add(&mut x, &b.matmul(&gate, &layer.w_down).map_err(exec)?);
        }
        let rows = logit_rows(&batch.chunks);
        let last = b.rms_norm(&b.rows(&x, &rows), &self.norm, c.rms_eps);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        // The logits of a 16-sequence step over a 128k vocabulary are 8 MB:
        // taken over, not copied.
        let logits = b.take_host(b.matmul(&last, head).map_err(exec)?);
        let vocab = b.matrix_shape(head).0;
        if logits.len() == vocab {
            return Ok(vec![logits]);
        }
        Ok(logits.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// Flattens the batch into tokens, checking positions and block tables.
    fn check_batch(&self, batch: &ModelBatch, kv: &KvLayout) -> Result<Vec<TokenRef>> {
        let bs = kv.block_size;
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
                .find(|&&b| b as usize >= kv.num_blocks)
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
        layer: &Layer<B>,
        h: &B::Tensor,
        tokens: &[TokenRef],
        batch: &ModelBatch,
        kv: &mut B::Kv,
    ) -> Result<B::Tensor> {
        let (c, b) = (&self.config, &self.backend);
        let [mut q, mut k, v]: [B::Tensor; 3] = layer
            .qkv
            .each(b, h)?
            .try_into()
            .map_err(|_| EngineError::Execution("q/k/v split".into()))?;
        let mut v = v;
        if let Some([bq, bk, bv]) = &layer.bias {
            b.add_bias(&mut q, bq);
            b.add_bias(&mut k, bk);
            b.add_bias(&mut v, bv);
        }
        let bs = b.kv_layout(kv).block_size;
        let positions: Vec<usize> = tokens.iter().map(|t| t.pos).collect();
        b.rope(&mut q, &positions, &self.rope);
        b.rope(&mut k, &positions, &self.rope);
        let slots: Vec<(u32, usize)> = tokens
            .iter()
            .map(|t| (batch.chunks[t.chunk].block_table[t.pos / bs], t.pos % bs))
            .collect();
        b.write_kv(kv, li, &k, &v, &slots);
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
        Ok(b.attention(&q, kv, li, &queries, shape))
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

/// Checks that every tensor the model reads is there with the shape its
/// metadata implies (`[rows, cols]`, vectors `[len]`), so that a file
/// whose tensors disagree is refused at load, naming the tensor and its
/// type, instead of failing in a forward pass.
fn check_shapes(ct: &Gguf, c: &LlamaConfig) -> Result<()> {
    let (h, q, kv) = (c.hidden, c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
    let dims = |name: &str| ct.tensors.get(name).map(|t| t.dims.clone());
    let ffn = dims("blk.0.ffn_gate.weight")
        .and_then(|d| d.first().copied())
        .ok_or_else(|| EngineError::Load("GGUF has no blk.0.ffn_gate.weight".into()))?;
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![c.vocab_size, h]),
        ("output_norm.weight".into(), vec![h]),
    ];
    if ct.tensors.contains_key("output.weight") {
        want.push(("output.weight".into(), vec![c.vocab_size, h]));
    }
    if ct.tensors.contains_key("rope_freqs.weight") {
        want.push(("rope_freqs.weight".into(), vec![c.head_dim / 2]));
    }
    for i in 0..c.n_layer {
        let mut at = |k: &str, d: Vec<usize>| want.push((format!("blk.{i}.{k}"), d));
        at("attn_norm.weight", vec![h]);
        at("attn_q.weight", vec![q, h]);
        at("attn_k.weight", vec![kv, h]);
        at("attn_v.weight", vec![kv, h]);
        at("attn_output.weight", vec![h, q]);
        at("ffn_norm.weight", vec![h]);
        at("ffn_gate.weight", vec![ffn, h]);
        at("ffn_up.weight", vec![ffn, h]);
        at("ffn_down.weight", vec![h, ffn]);
        if ct.tensors.contains_key(&format!("blk.{i}.attn_q.bias")) {
            at("attn_q.bias", vec![q]);
            at("attn_k.bias", vec![kv]);
            at("attn_v.bias", vec![kv]);
        }
    }
    for (name, expected) in want {
        let Some(t) = ct.tensors.get(&name) else {
            return Err(EngineError::Load(format!("GGUF has no {name}")));
        };
        if t.dims != expected {
            return Err(EngineError::Load(format!(
                "tensor `{name}` ({}) has shape {:?}; the metadata implies {expected:?}",
                t.ty.name(),
                t.dims
            )));
        }
    }
    Ok(())
}

/// `cos`/`sin` tables for every position and rotary pair.
fn rope_tables(c: &LlamaConfig) -> Rope {
    c.rope.tables(c.head_dim, c.context_length)
}

impl<B: Backend> Llama<B> {
    /// Keeps the first `n` layers (at least one) and drops the rest: the
    /// same model with fewer layers (a cheating provider, in tests).
    pub fn keep_layers(&mut self, n: usize) {
        let n = n.clamp(1, self.layers.len().max(1));
        self.layers.truncate(n);
        self.config.n_layer = self.layers.len();
    }
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
            rope: RopeSpec::plain(10_000.0, rope_neox),
            context_length: 64,
            vocab_size: 4,
        };
        let rope = rope_tables(&config);
        let b = CpuBackend;
        let dense = |rows, cols| {
            b.matrix(HostMatrix::Dense {
                data: vec![0.0; rows * cols],
                rows,
                cols,
            })
            .expect("dense")
        };
        Llama {
            embed: dense(4, 32),
            lm_head: Some(dense(4, 32)),
            layers: Vec::new(),
            norm: vec![1.0; 32],
            config,
            backend: b,
            rope,
        }
    }

    #[test]
    fn rope_matches_the_reference_in_both_layouts() {
        let mut rng = StdRng::seed_from_u64(3);
        for neox in [false, true] {
            let m = tiny_llama(neox);
            for pos in [0usize, 1, 17, 63] {
                let x = random(&mut rng, 32);
                let mut got = m.backend.tensor(x.clone(), 32);
                m.backend.rope(&mut got, &[pos], &m.rope);
                let got = got.data;
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
        let mut kv = m.backend.kv(m.config.kv_layout(4, 4));
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
