//! A BERT sentence encoder written over the compute backend
//! (`kernels::backend::Backend`, the CPU one by default), for
//! latency-bound single queries (the semantic cache embeds one short
//! question per lookup): the linear layers are Q8_0 matrices (VNNI on the
//! CPU where available); LayerNorm, exact GELU and bidirectional attention
//! are backend operations over one unpadded sequence. Mean pooling and L2
//! normalisation as sentence-transformers. Checked against the f32 candle
//! path (`bert`) in the engine tests.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use kernels::backend::{Backend, HostMatrix};
use kernels::cpu::backend::CpuBackend;
use kernels::{QMatrix, QuantType};

use crate::error::{EngineError, Result};

/// A linear layer's weights on the host before the backend takes them.
struct HostLinear {
    w: QMatrix,
    b: Vec<f32>,
}

/// A linear layer: Q8_0 weights (`out x in`) and an f32 bias.
struct Linear<B: Backend> {
    w: B::Matrix,
    b: B::Vector,
}

impl<B: Backend> Linear<B> {
    fn new(backend: &B, l: HostLinear) -> Result<Self> {
        Ok(Self {
            w: backend
                .matrix(HostMatrix::Quant(l.w))
                .map_err(|e| EngineError::Load(e.to_string()))?,
            b: backend.vector(l.b),
        })
    }

    /// `x · Wᵀ + b`.
    fn forward(&self, backend: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let mut y = backend
            .matmul(x, &self.w)
            .map_err(|e| EngineError::Execution(e.to_string()))?;
        backend.add_bias(&mut y, &self.b);
        Ok(y)
    }
}

struct Norm<B: Backend> {
    w: B::Vector,
    b: B::Vector,
}

struct Layer<B: Backend> {
    /// Query, key and value in one matrix (`3H x H`).
    qkv: Linear<B>,
    out: Linear<B>,
    ln1: Norm<B>,
    up: Linear<B>,
    down: Linear<B>,
    ln2: Norm<B>,
}

/// The int8 encoder.
pub struct BertQ8<B: Backend = CpuBackend> {
    backend: B,
    word: Vec<f32>,
    pos: Vec<f32>,
    typ: Vec<f32>,
    ln: Norm<B>,
    layers: Vec<Layer<B>>,
    hidden: usize,
    heads: usize,
    max_positions: usize,
    eps: f32,
}

/// The f32 tensors of a safetensors file, by name.
struct Tensors(HashMap<String, Tensor>);

impl Tensors {
    fn vec(&self, name: &str) -> Result<Vec<f32>> {
        let t = self
            .0
            .get(name)
            .ok_or_else(|| EngineError::Load(format!("missing tensor {name}")))?;
        Ok(t.flatten_all()?.to_vec1::<f32>()?)
    }

    fn linear(&self, prefix: &str) -> Result<HostLinear> {
        let t = self
            .0
            .get(&format!("{prefix}.weight"))
            .ok_or_else(|| EngineError::Load(format!("missing tensor {prefix}.weight")))?;
        let (rows, cols) = t.dims2()?;
        let w = QMatrix::quantize(
            QuantType::Q8_0,
            rows,
            cols,
            &t.flatten_all()?.to_vec1::<f32>()?,
        )
        .map_err(|e| EngineError::Load(format!("{prefix}: {e}")))?;
        Ok(HostLinear {
            w,
            b: self.vec(&format!("{prefix}.bias"))?,
        })
    }

    fn norm<B: Backend>(&self, backend: &B, prefix: &str) -> Result<Norm<B>> {
        Ok(Norm {
            w: backend.vector(self.vec(&format!("{prefix}.weight"))?),
            b: backend.vector(self.vec(&format!("{prefix}.bias"))?),
        })
    }
}

fn concat(parts: [HostLinear; 3]) -> Result<HostLinear> {
    let [q, k, v] = parts;
    let w = QMatrix::concat(&[&q.w, &k.w, &v.w]).map_err(|e| EngineError::Load(e.to_string()))?;
    Ok(HostLinear {
        w,
        b: [q.b, k.b, v.b].concat(),
    })
}

impl BertQ8<CpuBackend> {
    /// Loads `model.safetensors` (f32) onto the CPU backend.
    pub fn load(dir: &Path, heads: usize, eps: f32) -> Result<Self> {
        Self::load_on(CpuBackend, dir, heads, eps)
    }
}

impl<B: Backend> BertQ8<B> {
    /// Loads `model.safetensors` (f32), quantizes its linear layers and
    /// hands them to `backend`.
    pub fn load_on(backend: B, dir: &Path, heads: usize, eps: f32) -> Result<Self> {
        let path = dir.join("model.safetensors");
        let t = Tensors(candle_core::safetensors::load(&path, &Device::Cpu)?);
        let mut layers = Vec::new();
        while t.0.contains_key(&format!(
            "encoder.layer.{}.attention.self.query.weight",
            layers.len()
        )) {
            let p = format!("encoder.layer.{}", layers.len());
            let b = &backend;
            let linear = |name: &str| Linear::new(b, t.linear(&format!("{p}.{name}"))?);
            layers.push(Layer {
                qkv: Linear::new(
                    b,
                    concat([
                        t.linear(&format!("{p}.attention.self.query"))?,
                        t.linear(&format!("{p}.attention.self.key"))?,
                        t.linear(&format!("{p}.attention.self.value"))?,
                    ])?,
                )?,
                out: linear("attention.output.dense")?,
                ln1: t.norm(b, &format!("{p}.attention.output.LayerNorm"))?,
                up: linear("intermediate.dense")?,
                down: linear("output.dense")?,
                ln2: t.norm(b, &format!("{p}.output.LayerNorm"))?,
            });
        }
        let ln_w = t.vec("embeddings.LayerNorm.weight")?;
        let hidden = ln_w.len();
        let ln = Norm {
            w: backend.vector(ln_w),
            b: backend.vector(t.vec("embeddings.LayerNorm.bias")?),
        };
        if layers.is_empty() || hidden % heads != 0 {
            return Err(EngineError::Load(format!(
                "not a BERT encoder ({} layers, {hidden} wide)",
                layers.len()
            )));
        }
        let pos = t.vec("embeddings.position_embeddings.weight")?;
        Ok(Self {
            backend,
            word: t.vec("embeddings.word_embeddings.weight")?,
            max_positions: pos.len() / hidden,
            pos,
            typ: t.vec("embeddings.token_type_embeddings.weight")?,
            ln,
            layers,
            hidden,
            heads,
            eps,
        })
    }

    /// The unit-length mean-pooled embedding of one token sequence (with
    /// its special tokens), truncated to the position limit.
    pub fn embed_ids(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let ids = &ids[..ids.len().min(self.max_positions)];
        let (n, h) = (ids.len(), self.hidden);
        if n == 0 {
            return Err(EngineError::Validation {
                field: "input",
                message: "no tokens".into(),
            });
        }
        let mut x = Vec::with_capacity(n * h);
        for (i, &id) in ids.iter().enumerate() {
            let word = self
                .word
                .get(id as usize * h..(id as usize + 1) * h)
                .ok_or_else(|| EngineError::Validation {
                    field: "input",
                    message: format!("token id {id} out of range"),
                })?;
            let pos = &self.pos[i * h..(i + 1) * h];
            x.extend((0..h).map(|j| word[j] + pos[j] + self.typ[j]));
        }
        let b = &self.backend;
        let mut x = b.layer_norm(&b.tensor(x, h), &self.ln.w, &self.ln.b, self.eps);
        for l in &self.layers {
            x = self.layer(l, x)?;
        }
        let x = b.to_host(&x);
        let mut mean = vec![0.0f32; h];
        for row in x.chunks_exact(h) {
            mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
        }
        let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        Ok(mean.into_iter().map(|v| v / norm).collect())
    }

    /// One encoder layer (post-LayerNorm, as BERT).
    fn layer(&self, l: &Layer<B>, x: B::Tensor) -> Result<B::Tensor> {
        let b = &self.backend;
        let h = self.hidden;
        let qkv = b.split_cols(&l.qkv.forward(b, &x)?, &[h, h, h]);
        let ctx = b.self_attention(&qkv[0], &qkv[1], &qkv[2], self.heads);
        let mut y = l.out.forward(b, &ctx)?;
        b.add(&mut y, &x);
        let y = b.layer_norm(&y, &l.ln1.w, &l.ln1.b, self.eps);
        let mut f = l.up.forward(b, &y)?;
        b.gelu(&mut f);
        let mut z = l.down.forward(b, &f)?;
        b.add(&mut z, &y);
        Ok(b.layer_norm(&z, &l.ln2.w, &l.ln2.b, self.eps))
    }
}
