//! A decoder's hyper-parameters as its GGUF file states them, and what
//! each architecture we serve adds to the llama block (`Arch`): the RoPE
//! layout, per-head norms of q and k, routed experts, Gemma's block
//! (scaled embeddings, norms after attention and feed-forward, GeGLU,
//! sliding-window layers with their own RoPE base, Gemma 2's soft-capped
//! attention and logits). Phi-3's fused projections are the loader's to
//! find (`attn_qkv`, a gate-up `ffn_up`). An architecture not in `ARCHES`
//! is refused at load, naming the ones we read.

use super::rope::RopeSpec;
use crate::error::{EngineError, Result};
use crate::gguf::Gguf;
use crate::kv_cache::KvLayout;
use crate::tokenizer::gguf::Meta;

/// What an architecture adds to the llama block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arch {
    /// `general.architecture`.
    pub name: &'static str,
    /// NeoX RoPE pairs (`i, i + d/2`) rather than interleaved ones.
    pub neox: bool,
    /// RMSNorm of every head of q and k before RoPE (`attn_q_norm`,
    /// `attn_k_norm`, one `[head_dim]` weight each).
    pub qk_norm: bool,
    /// Whether the feed-forward is routed experts: `Some(true)` always,
    /// `Some(false)` never, `None` as `{arch}.expert_count` says (Mixtral
    /// is a `llama` file with experts).
    pub experts: Option<bool>,
    /// Gemma's block: embeddings times `sqrt(hidden)`, RMSNorm of the
    /// attention's and the feed-forward's outputs before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`), GeGLU, and the sliding layers'
    /// RoPE at `{arch}.rope.freq_base_swa` (10000 unless given).
    pub gemma: bool,
    /// Sliding-window layers where `{arch}.attention.sliding_window` is
    /// set, as llama.cpp's `set_swa_pattern(n)`: layer `i` slides when `i %
    /// n < n - 1` (`{arch}.attention.sliding_window_pattern` overrides `n`);
    /// `None`: the architecture has none. Llama's and Mistral's files may
    /// state a window (Mistral 7B v0.1's 4096) that llama.cpp does not
    /// apply, and neither do we: the golden logits are llama.cpp's, and
    /// Mistral's later models dropped the window.
    pub swa_pattern: Option<u32>,
    /// The window where the file states none (Gemma 2's 4096, as
    /// llama.cpp assumes); 0: without `{arch}.attention.sliding_window`
    /// no layer slides.
    pub default_window: u32,
    /// Soft-capping that is on whatever the file says, and its default
    /// caps (attention, final logits): Gemma 2's `(50, 30)`, read from
    /// `{arch}.attn_logit_softcapping` and `{arch}.final_logit_softcapping`
    /// where given. Without it only a file's own final cap applies.
    pub softcaps: Option<(f32, f32)>,
}

/// What an architecture has unless it says otherwise: a dense block with
/// NeoX RoPE, no per-head norms, no sliding window, no soft-caps.
const DENSE: Arch = Arch {
    name: "",
    neox: true,
    qk_norm: false,
    experts: Some(false),
    gemma: false,
    swa_pattern: None,
    default_window: 0,
    softcaps: None,
};

/// The architectures we read, as llama.cpp builds each.
pub const ARCHES: [Arch; 8] = [
    Arch {
        name: "llama",
        neox: false,
        experts: None,
        ..DENSE
    },
    Arch {
        name: "mistral",
        neox: false,
        ..DENSE
    },
    Arch {
        name: "qwen2",
        ..DENSE
    },
    Arch {
        name: "qwen3",
        qk_norm: true,
        ..DENSE
    },
    Arch {
        name: "qwen3moe",
        qk_norm: true,
        experts: Some(true),
        ..DENSE
    },
    Arch {
        name: "gemma3",
        qk_norm: true,
        gemma: true,
        swa_pattern: Some(6),
        ..DENSE
    },
    Arch {
        name: "gemma2",
        gemma: true,
        swa_pattern: Some(2),
        default_window: 4096,
        softcaps: Some((50.0, 30.0)),
        ..DENSE
    },
    // llama.cpp turns Phi-3's sliding window off (its converters wrote the
    // window without the layers it applies to): so do we.
    Arch {
        name: "phi3",
        ..DENSE
    },
];

impl Arch {
    /// The architecture named `name`, or a refusal listing ours.
    pub fn named(name: &str) -> Result<Self> {
        ARCHES
            .iter()
            .find(|a| a.name == name)
            .copied()
            .ok_or_else(|| {
                let ours: Vec<&str> = ARCHES.iter().map(|a| a.name).collect();
                EngineError::Load(format!(
                    "architecture `{name}` is not supported ({})",
                    ours.join(", ")
                ))
            })
    }
}

/// Routed experts: each token's feed-forward is the weighted sum of the
/// `n_used` experts (of `n_expert`) its router scores highest, the
/// weights the router's softmax over all experts, renormalized over the
/// chosen ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_used: usize,
}

/// Sliding-window attention: the window, and which layers use it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// One flag per layer: whether it slides.
    pub layers: Vec<bool>,
}

/// Architecture hyper-parameters read from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub architecture: String,
    pub n_layer: usize,
    pub hidden: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    /// `{arch}.attention.key_length` where the file gives it (Qwen3's 128
    /// over a 1024 or 2560 hidden size), else `hidden / n_head`.
    pub head_dim: usize,
    pub rms_eps: f32,
    /// Rotary embedding as the file says (`rope`).
    pub rope: RopeSpec,
    pub context_length: usize,
    /// The context the RoPE was trained for before any extension
    /// (`{arch}.rope.scaling.original_context_length`, else
    /// `context_length`): LongRoPE's long factors apply past it.
    pub rope_original_context: usize,
    pub vocab_size: usize,
    /// Per-head RMSNorm of q and k (Qwen3).
    pub qk_norm: bool,
    /// Routed experts in place of the dense feed-forward.
    pub moe: Option<MoeConfig>,
    /// Gemma's block (`Arch::gemma`).
    pub gemma: bool,
    /// Sliding-window layers, if any.
    pub swa: Option<SlidingWindow>,
    /// The sliding layers' RoPE, where it differs (Gemma 3's local base).
    pub rope_local: Option<RopeSpec>,
    /// The factor queries are scaled by before attention's own
    /// `1/sqrt(head_dim)` (Gemma 3 27B scales by `hidden / n_head`).
    pub q_scale: f32,
    /// `cap * tanh(logit / cap)` on the output logits (Gemma 2's 30).
    pub final_softcap: Option<f32>,
    /// `cap * tanh(score / cap)` on attention scores (Gemma 2's 50).
    pub attn_softcap: Option<f32>,
}

impl LlamaConfig {
    /// Reads the `{arch}.*` keys llama.cpp writes.
    pub fn from_gguf(ct: &Gguf) -> Result<Self> {
        let meta = Meta(&ct.metadata);
        let arch = Arch::named(meta.string("general.architecture")?)?;
        let key = |k: &str| format!("{}.{k}", arch.name);
        let n_head = meta.u32(&key("attention.head_count"))? as usize;
        let hidden = meta.u32(&key("embedding_length"))? as usize;
        let vocab_size = ct
            .tensors
            .get("token_embd.weight")
            .map(|t| t.dims[0])
            .ok_or_else(|| EngineError::Load("GGUF has no token_embd.weight".into()))?;
        let head_dim = head_dim(&meta, arch.name, hidden, n_head)?;
        let n_layer = meta.u32(&key("block_count"))? as usize;
        let context_length = meta
            .u32(&key("context_length"))
            .map_or(2048, |v| v as usize);
        let config = Self {
            n_layer,
            hidden,
            n_head,
            n_kv_head: meta
                .u32(&key("attention.head_count_kv"))
                .map_or(n_head, |v| v as usize),
            head_dim,
            rms_eps: meta
                .f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            rope: RopeSpec::from_meta(&meta, arch.name, arch.neox, head_dim)?,
            context_length,
            rope_original_context: meta
                .u32(&key("rope.scaling.original_context_length"))
                .map_or(context_length, |v| v as usize),
            vocab_size,
            qk_norm: arch.qk_norm,
            moe: moe(&meta, &arch)?,
            gemma: arch.gemma,
            swa: sliding_window(&meta, &arch, n_layer)?,
            rope_local: None,
            q_scale: 1.0,
            final_softcap: softcap(
                &meta,
                &key("final_logit_softcapping"),
                arch.softcaps.map(|c| c.1),
            ),
            attn_softcap: softcap(
                &meta,
                &key("attn_logit_softcapping"),
                arch.softcaps.map(|c| c.0),
            ),
            architecture: arch.name.to_string(),
        };
        let config = gemma_extras(config, &meta)?;
        config.check()?;
        Ok(config)
    }

    /// The attention window of layer `layer` (0: every earlier position).
    pub fn window(&self, layer: usize) -> usize {
        match &self.swa {
            Some(s) if s.layers.get(layer).copied().unwrap_or(false) => s.window,
            Some(_) | None => 0,
        }
    }

    /// The window and the number of sliding layers, where some layers
    /// slide and some see everything: their KV can then live in blocks of
    /// their own, released behind the window (`KvManager::with_sliding`).
    pub fn sliding_kv(&self) -> Option<(usize, usize)> {
        let s = self.swa.as_ref().filter(|s| s.window > 0)?;
        let n = s.layers.iter().take(self.n_layer).filter(|&&l| l).count();
        (n > 0 && n < self.n_layer).then_some((s.window, n))
    }

    /// Each layer's block table of a sequence whose full-attention layers
    /// read `full` and sliding ones `swa` (empty: every layer reads `full`).
    pub fn layer_tables<'a>(&self, full: &'a [u32], swa: &'a [u32]) -> Vec<&'a [u32]> {
        (0..self.n_layer)
            .map(|l| {
                if self.window(l) > 0 && !swa.is_empty() {
                    swa
                } else {
                    full
                }
            })
            .collect()
    }

    fn check(&self) -> Result<()> {
        let ok = self.n_head > 0
            && self.n_kv_head > 0
            && self.n_head.is_multiple_of(self.n_kv_head)
            && self.head_dim > 0
            && self.head_dim.is_multiple_of(2)
            && self.hidden > 0;
        if ok {
            Ok(())
        } else {
            Err(EngineError::Load(format!(
                "inconsistent attention shape: {self:?}"
            )))
        }
    }

    /// Width of all query heads together (`hidden` for most models).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
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
            sliding: None,
        }
    }
}

/// The head width: `key_length`, which must equal `value_length` where
/// both are given (the KV cache holds one width), else `hidden / n_head`.
fn head_dim(meta: &Meta<'_>, arch: &str, hidden: usize, n_head: usize) -> Result<usize> {
    let k = meta.u32(&format!("{arch}.attention.key_length")).ok();
    let v = meta.u32(&format!("{arch}.attention.value_length")).ok();
    match (k, v) {
        (Some(k), Some(v)) if k != v => Err(EngineError::Load(format!(
            "key heads of {k} and value heads of {v} differ; the KV cache holds one width"
        ))),
        (Some(k), _) => Ok(k as usize),
        (None, _) => Ok(hidden / n_head.max(1)),
    }
}

/// The sliding-window layers the metadata declares, if the architecture
/// has them.
fn sliding_window(meta: &Meta<'_>, arch: &Arch, n_layer: usize) -> Result<Option<SlidingWindow>> {
    let Some(default) = arch.swa_pattern else {
        return Ok(None);
    };
    let key = |k: &str| format!("{}.attention.{k}", arch.name);
    let window = match meta.u32(&key("sliding_window")) {
        Ok(w) if w > 0 => w as usize,
        Ok(_) => return Ok(None),
        Err(_) if arch.default_window > 0 => arch.default_window as usize,
        Err(_) => return Ok(None),
    };
    let layers = match meta.array(&key("sliding_window_pattern")) {
        Ok(flags) => flags
            .iter()
            .map(|v| v.to_bool().map_err(|e| EngineError::Load(e.to_string())))
            .collect::<Result<Vec<bool>>>()?,
        Err(_) => {
            let n = meta.u32(&key("sliding_window_pattern")).unwrap_or(default);
            (0..n_layer as u32)
                .map(|i| n == 0 || i % n < n - 1)
                .collect()
        }
    };
    if layers.len() != n_layer {
        return Err(EngineError::Load(format!(
            "{} sliding-window flags for {n_layer} layers",
            layers.len()
        )));
    }
    Ok(Some(SlidingWindow { window, layers }))
}

/// A soft-cap: the file's where it gives one (0 turns it off), else the
/// architecture's default.
fn softcap(meta: &Meta<'_>, key: &str, default: Option<f32>) -> Option<f32> {
    meta.f32(key)
        .ok()
        .or(default)
        .filter(|c| c.is_finite() && *c > 0.0)
}

/// Gemma's own settings: the sliding layers' RoPE (Gemma 3's base
/// `rope.freq_base_swa`, default 10000, unscaled; Gemma 2's the global
/// one unless the file says) and the 27B's query scale.
fn gemma_extras(mut c: LlamaConfig, meta: &Meta<'_>) -> Result<LlamaConfig> {
    if !c.gemma {
        return Ok(c);
    }
    let gemma3 = c.architecture == "gemma3";
    let base = meta
        .f32(&format!("{}.rope.freq_base_swa", c.architecture))
        .ok()
        .or(gemma3.then_some(10_000.0));
    c.rope_local = base.map(|b| RopeSpec::plain(b, c.rope.neox));
    // llama.cpp's rule (gemma_pytorch's config): the 27B, and only it,
    // scales queries by 1/sqrt(hidden / n_head), not 1/sqrt(head_dim).
    if c.n_layer == if gemma3 { 62 } else { 46 } {
        let want = 1.0 / ((c.hidden / c.n_head) as f32).sqrt();
        c.q_scale = want * (c.head_dim as f32).sqrt();
    }
    Ok(c)
}

/// The experts the metadata declares, checked against the architecture.
fn moe(meta: &Meta<'_>, arch: &Arch) -> Result<Option<MoeConfig>> {
    let count = |k: &str| {
        meta.u32(&format!("{}.{k}", arch.name))
            .map_or(0, |v| v as usize)
    };
    let (n_expert, n_used) = (count("expert_count"), count("expert_used_count"));
    let moe = match (arch.experts, n_expert) {
        (Some(false), _) | (None, 0) => return Ok(None),
        (Some(true), 0) => {
            return Err(EngineError::Load(format!(
                "`{}` needs {}.expert_count",
                arch.name, arch.name
            )));
        }
        (Some(true) | None, _) => MoeConfig { n_expert, n_used },
    };
    if moe.n_used == 0 || moe.n_used > moe.n_expert {
        return Err(EngineError::Load(format!(
            "{} of {} experts used per token",
            moe.n_used, moe.n_expert
        )));
    }
    Ok(Some(moe))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_architecture_we_do_not_read_is_refused_naming_ours() {
        let err = Arch::named("phimoe").expect_err("refused").to_string();
        assert!(
            err.contains("`phimoe` is not supported")
                && err.contains("llama, mistral, qwen2, qwen3, qwen3moe, gemma3, gemma2, phi3"),
            "{err}"
        );
        // Gemma 2 slides every other layer over 4096 positions where the
        // file states no window; Gemma 3 then has none.
        let empty = std::collections::HashMap::new();
        let swa = |name| sliding_window(&Meta(&empty), &Arch::named(name).expect("read"), 4);
        assert_eq!(
            swa("gemma2").expect("read"),
            Some(SlidingWindow {
                window: 4096,
                layers: vec![true, false, true, false]
            })
        );
        assert_eq!(swa("gemma3").expect("read"), None);
        let g = Arch::named("gemma3").expect("read");
        assert!(g.gemma && g.qk_norm && g.neox && g.swa_pattern == Some(6));
        assert_eq!(Arch::named("qwen3moe").expect("read").experts, Some(true));
    }
}
