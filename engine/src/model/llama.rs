//! Batched llama-family decoder over quantized GGUF weights (Llama, Mistral,
//! SmolLM2, Qwen2 shapes).
//!
//! One forward pass takes the chunks of many sequences, each at its own
//! position, as one `[tokens, hidden]` matrix: every weight matrix is read
//! once per step for the whole batch (the point of continuous batching).
//! Attention runs per sequence against that sequence's own KV.
//! RoPE follows llama.cpp: GGUF llama weights store Q/K rows for the
//! interleaved layout (`rope_i`); Qwen2 uses the NeoX halves layout.

use std::io::{Read, Seek};
use std::sync::Arc;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::{KvStore, ModelBatch, SeqChunk, SeqKv};
use crate::error::{EngineError, Result};
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
    pub rms_eps: f64,
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
        let head_dim = hidden / n_head.max(1);
        let vocab_size = ct
            .tensor_infos
            .get("token_embd.weight")
            .map(|t| t.shape.dims()[0])
            .ok_or_else(|| EngineError::Load("GGUF has no token_embd.weight".into()))?;
        Ok(Self {
            n_layer: meta.u32(&key("block_count"))? as usize,
            hidden,
            n_head,
            n_kv_head: meta
                .u32(&key("attention.head_count_kv"))
                .map_or(n_head, |v| v as usize),
            head_dim,
            rms_eps: f64::from(
                meta.f32(&key("attention.layer_norm_rms_epsilon"))
                    .unwrap_or(1e-5),
            ),
            rope_theta: meta.f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rope_neox,
            context_length: meta
                .u32(&key("context_length"))
                .map_or(2048, |v| v as usize),
            vocab_size,
            architecture: arch,
        })
    }
}

/// A linear layer with quantized weights and an optional f32 bias.
#[derive(Debug, Clone)]
struct Linear {
    w: QMatMul,
    b: Option<Tensor>,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.w.forward(x)?;
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

#[derive(Debug, Clone)]
struct Layer {
    attn_norm: Tensor,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    ffn_norm: Tensor,
    w_gate: Linear,
    w_up: Linear,
    w_down: Linear,
}

/// The loaded model: weights plus RoPE tables. Immutable; KV lives outside.
#[derive(Debug)]
pub struct Llama {
    pub config: LlamaConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: QMatMul,
    cos: Tensor,
    sin: Tensor,
    device: Device,
}

struct Loader<'a, R> {
    ct: &'a Content,
    reader: &'a mut R,
    device: &'a Device,
}

impl<R: Read + Seek> Loader<'_, R> {
    fn qtensor(&mut self, name: &str) -> Result<Arc<QTensor>> {
        self.ct
            .tensor(self.reader, name, self.device)
            .map(Arc::new)
            .map_err(|e| EngineError::Load(format!("tensor `{name}`: {e}")))
    }

    fn f32(&mut self, name: &str) -> Result<Tensor> {
        Ok(self.qtensor(name)?.dequantize(self.device)?)
    }

    fn linear(&mut self, name: &str) -> Result<Linear> {
        let w = QMatMul::from_arc(self.qtensor(&format!("{name}.weight"))?)?;
        let bias = format!("{name}.bias");
        let b = if self.ct.tensor_infos.contains_key(&bias) {
            Some(self.f32(&bias)?)
        } else {
            None
        };
        Ok(Linear { w, b })
    }
}

impl Llama {
    /// Loads a GGUF file's weights onto `device`.
    pub fn load<R: Read + Seek>(ct: &Content, reader: &mut R, device: &Device) -> Result<Self> {
        let config = LlamaConfig::from_gguf(ct)?;
        let mut ld = Loader { ct, reader, device };
        let embed_q = ld.qtensor("token_embd.weight")?;
        let embed = embed_q.dequantize(device)?;
        let lm_head = if ct.tensor_infos.contains_key("output.weight") {
            QMatMul::from_arc(ld.qtensor("output.weight")?)?
        } else {
            QMatMul::from_arc(embed_q)? // tied embeddings
        };
        let norm = ld.f32("output_norm.weight")?;
        let mut layers = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let p = format!("blk.{i}");
            layers.push(Layer {
                attn_norm: ld.f32(&format!("{p}.attn_norm.weight"))?,
                wq: ld.linear(&format!("{p}.attn_q"))?,
                wk: ld.linear(&format!("{p}.attn_k"))?,
                wv: ld.linear(&format!("{p}.attn_v"))?,
                wo: ld.linear(&format!("{p}.attn_output"))?,
                ffn_norm: ld.f32(&format!("{p}.ffn_norm.weight"))?,
                w_gate: ld.linear(&format!("{p}.ffn_gate"))?,
                w_up: ld.linear(&format!("{p}.ffn_up"))?,
                w_down: ld.linear(&format!("{p}.ffn_down"))?,
            });
        }
        let (cos, sin) = rope_tables(&config, device)?;
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            lm_head,
            cos,
            sin,
            device: device.clone(),
        })
    }

    /// Runs one step over `batch`, appending each chunk's keys and values to
    /// its sequence's KV in `kv`. Returns logits `[n, vocab]` for the chunks
    /// with `want_logits`, in batch order.
    pub fn forward(&self, batch: &ModelBatch, kv: &mut KvStore) -> Result<Tensor> {
        let tokens: Vec<u32> = batch
            .chunks
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let positions: Vec<u32> = batch
            .chunks
            .iter()
            .flat_map(|c| (c.start_pos..c.start_pos + c.tokens.len()).map(|p| p as u32))
            .collect();
        if let Some(&max) = positions.iter().max()
            && max as usize >= self.config.context_length
        {
            return Err(EngineError::Execution(format!(
                "position {max} is past the context length {}",
                self.config.context_length
            )));
        }
        for c in &batch.chunks {
            let entry = kv.entry(c.seq).or_default();
            truncate_kv(entry, c.start_pos)?;
        }
        let ids = Tensor::new(tokens.as_slice(), &self.device)?;
        let pos = Tensor::new(positions.as_slice(), &self.device)?;
        let cos = self.cos.index_select(&pos, 0)?;
        let sin = self.sin.index_select(&pos, 0)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, self.config.rms_eps as f32)?;
            let step = Step {
                cos: &cos,
                sin: &sin,
                batch,
            };
            let attn = self.attention(li, &h, &step, kv)?;
            x = (x + layer.wo.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, self.config.rms_eps as f32)?;
            let gate = candle_nn::ops::silu(&layer.w_gate.forward(&h)?)?;
            let mlp = layer.w_down.forward(&(gate * layer.w_up.forward(&h)?)?)?;
            x = (x + mlp)?;
        }
        let rows = logit_rows(&batch.chunks);
        let rows = Tensor::new(rows.as_slice(), &self.device)?;
        let last = x.index_select(&rows, 0)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, self.config.rms_eps as f32)?;
        Ok(self.lm_head.forward(&last)?)
    }

    /// Self-attention of one layer for every chunk in the batch.
    fn attention(
        &self,
        li: usize,
        h: &Tensor,
        step: &Step<'_>,
        kv: &mut KvStore,
    ) -> Result<Tensor> {
        let c = &self.config;
        let layer = &self.layers[li];
        let (cos, sin, batch) = (step.cos, step.sin, step.batch);
        let t = h.dim(0)?;
        let heads = |x: Tensor, n: usize| -> Result<Tensor> {
            Ok(x.reshape((1, t, n, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = self.rope(&heads(layer.wq.forward(h)?, c.n_head)?, cos, sin)?;
        let k = self.rope(&heads(layer.wk.forward(h)?, c.n_kv_head)?, cos, sin)?;
        let v = heads(layer.wv.forward(h)?, c.n_kv_head)?;
        let q = (q * (1.0 / (c.head_dim as f64).sqrt()))?;
        let mut outs = Vec::with_capacity(batch.chunks.len());
        let mut offset = 0;
        for chunk in &batch.chunks {
            let n = chunk.tokens.len();
            let seq_kv = kv
                .get_mut(&chunk.seq)
                .ok_or_else(|| EngineError::Execution(format!("no KV for {}", chunk.seq)))?;
            let (kc, vc) = append_kv(seq_kv, li, k.narrow(2, offset, n)?, v.narrow(2, offset, n)?)?;
            outs.push(attend(&q.narrow(2, offset, n)?, &kc, &vc, chunk.start_pos)?);
            offset += n;
        }
        Ok(Tensor::cat(&outs, 0)?)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(if self.config.rope_neox {
            candle_nn::rotary_emb::rope(x, cos, sin)?
        } else {
            candle_nn::rotary_emb::rope_i(x, cos, sin)?
        })
    }
}

/// Per-step inputs shared by every layer.
struct Step<'a> {
    cos: &'a Tensor,
    sin: &'a Tensor,
    batch: &'a ModelBatch,
}

/// Causal GQA attention of one sequence: `q (1, nh, n, hd)` (already
/// scaled) against `k, v (1, nkv, L, hd)`, the chunk starting at position
/// `start`. Returns `(n, nh * hd)`.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
    let (_, n_head, n, head_dim) = q.dims4()?;
    let n_kv_head = k.dim(1)?;
    let l = k.dim(2)?;
    let group = n_head / n_kv_head;
    let q = q.reshape((n_kv_head, group * n, head_dim))?;
    let k = k.squeeze(0)?;
    let v = v.squeeze(0)?;
    let mut scores = q.matmul(&k.t()?)?; // (nkv, group*n, L)
    if n > 1 {
        let mask: Vec<f32> = (0..n)
            .flat_map(|i| {
                (0..l).map(move |j| {
                    if j <= start + i {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (1, 1, n, l), q.device())?;
        scores = scores
            .reshape((n_kv_head, group, n, l))?
            .broadcast_add(&mask)?
            .reshape((n_kv_head, group * n, l))?;
    }
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let out = probs.matmul(&v)?; // (nkv, group*n, hd)
    Ok(out
        .reshape((n_head, n, head_dim))?
        .transpose(0, 1)?
        .reshape((n, n_head * head_dim))?)
}

/// Row index (in the flattened batch) of each chunk's last token, for the
/// chunks that want logits.
fn logit_rows(chunks: &[SeqChunk]) -> Vec<u32> {
    let mut rows = Vec::new();
    let mut end = 0;
    for c in chunks {
        end += c.tokens.len();
        if c.want_logits {
            rows.push((end - 1) as u32);
        }
    }
    rows
}

/// Drops cached positions at or past `len` (recompute after preemption or
/// a rewound draft); a gap (cache shorter than `len`) is a caller bug.
fn truncate_kv(kv: &mut SeqKv, len: usize) -> Result<()> {
    let have = kv.len();
    if have < len {
        return Err(EngineError::Execution(format!(
            "KV holds {have} positions but the chunk starts at {len}"
        )));
    }
    if have > len {
        if len == 0 {
            kv.layers.clear();
        } else {
            for (k, v) in &mut kv.layers {
                *k = k.narrow(2, 0, len)?;
                *v = v.narrow(2, 0, len)?;
            }
        }
    }
    Ok(())
}

fn append_kv(kv: &mut SeqKv, layer: usize, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
    if kv.layers.len() == layer {
        kv.layers.push((k.contiguous()?, v.contiguous()?));
    } else {
        let (kc, vc) = &kv.layers[layer];
        let kn = Tensor::cat(&[kc, &k], 2)?;
        let vn = Tensor::cat(&[vc, &v], 2)?;
        kv.layers[layer] = (kn, vn);
    }
    Ok(kv.layers[layer].clone())
}

fn rope_tables(c: &LlamaConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let inv: Vec<f32> = (0..c.head_dim)
        .step_by(2)
        .map(|i| 1.0 / c.rope_theta.powf(i as f32 / c.head_dim as f32))
        .collect();
    let n = inv.len();
    let inv = Tensor::from_vec(inv, (1, n), device)?;
    let pos = Tensor::arange(0u32, c.context_length as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((c.context_length, 1))?;
    let freqs = pos.matmul(&inv)?;
    Ok((freqs.cos()?.contiguous()?, freqs.sin()?.contiguous()?))
}

#[cfg(test)]
mod tests {
    use kernels::reference;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn cfg(head_dim: usize, rope_neox: bool) -> LlamaConfig {
        LlamaConfig {
            architecture: "llama".into(),
            n_layer: 1,
            hidden: 4 * head_dim,
            n_head: 4,
            n_kv_head: 2,
            head_dim,
            rms_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_neox,
            context_length: 64,
            vocab_size: 10,
        }
    }

    #[test]
    fn attention_matches_the_reference_for_chunks_at_any_offset() {
        let mut rng = StdRng::seed_from_u64(7);
        let (nh, nkv, d) = (6, 2, 8);
        for (n, l) in [(1, 1), (1, 9), (5, 5), (4, 13)] {
            let q = random(&mut rng, nh * n * d);
            let k = random(&mut rng, nkv * l * d);
            let v = random(&mut rng, nkv * l * d);
            let dev = Device::Cpu;
            let qt = (Tensor::from_vec(q.clone(), (1, nh, n, d), &dev).expect("q")
                * (1.0 / (d as f64).sqrt()))
            .expect("scale");
            let kt = Tensor::from_vec(k.clone(), (1, nkv, l, d), &dev).expect("k");
            let vt = Tensor::from_vec(v.clone(), (1, nkv, l, d), &dev).expect("v");
            let got = attend(&qt, &kt, &vt, l - n)
                .expect("attend")
                .flatten_all()
                .expect("flat")
                .to_vec1::<f32>()
                .expect("vec");
            let shape = reference::AttnShape {
                n_head: nh,
                n_kv_head: nkv,
                head_dim: d,
                n_q: n,
                n_kv: l,
            };
            let want = reference::causal_attention(&q, &k, &v, shape);
            assert!(
                max_diff(&got, &want) < 1e-5,
                "n={n} l={l}: {}",
                max_diff(&got, &want)
            );
        }
    }

    #[test]
    fn rope_tables_gathered_by_position_match_the_reference_in_both_layouts() {
        let mut rng = StdRng::seed_from_u64(3);
        for neox in [false, true] {
            let c = cfg(8, neox);
            let (cos, sin) = rope_tables(&c, &Device::Cpu).expect("tables");
            let positions = [0u32, 5, 1, 63];
            let (h, t, d) = (3, positions.len(), c.head_dim);
            let x = random(&mut rng, h * t * d);
            let pos = Tensor::new(&positions[..], &Device::Cpu).expect("pos");
            let (cos, sin) = (
                cos.index_select(&pos, 0).expect("cos"),
                sin.index_select(&pos, 0).expect("sin"),
            );
            let xt = Tensor::from_vec(x.clone(), (1, h, t, d), &Device::Cpu).expect("x");
            let got = if neox {
                candle_nn::rotary_emb::rope(&xt, &cos, &sin)
            } else {
                candle_nn::rotary_emb::rope_i(&xt, &cos, &sin)
            }
            .expect("rope")
            .flatten_all()
            .expect("flat")
            .to_vec1::<f32>()
            .expect("vec");
            let mut want = x;
            for (i, head) in want.chunks_mut(d).enumerate() {
                let p = positions[i % t] as usize;
                if neox {
                    reference::rope_neox(head, p, c.rope_theta)
                } else {
                    reference::rope_interleaved(head, p, c.rope_theta)
                }
            }
            assert!(
                max_diff(&got, &want) < 1e-4,
                "neox={neox}: {}",
                max_diff(&got, &want)
            );
        }
    }

    #[test]
    fn rms_norm_matches_the_reference() {
        let mut rng = StdRng::seed_from_u64(5);
        let (rows, dim) = (7, 48);
        let x = random(&mut rng, rows * dim);
        let w = random(&mut rng, dim);
        let xt = Tensor::from_vec(x.clone(), (rows, dim), &Device::Cpu).expect("x");
        let wt = Tensor::from_vec(w.clone(), dim, &Device::Cpu).expect("w");
        let got = candle_nn::ops::rms_norm(&xt, &wt, 1e-5)
            .expect("norm")
            .flatten_all()
            .expect("flat")
            .to_vec1::<f32>()
            .expect("vec");
        assert!(max_diff(&got, &reference::rms_norm(&x, &w, 1e-5)) < 1e-5);
    }

    #[test]
    fn truncating_kv_rewinds_and_a_gap_is_an_error() {
        let t = Tensor::zeros((1, 2, 5, 4), DType::F32, &Device::Cpu).expect("zeros");
        let mut kv = SeqKv {
            layers: vec![(t.clone(), t)],
        };
        truncate_kv(&mut kv, 3).expect("rewind");
        assert_eq!(kv.len(), 3);
        assert!(truncate_kv(&mut kv, 4).is_err());
        truncate_kv(&mut kv, 0).expect("reset");
        assert!(kv.is_empty());
    }
}
