//! A BERT sentence encoder on our own kernels, for latency-bound single
//! queries (the semantic cache embeds one short question per lookup): the
//! linear layers are Q8_0 matrices multiplied by the SIMD kernels
//! (`kernels::cpu::matmul`, VNNI where available); embeddings, LayerNorm,
//! GELU and bidirectional attention are plain Rust over one unpadded
//! sequence. Mean pooling and L2 normalisation as sentence-transformers.
//! Checked against the f32 candle path (`bert`) in the engine tests.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use kernels::{QMatrix, QuantType};

use crate::error::{EngineError, Result};

/// A linear layer: Q8_0 weights (`out x in`) and an f32 bias.
struct Linear {
    w: QMatrix,
    b: Vec<f32>,
}

impl Linear {
    /// `m` rows of `x` times `Wᵀ`, plus the bias.
    fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut out = vec![0.0; m * self.w.rows];
        kernels::cpu::matmul(&self.w, x, m, &mut out)
            .map_err(|e| EngineError::Execution(e.to_string()))?;
        for row in out.chunks_exact_mut(self.w.rows) {
            row.iter_mut().zip(&self.b).for_each(|(o, b)| *o += b);
        }
        Ok(out)
    }
}

struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

struct Layer {
    /// Query, key and value in one matrix (`3H x H`).
    qkv: Linear,
    out: Linear,
    ln1: Norm,
    up: Linear,
    down: Linear,
    ln2: Norm,
}

/// The int8 encoder.
pub struct BertQ8 {
    word: Vec<f32>,
    pos: Vec<f32>,
    typ: Vec<f32>,
    ln: Norm,
    layers: Vec<Layer>,
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

    fn linear(&self, prefix: &str) -> Result<Linear> {
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
        Ok(Linear {
            w,
            b: self.vec(&format!("{prefix}.bias"))?,
        })
    }

    fn norm(&self, prefix: &str) -> Result<Norm> {
        Ok(Norm {
            w: self.vec(&format!("{prefix}.weight"))?,
            b: self.vec(&format!("{prefix}.bias"))?,
        })
    }
}

fn concat(parts: [Linear; 3]) -> Result<Linear> {
    let [q, k, v] = parts;
    let w = QMatrix::concat(&[&q.w, &k.w, &v.w]).map_err(|e| EngineError::Load(e.to_string()))?;
    Ok(Linear {
        w,
        b: [q.b, k.b, v.b].concat(),
    })
}

impl BertQ8 {
    /// Loads `model.safetensors` (f32) and quantizes its linear layers.
    pub fn load(dir: &Path, heads: usize, eps: f32) -> Result<Self> {
        let path = dir.join("model.safetensors");
        let t = Tensors(candle_core::safetensors::load(&path, &Device::Cpu)?);
        let mut layers = Vec::new();
        while t.0.contains_key(&format!(
            "encoder.layer.{}.attention.self.query.weight",
            layers.len()
        )) {
            let p = format!("encoder.layer.{}", layers.len());
            layers.push(Layer {
                qkv: concat([
                    t.linear(&format!("{p}.attention.self.query"))?,
                    t.linear(&format!("{p}.attention.self.key"))?,
                    t.linear(&format!("{p}.attention.self.value"))?,
                ])?,
                out: t.linear(&format!("{p}.attention.output.dense"))?,
                ln1: t.norm(&format!("{p}.attention.output.LayerNorm"))?,
                up: t.linear(&format!("{p}.intermediate.dense"))?,
                down: t.linear(&format!("{p}.output.dense"))?,
                ln2: t.norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        let ln = t.norm("embeddings.LayerNorm")?;
        let hidden = ln.w.len();
        if layers.is_empty() || hidden % heads != 0 {
            return Err(EngineError::Load(format!(
                "not a BERT encoder ({} layers, {hidden} wide)",
                layers.len()
            )));
        }
        let pos = t.vec("embeddings.position_embeddings.weight")?;
        Ok(Self {
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
        layer_norm(&mut x, &self.ln, self.eps);
        for l in &self.layers {
            x = self.layer(l, x, n)?;
        }
        let mut mean = vec![0.0f32; h];
        for row in x.chunks_exact(h) {
            mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
        }
        let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        Ok(mean.into_iter().map(|v| v / norm).collect())
    }

    /// One encoder layer (post-LayerNorm, as BERT).
    fn layer(&self, l: &Layer, x: Vec<f32>, n: usize) -> Result<Vec<f32>> {
        let qkv = l.qkv.forward(&x, n)?;
        let ctx = attention(&qkv, n, self.hidden, self.heads);
        let mut y = l.out.forward(&ctx, n)?;
        y.iter_mut().zip(&x).for_each(|(a, b)| *a += b);
        layer_norm(&mut y, &l.ln1, self.eps);
        let mut f = l.up.forward(&y, n)?;
        f.iter_mut().for_each(|v| *v = gelu(*v));
        let mut z = l.down.forward(&f, n)?;
        z.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        layer_norm(&mut z, &l.ln2, self.eps);
        Ok(z)
    }
}

/// Bidirectional multi-head attention over `n` rows of fused QKV.
fn attention(qkv: &[f32], n: usize, h: usize, heads: usize) -> Vec<f32> {
    let d = h / heads;
    let scale = 1.0 / (d as f32).sqrt();
    let mut ctx = vec![0.0f32; n * h];
    let mut scores = vec![0.0f32; n];
    for head in 0..heads {
        let at = |row: usize, part: usize| &qkv[row * 3 * h + part * h + head * d..][..d];
        for i in 0..n {
            let q = at(i, 0);
            for (j, s) in scores.iter_mut().enumerate() {
                *s = q.iter().zip(at(j, 1)).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0;
            scores.iter_mut().for_each(|s| {
                *s = (*s - max).exp();
                total += *s;
            });
            let out = &mut ctx[i * h + head * d..][..d];
            for (j, s) in scores.iter().enumerate() {
                let w = s / total;
                out.iter_mut().zip(at(j, 2)).for_each(|(o, v)| *o += w * v);
            }
        }
    }
    ctx
}

/// LayerNorm over each row, in place.
fn layer_norm(x: &mut [f32], n: &Norm, eps: f32) {
    let h = n.w.len();
    for row in x.chunks_exact_mut(h) {
        let mean = row.iter().sum::<f32>() / h as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(&n.w).zip(&n.b) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// Exact (erf) GELU, as BERT uses.
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7).
fn erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * (-x * x).exp();
    if x < 0.0 { -y } else { y }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_and_gelu_match_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
        ] {
            assert!((erf(x) - want).abs() < 2e-6, "erf({x}) = {}", erf(x));
        }
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-5);
        assert!(gelu(-6.0).abs() < 1e-6);
    }

    #[test]
    fn layer_norm_centres_and_scales_each_row() {
        let n = Norm {
            w: vec![1.0; 4],
            b: vec![0.5; 4],
        };
        let mut x = vec![1.0, 2.0, 3.0, 4.0, -1.0, -1.0, -1.0, 3.0];
        layer_norm(&mut x, &n, 1e-12);
        for row in x.chunks(4) {
            let mean = row.iter().sum::<f32>() / 4.0;
            assert!((mean - 0.5).abs() < 1e-5);
        }
    }

    #[test]
    fn one_token_attends_only_to_itself() {
        // One row: the context is its own value vector, whatever the scores.
        let (h, heads) = (4, 2);
        let qkv: Vec<f32> = (0..3 * h).map(|i| i as f32).collect();
        assert_eq!(attention(&qkv, 1, h, heads), qkv[2 * h..].to_vec());
    }
}
