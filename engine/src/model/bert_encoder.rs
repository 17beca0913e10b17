//! The BERT sentence encoder (all-MiniLM-L6-v2 and its kin), written once
//! over the compute backend (`kernels::backend::Backend`, the CPU one by
//! default): word + position + type embeddings, then post-LayerNorm
//! encoder layers of fused QKV projection, bidirectional attention, output
//! projection, exact-GELU feed-forward; mean pooling and L2 normalisation
//! as sentence-transformers. The linear layers are f32 (the embeddings
//! API's model) or Q8_0 (the semantic cache's latency-bound query copy,
//! VNNI on the CPU). A batch runs unpadded: the sequences' rows are
//! stacked, every linear layer runs once over all of them, and attention
//! keeps each sequence to itself. Checked against candle's BERT in the
//! engine tests.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use kernels::backend::{Backend, HostMatrix};
use kernels::cpu::backend::CpuBackend;
use kernels::{QMatrix, QuantType};

use crate::error::{EngineError, Result};

/// The format of the linear layers' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    F32,
    Q8,
}

/// A linear layer's weights on the host (f32, `out x in`) before the
/// backend takes them.
struct HostLinear {
    w: Vec<f32>,
    rows: usize,
    cols: usize,
    b: Vec<f32>,
}

/// A linear layer: weights (`out x in`) and an f32 bias.
struct Linear<B: Backend> {
    w: B::Matrix,
    b: B::Vector,
}

impl<B: Backend> Linear<B> {
    fn new(backend: &B, l: HostLinear, precision: Precision) -> Result<Self> {
        let host = match precision {
            Precision::F32 => HostMatrix::Dense {
                data: l.w,
                rows: l.rows,
                cols: l.cols,
            },
            Precision::Q8 => HostMatrix::Quant(
                QMatrix::quantize(QuantType::Q8_0, l.rows, l.cols, &l.w)
                    .map_err(|e| EngineError::Load(e.to_string()))?,
            ),
        };
        Ok(Self {
            w: backend
                .matrix(host)
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

/// The encoder.
pub struct BertEncoder<B: Backend = CpuBackend> {
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
        Ok(HostLinear {
            w: t.flatten_all()?.to_vec1::<f32>()?,
            rows,
            cols,
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

/// Query, key and value stacked into one `3H x H` layer.
fn concat(parts: [HostLinear; 3]) -> Result<HostLinear> {
    let [q, k, v] = parts;
    if q.cols != k.cols || q.cols != v.cols {
        return Err(EngineError::Load(
            "query, key and value widths differ".into(),
        ));
    }
    Ok(HostLinear {
        rows: q.rows + k.rows + v.rows,
        cols: q.cols,
        w: [q.w, k.w, v.w].concat(),
        b: [q.b, k.b, v.b].concat(),
    })
}

impl BertEncoder<CpuBackend> {
    /// Loads the model folder `dir` onto the CPU backend.
    pub fn load(dir: &Path, precision: Precision) -> Result<Self> {
        Self::load_on(CpuBackend, dir, precision)
    }
}

/// The attention heads and LayerNorm epsilon from `config.json`.
fn read_config(dir: &Path) -> Result<(usize, f32)> {
    let path = dir.join("config.json");
    let config: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .ok_or_else(|| EngineError::Load(format!("{}: not a BERT config", path.display())))?;
    let heads = config["num_attention_heads"].as_u64().unwrap_or(12) as usize;
    let eps = config["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32;
    Ok((heads.max(1), eps))
}

impl<B: Backend> BertEncoder<B> {
    /// Loads `config.json` and `model.safetensors` (f32) from `dir` and
    /// hands the weights to `backend` in `precision`.
    pub fn load_on(backend: B, dir: &Path, precision: Precision) -> Result<Self> {
        let (heads, eps) = read_config(dir)?;
        let path = dir.join("model.safetensors");
        let t = Tensors(candle_core::safetensors::load(&path, &Device::Cpu)?);
        let mut layers = Vec::new();
        while t.0.contains_key(&format!(
            "encoder.layer.{}.attention.self.query.weight",
            layers.len()
        )) {
            let p = format!("encoder.layer.{}", layers.len());
            let b = &backend;
            let linear = |name: &str| Linear::new(b, t.linear(&format!("{p}.{name}"))?, precision);
            layers.push(Layer {
                qkv: Linear::new(
                    b,
                    concat([
                        t.linear(&format!("{p}.attention.self.query"))?,
                        t.linear(&format!("{p}.attention.self.key"))?,
                        t.linear(&format!("{p}.attention.self.value"))?,
                    ])?,
                    precision,
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

    /// Output vector length.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The most tokens one input may have (longer ones are truncated).
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The unit-length mean-pooled embedding of one token sequence (with
    /// its special tokens), truncated to the position limit.
    pub fn embed_ids(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = self.encode(&[ids])?;
        out.pop().ok_or(EngineError::Shutdown)
    }

    /// The unit-length mean-pooled embeddings of a batch of token
    /// sequences, each truncated to the position limit, run together
    /// without padding.
    pub fn encode(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let h = self.hidden;
        let lens: Vec<usize> = seqs
            .iter()
            .map(|s| s.len().min(self.max_positions))
            .collect();
        if let Some(i) = lens.iter().position(|&n| n == 0) {
            return Err(EngineError::Validation {
                field: "input",
                message: format!("input {i} has no tokens"),
            });
        }
        let mut x = Vec::with_capacity(lens.iter().sum::<usize>() * h);
        for (ids, &n) in seqs.iter().zip(&lens) {
            self.embed_rows(&ids[..n], &mut x)?;
        }
        let b = &self.backend;
        let mut x = b.layer_norm(&b.tensor(x, h), &self.ln.w, &self.ln.b, self.eps);
        for l in &self.layers {
            x = self.layer(l, x, &lens)?;
        }
        let x = b.take_host(x);
        let mut out = Vec::with_capacity(seqs.len());
        let mut rows = x.chunks_exact(h);
        for &n in &lens {
            let mut mean = vec![0.0f32; h];
            for row in rows.by_ref().take(n) {
                mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
            }
            let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
            out.push(mean.into_iter().map(|v| v / norm).collect());
        }
        Ok(out)
    }

    /// Appends the input embeddings (word + position + type 0) of `ids`.
    fn embed_rows(&self, ids: &[u32], x: &mut Vec<f32>) -> Result<()> {
        let h = self.hidden;
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
        Ok(())
    }

    /// One encoder layer (post-LayerNorm, as BERT).
    fn layer(&self, l: &Layer<B>, x: B::Tensor, lens: &[usize]) -> Result<B::Tensor> {
        let b = &self.backend;
        let h = self.hidden;
        let qkv = b.split_cols(&l.qkv.forward(b, &x)?, &[h, h, h]);
        let ctx = b.self_attention(&qkv[0], &qkv[1], &qkv[2], self.heads, lens);
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
