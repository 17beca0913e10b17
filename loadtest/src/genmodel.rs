//! Benchmark models of realistic shapes: a GGUF file with random weights
//! in the layout llama.cpp writes (the same tensor names, types and
//! metadata), so that every byte a real model of that shape reads is read,
//! and llama.cpp and Synor can be run on the same file. The text is noise.
//! The tokenizer is copied from a real GGUF (SmolLM2's by default) and
//! padded with unused tokens up to the shape's vocabulary.
//!
//! `cargo run --release -p loadtest --bin synor-genmodel -- --shape llama-1b --quant q4_0`

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use engine::gguf::{Gguf, TensorType, Value, WriteTensor};

/// How the weights are quantized, as llama.cpp's `quantize` names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quant {
    Q4_0,
    /// Q4_K, with `attn_v` and `ffn_down` in Q6_K on the layers llama.cpp
    /// gives more bits (the first and last eighth, and every third between),
    /// and the output projection in Q6_K.
    Q4KM,
    /// Every matrix in one type (the parity tests' files, one per type).
    All(TensorType),
}

/// The one-type quantizations by name, with llama.cpp's `general.file_type`.
const UNIFORM: [(&str, TensorType, u32); 14] = [
    ("F32", TensorType::F32, 0),
    ("F16", TensorType::F16, 1),
    ("BF16", TensorType::BF16, 32),
    ("Q4_1", TensorType::Q4_1, 3),
    ("Q8_0", TensorType::Q8_0, 7),
    ("Q5_0", TensorType::Q5_0, 8),
    ("Q5_1", TensorType::Q5_1, 9),
    ("Q2_K", TensorType::Q2K, 10),
    ("Q3_K", TensorType::Q3K, 11),
    ("Q4_K", TensorType::Q4K, 14),
    ("Q5_K", TensorType::Q5K, 16),
    ("Q6_K", TensorType::Q6K, 18),
    ("IQ4_NL", TensorType::Iq4Nl, 25),
    ("IQ4_XS", TensorType::Iq4Xs, 30),
];

impl std::str::FromStr for Quant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        match s.as_str() {
            "q4_0" => Ok(Self::Q4_0),
            "q4_k_m" => Ok(Self::Q4KM),
            other => UNIFORM
                .iter()
                .find(|u| u.0.eq_ignore_ascii_case(other))
                .map(|u| Self::All(u.1))
                .ok_or_else(|| {
                    let names: Vec<_> = UNIFORM.iter().map(|u| u.0.to_lowercase()).collect();
                    format!(
                        "unknown quantization `{other}` (q4_0, q4_k_m, {})",
                        names.join(", ")
                    )
                }),
        }
    }
}

impl Quant {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4KM => "Q4_K_M",
            Self::All(t) => UNIFORM.iter().find(|u| u.1 == t).map_or("?", |u| u.0),
        }
    }

    /// llama.cpp's `general.file_type` for it.
    fn file_type(self) -> u32 {
        match self {
            Self::Q4_0 => 2,
            Self::Q4KM => 15,
            Self::All(t) => UNIFORM.iter().find(|u| u.1 == t).map_or(0, |u| u.2),
        }
    }

    /// The type of a matrix: `kind` is its name after `blk.N.`.
    fn of(self, kind: &str, layer: Option<usize>, layers: usize) -> TensorType {
        match self {
            Self::Q4_0 => TensorType::Q4_0,
            Self::All(t) => t,
            Self::Q4KM => {
                let more_bits = layer.is_none_or(|i| {
                    i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2
                });
                let wide = matches!(
                    kind,
                    "attn_v.weight" | "ffn_down.weight" | "ffn_down_exps.weight" | "output.weight"
                );
                if wide && more_bits {
                    TensorType::Q6K
                } else {
                    TensorType::Q4K
                }
            }
        }
    }
}

/// Uniform noise in `[-scale, scale]` from a xorshift stream.
struct Noise(u64);

impl Noise {
    fn fill(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

/// `values` (`dims`, outermost first) in type `ty`: candle's quantizers
/// (ggml's reference ones), the kernels' for the i-quants.
fn quantize(name: String, values: Vec<f32>, dims: &[usize], ty: TensorType) -> Result<WriteTensor> {
    let bytes = match ty.candle() {
        Some(dt) => {
            let t = Tensor::from_vec(values, dims, &Device::Cpu)?;
            QTensor::quantize(&t, dt)?.data()?.to_vec()
        }
        None => {
            let block: fn(&[f32]) -> Vec<u8> = if ty == TensorType::Iq4Xs {
                kernels::iquant::quantize_iq4xs
            } else {
                kernels::iquant::quantize_iq4nl
            };
            values
                .chunks_exact(ty.block_weights())
                .flat_map(block)
                .collect()
        }
    };
    Ok(WriteTensor {
        name,
        ty,
        dims: dims.to_vec(),
        bytes,
    })
}

fn matrix(
    name: String,
    noise: &mut Noise,
    (rows, cols): (usize, usize),
    ty: TensorType,
) -> Result<WriteTensor> {
    let ty = fallback(cols, ty);
    let scale = (3.0 / cols as f32).sqrt();
    quantize(name, noise.fill(rows * cols, scale), &[rows, cols], ty)
}

/// As llama.cpp does where a row is not a whole number of 256-blocks
/// (Qwen2's 896): Q5_0 for Q4_K, Q8_0 for Q6_K, IQ4_NL for IQ4_XS.
fn fallback(cols: usize, ty: TensorType) -> TensorType {
    match (cols.is_multiple_of(256), ty) {
        (false, TensorType::Q4K) => TensorType::Q5_0,
        (false, TensorType::Q6K) => TensorType::Q8_0,
        (false, TensorType::Iq4Xs) => TensorType::Iq4Nl,
        (_, other) => other,
    }
}

fn vector(name: String, values: Vec<f32>) -> Result<WriteTensor> {
    let n = values.len();
    quantize(name, values, &[n], TensorType::F32)
}

/// Every tensor of `shape`, named as llama.cpp names them.
fn tensors(shape: &Shape, quant: Quant, seed: u64) -> Result<Vec<WriteTensor>> {
    let mut noise = Noise(seed | 1);
    let h = shape.hidden;
    let mut out = Vec::new();
    let embd = quant.of("token_embd.weight", None, shape.layers);
    // llama.cpp keeps the embedding in Q4_K for Q4_K_M, Q4_0 for Q4_0.
    let embd = if quant == Quant::Q4KM && embd == TensorType::Q6K {
        TensorType::Q4K
    } else {
        embd
    };
    out.push(matrix(
        "token_embd.weight".into(),
        &mut noise,
        (shape.vocab, h),
        embd,
    )?);
    for i in 0..shape.layers {
        layer(&mut out, shape, quant, &mut noise, i)?;
    }
    out.push(vector("output_norm.weight".into(), vec![1.0; h])?);
    if let Some(scaling) = shape.llama3_rope {
        let factors = llama3_rope_factors(shape.rope_theta, shape.rot_dim(), scaling);
        out.push(vector("rope_freqs.weight".into(), factors)?);
    }
    if shape.longrope.is_some() {
        let [long, short] = longrope_factors(shape.rot_dim());
        out.push(vector("rope_factors_long.weight".into(), long)?);
        out.push(vector("rope_factors_short.weight".into(), short)?);
    }
    if !shape.tied {
        let dt = quant.of("output.weight", None, shape.layers);
        out.push(matrix(
            "output.weight".into(),
            &mut noise,
            (shape.vocab, h),
            dt,
        )?);
    }
    Ok(out)
}

/// Layer `i`'s tensors, in the order llama.cpp's converter writes them.
fn layer(
    out: &mut Vec<WriteTensor>,
    shape: &Shape,
    quant: Quant,
    noise: &mut Noise,
    i: usize,
) -> Result<()> {
    let h = shape.hidden;
    let (q, kv) = (
        shape.heads * shape.head_dim(),
        shape.kv_heads * shape.head_dim(),
    );
    let p = format!("blk.{i}");
    let dt = |k: &str| quant.of(k, Some(i), shape.layers);
    out.push(vector(format!("{p}.attn_norm.weight"), vec![1.0; h])?);
    let qkv: &[(&str, usize)] = if shape.stacked {
        &[("attn_qkv", q + 2 * kv)]
    } else {
        &[("attn_q", q), ("attn_k", kv), ("attn_v", kv)]
    };
    for &(k, rows) in qkv {
        let name = format!("{k}.weight");
        out.push(matrix(format!("{p}.{name}"), noise, (rows, h), dt(&name))?);
        if shape.qkv_bias {
            out.push(vector(format!("{p}.{k}.bias"), noise.fill(rows, 0.02))?);
        }
    }
    if shape.qk_norm {
        // Weights around one, as trained ones are, so that a missed or
        // misplaced norm shows.
        for k in ["attn_q_norm", "attn_k_norm"] {
            let w = noise
                .fill(shape.head_dim(), 0.5)
                .iter()
                .map(|x| 1.0 + x)
                .collect();
            out.push(vector(format!("{p}.{k}.weight"), w)?);
        }
    }
    let wo = dt("attn_output.weight");
    out.push(matrix(
        format!("{p}.attn_output.weight"),
        noise,
        (h, q),
        wo,
    )?);
    if shape.gemma {
        let w = noise.fill(h, 0.5).iter().map(|x| 1.0 + x).collect();
        out.push(vector(format!("{p}.post_attention_norm.weight"), w)?);
    }
    out.push(vector(format!("{p}.ffn_norm.weight"), vec![1.0; h])?);
    let Some(e) = shape.experts else {
        let ffn: &[(&str, (usize, usize))] = if shape.stacked {
            &[("ffn_up", (2 * shape.ffn, h)), ("ffn_down", (h, shape.ffn))]
        } else {
            &[
                ("ffn_gate", (shape.ffn, h)),
                ("ffn_up", (shape.ffn, h)),
                ("ffn_down", (h, shape.ffn)),
            ]
        };
        for &(k, dims) in ffn {
            let name = format!("{k}.weight");
            out.push(matrix(format!("{p}.{name}"), noise, dims, dt(&name))?);
        }
        if shape.gemma {
            let w = noise.fill(h, 0.5).iter().map(|x| 1.0 + x).collect();
            out.push(vector(format!("{p}.post_ffw_norm.weight"), w)?);
        }
        return Ok(());
    };
    // The router stays in F32, as llama.cpp's quantize leaves it. Its
    // logits spread about four nats (a trained router's are as decided),
    // so that no token of the parity prompts sits on a near tie between
    // its last chosen expert and the next, where the rounding of any two
    // implementations may choose apart.
    let router = noise.fill(e.count * h, 4.0 * (3.0 / h as f32).sqrt());
    out.push(quantize(
        format!("{p}.ffn_gate_inp.weight"),
        router,
        &[e.count, h],
        TensorType::F32,
    )?);
    for (k, (rows, cols)) in [
        ("ffn_gate_exps", (e.ffn, h)),
        ("ffn_up_exps", (e.ffn, h)),
        ("ffn_down_exps", (h, e.ffn)),
    ] {
        let name = format!("{k}.weight");
        let ty = fallback(cols, dt(&name));
        let scale = (3.0 / cols as f32).sqrt();
        let values = noise.fill(e.count * rows * cols, scale);
        out.push(quantize(
            format!("{p}.{name}"),
            values,
            &[e.count, rows, cols],
            ty,
        )?);
    }
    Ok(())
}

/// LongRoPE's two sets of per-pair divisors, long and short, shaped as
/// Phi-3.5's are: one for the fast pairs, growing toward the slow ones
/// (to about 40 for the long set, 1.5 for the short).
pub fn longrope_factors(head_dim: usize) -> [Vec<f32>; 2] {
    let half = head_dim / 2;
    let at = |top: f32| {
        (0..half)
            .map(|i| 1.0 + (top - 1.0) * (i as f32 / (half - 1) as f32).powi(2))
            .collect()
    };
    [at(40.0), at(1.5)]
}

/// The per-pair divisors of the rotary angles that give Llama 3's scaled
/// frequencies: 1 for short wavelengths, `factor` for long ones, a smooth
/// mix between (llama.cpp's converter, `LlamaModel.generate_extra_tensors`).
pub fn llama3_rope_factors(base: f32, head_dim: usize, scaling: (f32, f32, f32, f32)) -> Vec<f32> {
    let (factor, low, high, original) = scaling;
    let (low_wave, high_wave) = (original / low, original / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f32 / head_dim as f32);
            let wave = 2.0 * std::f32::consts::PI / freq;
            if wave < high_wave {
                1.0
            } else if wave > low_wave {
                factor
            } else {
                let smooth = (original / wave - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// The source's `tokenizer.*` keys, its token lists padded to `vocab`.
fn tokenizer(source: &Gguf, vocab: usize) -> Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for (k, v) in &source.metadata {
        if !k.starts_with("tokenizer.") {
            continue;
        }
        let v = match (k.as_str(), v) {
            ("tokenizer.ggml.tokens", Value::Array(a)) => {
                if a.len() > vocab {
                    bail!(
                        "the tokenizer has {} tokens, more than the shape's {vocab}",
                        a.len()
                    );
                }
                let mut a = a.clone();
                a.extend((a.len()..vocab).map(|i| Value::String(format!("<|unused_{i}|>"))));
                Value::Array(a)
            }
            // Padding tokens are "unused" (5).
            ("tokenizer.ggml.token_type", Value::Array(a)) => {
                let mut a = a.clone();
                a.resize(vocab, Value::I32(5));
                Value::Array(a)
            }
            ("tokenizer.ggml.scores", Value::Array(a)) => {
                let mut a = a.clone();
                a.resize(vocab, Value::F32(0.0));
                Value::Array(a)
            }
            (_, v) => v.clone(),
        };
        out.push((k.clone(), v));
    }
    if out.is_empty() {
        bail!("the tokenizer source has no tokenizer.* keys");
    }
    // In key order: the same seed writes the same bytes.
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The model's metadata: llama.cpp's keys for `shape`, and the tokenizer.
fn metadata(shape: &Shape, quant: Quant, tok: Vec<(String, Value)>) -> Vec<(String, Value)> {
    let a = shape.arch;
    let u = |v: usize| Value::U32(v as u32);
    let mut m = vec![
        ("general.architecture".to_string(), Value::String(a.into())),
        (
            "general.name".to_string(),
            Value::String(format!(
                "synor-bench {} {} (random weights)",
                shape.name,
                quant.as_str()
            )),
        ),
        (
            "general.file_type".to_string(),
            Value::U32(quant.file_type()),
        ),
        (format!("{a}.context_length"), u(8192)),
        (format!("{a}.embedding_length"), u(shape.hidden)),
        (format!("{a}.block_count"), u(shape.layers)),
        (format!("{a}.feed_forward_length"), u(shape.ffn)),
        (format!("{a}.attention.head_count"), u(shape.heads)),
        (format!("{a}.attention.head_count_kv"), u(shape.kv_heads)),
        (format!("{a}.rope.dimension_count"), u(shape.rot_dim())),
        (format!("{a}.rope.freq_base"), Value::F32(shape.rope_theta)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{a}.vocab_size"), u(shape.vocab)),
    ];
    if let Some(d) = shape.head_dim {
        m.push((format!("{a}.attention.key_length"), u(d)));
        m.push((format!("{a}.attention.value_length"), u(d)));
    }
    if shape.window > 0 {
        m.push((format!("{a}.attention.sliding_window"), u(shape.window)));
    }
    if let Some(original) = shape.longrope {
        // Phi-3's converter: sqrt(1 + ln(context / original) / ln(original)).
        let scale = 8192.0 / original as f32;
        let factor = (1.0 + scale.ln() / (original as f32).ln()).sqrt();
        m.push((
            format!("{a}.rope.scaling.original_context_length"),
            u(original),
        ));
        m.push((format!("{a}.rope.scaling.attn_factor"), Value::F32(factor)));
    }
    if let Some((attn, last)) = shape.softcaps {
        m.push((format!("{a}.attn_logit_softcapping"), Value::F32(attn)));
        m.push((format!("{a}.final_logit_softcapping"), Value::F32(last)));
    }
    if let Some(e) = shape.experts {
        m.push((format!("{a}.expert_count"), u(e.count)));
        m.push((format!("{a}.expert_used_count"), u(e.used)));
        if a == "llama" {
            // Mixtral's converter writes the expert width as the FFN's.
            m.iter_mut()
                .filter(|(k, _)| *k == format!("{a}.feed_forward_length"))
                .for_each(|(_, v)| *v = u(e.ffn));
        } else {
            m.push((format!("{a}.expert_feed_forward_length"), u(e.ffn)));
        }
    }
    m.extend(tok);
    m
}

/// Writes a model of `shape` to `out`, its tokenizer from `tokenizer_gguf`.
pub fn generate(
    shape: &Shape,
    quant: Quant,
    tokenizer_gguf: &Path,
    out: &Path,
    seed: u64,
) -> Result<()> {
    let mut src = std::fs::File::open(tokenizer_gguf)
        .with_context(|| format!("opening {}", tokenizer_gguf.display()))?;
    let source = Gguf::read(&mut std::io::BufReader::new(&mut src))
        .context("reading the tokenizer's GGUF")?;
    let meta = metadata(shape, quant, tokenizer(&source, shape.vocab)?);
    let tensors = tensors(shape, quant, seed)?;
    let tmp = out.with_extension("gguf.part");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    engine::gguf::write(&mut w, &meta_refs, &tensors)?;
    use std::io::Write as _;
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// Tensor types by name, for tests and reports.
pub fn types(content: &Gguf) -> HashMap<String, TensorType> {
    content
        .tensors
        .iter()
        .map(|(k, t)| (k.clone(), t.ty))
        .collect()
}

mod shapes;

pub use shapes::{
    Experts, PARITY, PARITY_GEMMA2, PARITY_GEMMA3, PARITY_LLAMA3, PARITY_MIXTRAL, PARITY_PHI,
    PARITY_QWEN3, PARITY_QWEN3MOE, PARITY_SHAPES, SHAPES, Shape, shape,
};

#[cfg(test)]
mod tests;
