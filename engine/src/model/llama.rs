//! Batched llama-family decoder over GGUF weights (Llama, Mistral, SmolLM2,
//! Qwen2, Qwen3, Gemma 2 and 3, Phi-3, and the mixture-of-experts forms:
//! Mixtral, Qwen3-MoE; `config::ARCHES`), written once over the compute backend
//! (`kernels::backend::Backend`; the CPU one by default).
//!
//! One forward pass takes the chunks of many sequences, each at its own
//! position, as one `[tokens, hidden]` matrix: every weight matrix is read
//! once per step for the whole batch (the point of continuous batching),
//! through the quantized SIMD matmul. Keys and values go to the paged
//! `KvStorage` at the slots the sequence's block table names, and attention
//! reads them from there, block by block.
//! RoPE follows llama.cpp: GGUF llama weights store Q/K rows for the
//! interleaved layout (pairs `2i, 2i+1`); Qwen2 and Qwen3 use NeoX halves.
//! Qwen3 norms every head of q and k before RoPE (`head_norm`).

use std::io::{Read, Seek};
use std::ops::Range;

use kernels::backend::{AttnShape, Backend, Rope, soft_cap};
use kernels::cpu::backend::CpuBackend;

pub use super::config::{LlamaConfig, MoeConfig};
use super::moe::Moe;
use super::proj::{Proj, exec, host_matrix, load};
use super::weights::{Linear, vector};
use super::{ModelBatch, SeqChunk};
use crate::error::{EngineError, Result};
use crate::gguf::Gguf;
use crate::kv_cache::KvLayout;

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    /// Q, K and V projections.
    qkv: Proj<B>,
    /// Q, K, V biases (Qwen2), if any.
    bias: Option<[B::Vector; 3]>,
    /// Per-head RMSNorm weights of q and k (Qwen3), if any.
    qk_norm: Option<[B::Vector; 2]>,
    wo: B::Matrix,
    ffn_norm: B::Vector,
    ffn: Ffn<B>,
    /// Gemma's norms of the attention's and the feed-forward's outputs.
    post_norms: Option<[B::Vector; 2]>,
}

/// A layer's feed-forward.
enum Ffn<B: Backend> {
    /// A gated unit (SwiGLU, or Gemma's GeGLU): gate and up projections,
    /// then down.
    Dense {
        gate_up: Proj<B>,
        down: B::Matrix,
        gelu: bool,
    },
    /// Routed experts.
    Moe(Moe<B>),
}

impl<B: Backend> Ffn<B> {
    fn forward(&self, b: &B, h: &B::Tensor) -> Result<B::Tensor> {
        match self {
            Self::Dense {
                gate_up,
                down,
                gelu,
            } => {
                let gu = gate_up.concat(b, h)?;
                let gate = if *gelu { b.geglu(&gu) } else { b.swiglu(&gu) };
                b.matmul(&gate, down).map_err(exec)
            }
            Self::Moe(moe) => moe.forward(b, h),
        }
    }
}

impl Ffn<CpuBackend> {
    /// The same feed-forward in `b`'s memory.
    fn onto<B: Backend>(&self, b: &B) -> Result<Ffn<B>> {
        Ok(match self {
            Self::Dense {
                gate_up,
                down,
                gelu,
            } => Ffn::Dense {
                gate_up: gate_up.onto(b)?,
                down: b.matrix(host_matrix(down)).map_err(load)?,
                gelu: *gelu,
            },
            Self::Moe(moe) => Ffn::Moe(moe.onto(b)?),
        })
    }
}

/// The loaded model, or a contiguous part of its layers (a stage of a
/// pipeline, `Llama::load_part`): weights in the backend's memory plus
/// RoPE tables. Immutable; KV lives outside.
pub struct Llama<B: Backend = CpuBackend> {
    pub config: LlamaConfig,
    backend: B,
    /// The first layer held: `first..first + layers.len()` of
    /// `config.n_layer` (0..n_layer for a whole model).
    first: usize,
    /// The token embeddings: on the first part, and on the last where the
    /// head is tied to them.
    embed: Option<B::Matrix>,
    layers: Vec<Layer<B>>,
    /// The final norm and the output head: on the last part.
    head: Option<Head<B>>,
    rope: Rope,
    /// The sliding layers' tables, where they differ (Gemma 3).
    rope_local: Option<Rope>,
}

/// The last part's final norm and output head.
struct Head<B: Backend> {
    norm: B::Vector,
    /// `None`: tied to the embedding.
    lm: Option<B::Matrix>,
}

/// What a part of the model takes: the batch's tokens (the first part) or
/// the hidden states the part before it produced, `[tokens, hidden]` row
/// by row in batch order.
#[derive(Debug, Clone, Copy)]
pub enum PartInput<'a> {
    Tokens,
    Hidden(&'a [f32]),
}

/// What a part of the model gives: the hidden states of every token of the
/// batch for the next part, or (the last part) the logits rows the batch
/// asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum PartOutput {
    Hidden(Vec<f32>),
    Logits(Vec<Vec<f32>>),
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

    /// Layer `i`'s Q, K and V projections: Phi-3's one `attn_qkv`, or three.
    fn qkv(&mut self, i: usize, c: &LlamaConfig) -> Result<Proj<B>> {
        let p = format!("blk.{i}");
        if self.has(&format!("{p}.attn_qkv.weight")) {
            let w = self.linear(&format!("{p}.attn_qkv.weight"))?;
            return Proj::stacked(self.backend, w, vec![c.q_dim(), c.kv_dim(), c.kv_dim()]);
        }
        let parts = ["attn_q", "attn_k", "attn_v"]
            .map(|k| self.linear(&format!("{p}.{k}.weight")))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        Proj::new(self.backend, parts)
    }

    /// Layer `i`'s gate and up projections: Phi-3's one `ffn_up` (the
    /// gate's rows first), or two.
    fn gate_up(&mut self, i: usize) -> Result<Proj<B>> {
        let p = format!("blk.{i}");
        if fused_gate_up(self.ct, i) {
            let w = self.linear(&format!("{p}.ffn_up.weight"))?;
            let ffn = w.rows() / 2;
            return Proj::stacked(self.backend, w, vec![ffn, ffn]);
        }
        let parts = vec![
            self.linear(&format!("{p}.ffn_gate.weight"))?,
            self.linear(&format!("{p}.ffn_up.weight"))?,
        ];
        Proj::new(self.backend, parts)
    }

    fn layer(&mut self, i: usize, c: &LlamaConfig) -> Result<Layer<B>> {
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
        let qk_norm = if c.qk_norm {
            Some([
                self.vector(&format!("{p}.attn_q_norm.weight"))?,
                self.vector(&format!("{p}.attn_k_norm.weight"))?,
            ])
        } else {
            None
        };
        let ffn = match c.moe {
            Some(moe) => Ffn::Moe(Moe::load(self.backend, self.ct, self.reader, &p, moe)?),
            None => Ffn::Dense {
                gate_up: self.gate_up(i)?,
                down: self.matrix(&format!("{p}.ffn_down.weight"))?,
                gelu: c.gemma,
            },
        };
        let post_norms = if c.gemma {
            Some([
                self.vector(&format!("{p}.post_attention_norm.weight"))?,
                self.vector(&format!("{p}.post_ffw_norm.weight"))?,
            ])
        } else {
            None
        };
        Ok(Layer {
            attn_norm: self.vector(&format!("{p}.attn_norm.weight"))?,
            qkv: self.qkv(i, c)?,
            bias,
            qk_norm,
            wo: self.matrix(&format!("{p}.attn_output.weight"))?,
            ffn_norm: self.vector(&format!("{p}.ffn_norm.weight"))?,
            ffn,
            post_norms,
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

impl Llama<CpuBackend> {
    /// The same model with its weights moved into `backend`'s memory
    /// (quantized ones stay quantized).
    pub fn onto<B: Backend>(self, backend: B) -> Result<Llama<B>> {
        let b = &backend;
        let matrix = |m: &kernels::cpu::backend::CpuMatrix| b.matrix(host_matrix(m)).map_err(load);
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    attn_norm: b.vector(l.attn_norm.clone()),
                    qkv: l.qkv.onto(b)?,
                    bias: l.bias.as_ref().map(|[q, k, v]| {
                        [
                            b.vector(q.clone()),
                            b.vector(k.clone()),
                            b.vector(v.clone()),
                        ]
                    }),
                    qk_norm: l
                        .qk_norm
                        .as_ref()
                        .map(|[q, k]| [b.vector(q.clone()), b.vector(k.clone())]),
                    wo: matrix(&l.wo)?,
                    ffn_norm: b.vector(l.ffn_norm.clone()),
                    ffn: l.ffn.onto(b)?,
                    post_norms: l
                        .post_norms
                        .as_ref()
                        .map(|[a, f]| [b.vector(a.clone()), b.vector(f.clone())]),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head = match &self.head {
            Some(h) => Some(Head {
                norm: b.vector(h.norm.clone()),
                lm: h.lm.as_ref().map(&matrix).transpose()?,
            }),
            None => None,
        };
        Ok(Llama {
            first: self.first,
            embed: self.embed.as_ref().map(&matrix).transpose()?,
            head,
            layers,
            config: self.config,
            rope: self.rope,
            rope_local: self.rope_local,
            backend,
        })
    }
}

impl<B: Backend> Llama<B> {
    /// Loads a GGUF file's weights into `backend`'s memory.
    pub fn load_on<R: Read + Seek>(backend: B, ct: &Gguf, reader: &mut R) -> Result<Self> {
        let n = LlamaConfig::from_gguf(ct)?.n_layer;
        Self::load_part(backend, ct, reader, 0..n)
    }

    /// Loads layers `layers` of a GGUF file into `backend`'s memory, with
    /// the token embeddings on the first part and the final norm and head
    /// on the last; no other tensor is read from the file.
    pub fn load_part<R: Read + Seek>(
        backend: B,
        ct: &Gguf,
        reader: &mut R,
        layers: Range<usize>,
    ) -> Result<Self> {
        let mut config = LlamaConfig::from_gguf(ct)?;
        check_part(&config, &layers)?;
        check_shapes(ct, &config, &layers)?;
        let last = layers.end == config.n_layer;
        let mut ld = Loader {
            ct,
            reader,
            backend: &backend,
        };
        if let Some(name) = rope_factors(ct, &config) {
            let (t, bytes) = ld.raw(name)?;
            let factors = vector(name, t.ty, &t.dims, &bytes)?;
            config.rope = config.rope.with_freq_factors(factors, config.head_dim)?;
        }
        let tied = !ld.has("output.weight");
        let embed = if layers.start == 0 || (last && tied) {
            Some(ld.matrix("token_embd.weight")?)
        } else {
            None
        };
        let head = if last {
            let lm = if tied {
                None
            } else {
                Some(ld.matrix("output.weight")?)
            };
            let norm = ld.vector("output_norm.weight")?;
            Some(Head { norm, lm })
        } else {
            None
        };
        let first = layers.start;
        let layers = layers
            .map(|i| ld.layer(i, &config))
            .collect::<Result<Vec<_>>>()?;
        let rope = rope_tables(&config);
        let rope_local = config
            .rope_local
            .as_ref()
            .map(|r| r.tables(config.head_dim, config.context_length));
        Ok(Self {
            config,
            backend,
            first,
            embed,
            layers,
            head,
            rope,
            rope_local,
        })
    }

    /// The layers this model (or part) holds.
    pub fn layer_range(&self) -> Range<usize> {
        self.first..self.first + self.layers.len()
    }

    /// The KV geometry of the layers held (a part keeps only its own).
    pub fn part_kv_layout(&self, block_size: usize, num_blocks: usize) -> KvLayout {
        KvLayout {
            n_layer: self.layers.len(),
            ..self.config.kv_layout(block_size, num_blocks)
        }
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Runs one step over `batch`, writing each chunk's keys and values into
    /// `kv` at the slots of its block table. Returns one logits row per
    /// chunk, for its last `num_logits()` positions, in batch order.
    pub fn forward(&self, batch: &ModelBatch, kv: &mut B::Kv) -> Result<Vec<Vec<f32>>> {
        match self.forward_part(batch, PartInput::Tokens, kv)? {
            PartOutput::Logits(rows) => Ok(rows),
            PartOutput::Hidden(_) => Err(EngineError::Execution(format!(
                "layers {:?} of {} are a part of the model: it gives hidden states, not logits",
                self.layer_range(),
                self.config.n_layer
            ))),
        }
    }

    /// Runs this part's layers over `batch` from `input` (the tokens on
    /// the first part, the previous part's hidden states on the others),
    /// writing their keys and values into `kv` (its layers only). The last
    /// part gives logits as `forward` does; the others every token's
    /// hidden state.
    pub fn forward_part(
        &self,
        batch: &ModelBatch,
        input: PartInput<'_>,
        kv: &mut B::Kv,
    ) -> Result<PartOutput> {
        let (c, b) = (&self.config, &self.backend);
        let layout = b.kv_layout(kv);
        let tokens = self.check_batch(batch, &layout)?;
        let mut x = self.part_input(&tokens, input)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = b.rms_norm(&x, &layer.attn_norm, c.rms_eps);
            let attn = self.attention(li, layer, &h, &tokens, batch, kv)?;
            let mut o = b.matmul(&attn, &layer.wo).map_err(exec)?;
            if let Some([post, _]) = &layer.post_norms {
                o = b.rms_norm(&o, post, c.rms_eps);
            }
            b.add(&mut x, &o);
            let h = b.rms_norm(&x, &layer.ffn_norm, c.rms_eps);
            let mut f = layer.ffn.forward(b, &h)?;
            if let Some([_, post]) = &layer.post_norms {
                f = b.rms_norm(&f, post, c.rms_eps);
            }
            b.add(&mut x, &f);
        }
        match &self.head {
            Some(head) => self.logits_of(head, &x, batch).map(PartOutput::Logits),
            None => Ok(PartOutput::Hidden(b.take_host(x))),
        }
    }

    /// The residual stream a part starts from: the embedded tokens, or
    /// the hidden states it was given (exactly one per token).
    fn part_input(&self, tokens: &[TokenRef], input: PartInput<'_>) -> Result<B::Tensor> {
        let (c, b) = (&self.config, &self.backend);
        match (input, self.first, &self.embed) {
            (PartInput::Tokens, 0, Some(embed)) => {
                let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
                let mut x = b.embed(embed, &ids).map_err(exec)?;
                if c.gemma {
                    b.scale(&mut x, (c.hidden as f32).sqrt());
                }
                Ok(x)
            }
            (PartInput::Hidden(h), 1.., _) if h.len() == tokens.len() * c.hidden => {
                Ok(b.tensor(h.to_vec(), c.hidden))
            }
            (PartInput::Hidden(h), 1.., _) => Err(EngineError::Execution(format!(
                "{} hidden values for {} tokens of width {}",
                h.len(),
                tokens.len(),
                c.hidden
            ))),
            _ => Err(EngineError::Execution(format!(
                "layers {:?} start from {}",
                self.layer_range(),
                if self.first == 0 {
                    "tokens, not hidden states"
                } else {
                    "the previous part's hidden states, not tokens"
                }
            ))),
        }
    }

    /// The logits rows the batch asks for, from the last layer's output.
    fn logits_of(
        &self,
        head: &Head<B>,
        x: &B::Tensor,
        batch: &ModelBatch,
    ) -> Result<Vec<Vec<f32>>> {
        let (c, b) = (&self.config, &self.backend);
        let rows = logit_rows(&batch.chunks);
        let last = b.rms_norm(&b.rows(x, &rows), &head.norm, c.rms_eps);
        let Some(matrix) = head.lm.as_ref().or(self.embed.as_ref()) else {
            return Err(EngineError::Execution("no output head".into()));
        };
        // The logits of a 16-sequence step over a 128k vocabulary are 8 MB:
        // taken over, not copied.
        let mut logits = b.take_host(b.matmul(&last, matrix).map_err(exec)?);
        if let Some(cap) = c.final_softcap {
            logits.iter_mut().for_each(|l| *l = soft_cap(*l, cap));
        }
        let vocab = b.matrix_shape(matrix).0;
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
            let full = kv.sliding.map_or(kv.num_blocks, |s| s.first as usize);
            if let Some(&b) = chunk.block_table.iter().find(|&&b| b as usize >= full) {
                return Err(EngineError::Execution(format!(
                    "block {b} is outside the KV cache"
                )));
            }
            self.check_swa_table(chunk, kv)?;
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

    /// A chunk's sliding-window table covers the window of its first
    /// position through its last one with blocks of the cache (released
    /// blocks, `HOLE`, only behind it).
    fn check_swa_table(&self, chunk: &SeqChunk, kv: &KvLayout) -> Result<()> {
        let window = self.config.swa.as_ref().map_or(0, |s| s.window);
        if kv.sliding.is_some() && chunk.swa_table.is_empty() {
            return Err(EngineError::Execution(format!(
                "{}: no sliding-window block table for a cache whose sliding layers keep their own blocks",
                chunk.seq
            )));
        }
        if chunk.swa_table.is_empty() || window == 0 {
            return Ok(());
        }
        let bs = kv.block_size;
        let end = chunk.start_pos + chunk.tokens.len();
        let first = (chunk.start_pos + 1).saturating_sub(window) / bs;
        let needed = chunk.swa_table.get(first..end.div_ceil(bs));
        let pool = kv.sliding.map_or(0, |s| s.first as usize)..kv.num_blocks;
        match needed.and_then(|t| t.iter().find(|&&b| !pool.contains(&(b as usize)))) {
            None if needed.is_some() => Ok(()),
            None => Err(EngineError::Execution(format!(
                "{}: sliding-window block table too short for {end} positions",
                chunk.seq
            ))),
            Some(&b) => Err(EngineError::Execution(format!(
                "{}: sliding-window block {b} inside the window is outside the KV cache",
                chunk.seq
            ))),
        }
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
        if let Some([qn, kn]) = &layer.qk_norm {
            q = self.head_norm(q, qn, c.q_dim());
            k = self.head_norm(k, kn, c.kv_dim());
        }
        let bs = b.kv_layout(kv).block_size;
        let positions: Vec<usize> = tokens.iter().map(|t| t.pos).collect();
        let window = c.window(self.first + li);
        let rope = match (&self.rope_local, window) {
            (Some(local), 1..) => local,
            (Some(_), 0) | (None, _) => &self.rope,
        };
        b.rope(&mut q, &positions, rope);
        b.rope(&mut k, &positions, rope);
        if c.q_scale != 1.0 {
            b.scale(&mut q, c.q_scale);
        }
        let slots: Vec<(u32, usize)> = tokens
            .iter()
            .map(|t| {
                (
                    batch.chunks[t.chunk].table_for(window)[t.pos / bs],
                    t.pos % bs,
                )
            })
            .collect();
        b.write_kv(kv, li, &k, &v, &slots);
        let shape = AttnShape {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            block_size: bs,
            window,
            softcap: c.attn_softcap.unwrap_or(0.0),
        };
        let queries: Vec<(usize, &[u32])> = tokens
            .iter()
            .map(|tok| (tok.pos, batch.chunks[tok.chunk].table_for(window)))
            .collect();
        Ok(b.attention(&q, kv, li, &queries, shape))
    }
}

impl<B: Backend> Llama<B> {
    /// RMSNorm of every head of `x` (`[tokens, heads * head_dim]`) by the
    /// `[head_dim]` weight `w`; `width` is the heads' total width.
    fn head_norm(&self, x: B::Tensor, w: &B::Vector, width: usize) -> B::Tensor {
        let (b, c) = (&self.backend, &self.config);
        let heads = b.reshape(x, c.head_dim);
        b.reshape(b.rms_norm(&heads, w, c.rms_eps), width)
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
fn check_shapes(ct: &Gguf, c: &LlamaConfig, layers: &Range<usize>) -> Result<()> {
    let (h, q, kv) = (c.hidden, c.q_dim(), c.kv_dim());
    let mut want: Vec<(String, Vec<usize>)> = vec![];
    let (first, last) = (layers.start == 0, layers.end == c.n_layer);
    let tied = !ct.tensors.contains_key("output.weight");
    if first || (last && tied) {
        want.push(("token_embd.weight".into(), vec![c.vocab_size, h]));
    }
    if last {
        want.push(("output_norm.weight".into(), vec![h]));
    }
    if last && !tied {
        want.push(("output.weight".into(), vec![c.vocab_size, h]));
    }
    for name in ["rope_freqs", "rope_factors_long", "rope_factors_short"] {
        let name = format!("{name}.weight");
        if ct.tensors.contains_key(&name) {
            want.push((name, vec![c.rope.rot_dim(c.head_dim) / 2]));
        }
    }
    let ffn = ffn_shapes(ct, c, layers.start)?;
    for i in layers.clone() {
        let mut at = |k: &str, d: Vec<usize>| want.push((format!("blk.{i}.{k}"), d));
        at("attn_norm.weight", vec![h]);
        if ct.tensors.contains_key(&format!("blk.{i}.attn_qkv.weight")) {
            at("attn_qkv.weight", vec![q + 2 * kv, h]);
        } else {
            at("attn_q.weight", vec![q, h]);
            at("attn_k.weight", vec![kv, h]);
            at("attn_v.weight", vec![kv, h]);
        }
        at("attn_output.weight", vec![h, q]);
        at("ffn_norm.weight", vec![h]);
        for (k, d) in &ffn {
            at(k, d.clone());
        }
        if c.qk_norm {
            at("attn_q_norm.weight", vec![c.head_dim]);
            at("attn_k_norm.weight", vec![c.head_dim]);
        }
        if c.gemma {
            at("post_attention_norm.weight", vec![h]);
            at("post_ffw_norm.weight", vec![h]);
        }
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

/// Every layer's feed-forward tensors and shapes, the width read from
/// layer `at`'s gate (the first one loaded): dense SwiGLU (Phi-3's gate and up stacked in one
/// `ffn_up`), or the router and stacked experts.
fn ffn_shapes(ct: &Gguf, c: &LlamaConfig, at: usize) -> Result<Vec<(&'static str, Vec<usize>)>> {
    let h = c.hidden;
    if c.moe.is_none() && fused_gate_up(ct, at) {
        let ffn = ct.info(&format!("blk.{at}.ffn_up.weight"))?.dims[0] / 2;
        return Ok(vec![
            ("ffn_up.weight", vec![2 * ffn, h]),
            ("ffn_down.weight", vec![h, ffn]),
        ]);
    }
    let gate = match c.moe {
        Some(_) => format!("blk.{at}.ffn_gate_exps.weight"),
        None => format!("blk.{at}.ffn_gate.weight"),
    };
    let dims = ct.info(&gate)?.dims.clone();
    Ok(match c.moe {
        None => {
            let ffn = dims[0];
            vec![
                ("ffn_gate.weight", vec![ffn, h]),
                ("ffn_up.weight", vec![ffn, h]),
                ("ffn_down.weight", vec![h, ffn]),
            ]
        }
        Some(m) => {
            let ffn = dims.get(1).copied().unwrap_or(0);
            vec![
                ("ffn_gate_inp.weight", vec![m.n_expert, h]),
                ("ffn_gate_exps.weight", vec![m.n_expert, ffn, h]),
                ("ffn_up_exps.weight", vec![m.n_expert, ffn, h]),
                ("ffn_down_exps.weight", vec![m.n_expert, h, ffn]),
            ]
        }
    })
}

/// The tensor of the rotary angles' divisors the model turns by, if any:
/// Llama 3.x's `rope_freqs`, or of Phi-3's LongRoPE pair the long factors
/// where the model serves past its original context and the short ones
/// otherwise (llama.cpp's `get_rope_factors`, whose serving context is
/// `-c`; ours is the file's context length, capped later only by memory).
fn rope_factors(ct: &Gguf, c: &LlamaConfig) -> Option<&'static str> {
    let long = c.context_length > c.rope_original_context;
    [
        "rope_freqs.weight",
        "rope_factors_long.weight",
        "rope_factors_short.weight",
    ]
    .into_iter()
    .filter(|name| ct.tensors.contains_key(*name))
    .find(|name| match *name {
        "rope_factors_long.weight" => long,
        "rope_factors_short.weight" => !long,
        _ => true,
    })
}

/// A part is a non-empty range of the model's layers.
fn check_part(c: &LlamaConfig, layers: &Range<usize>) -> Result<()> {
    if layers.is_empty() || layers.end > c.n_layer {
        return Err(EngineError::Load(format!(
            "layers {layers:?} are not a part of a {}-layer model",
            c.n_layer
        )));
    }
    Ok(())
}

/// Whether layer `i`'s gate and up projections are one `ffn_up` of twice
/// the width, the gate first (Phi-3).
fn fused_gate_up(ct: &Gguf, i: usize) -> bool {
    !ct.tensors.contains_key(&format!("blk.{i}.ffn_gate.weight"))
        && ct.tensors.contains_key(&format!("blk.{i}.ffn_up.weight"))
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
        self.config.n_layer = self.first + self.layers.len();
    }
}

#[cfg(test)]
mod tests {
    use kernels::reference;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use kernels::backend::HostMatrix;

    use super::*;
    use crate::model::max_diff;
    use crate::model::rope::RopeSpec;

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
            qk_norm: false,
            moe: None,
            gemma: false,
            swa: None,
            rope_local: None,
            q_scale: 1.0,
            final_softcap: None,
            attn_softcap: None,
            rope_original_context: 64,
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
            first: 0,
            embed: Some(dense(4, 32)),
            head: Some(Head {
                norm: vec![1.0; 32],
                lm: Some(dense(4, 32)),
            }),
            layers: Vec::new(),
            config,
            backend: b,
            rope,
            rope_local: None,
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
            swa_table: Vec::new(),
            draft: Vec::new(),
        };
        let mut err = |b: SeqChunk| m.forward(&ModelBatch { chunks: vec![b] }, &mut kv).is_err();
        assert!(err(chunk(63, vec![0; 16])), "past the context");
        assert!(err(chunk(3, vec![0])), "table too short");
        assert!(err(chunk(0, vec![9])), "block outside the cache");
        assert!(!err(chunk(0, vec![0])));
    }
}
