//! The shapes `synor-genmodel` writes: real models' (the benchmarks')
//! and the parity tests' small ones, one per architecture.

use anyhow::{Context, Result};

/// A model's shape (the `{arch}.*` keys and the tensors they imply).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub arch: &'static str,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// `attn_q/k/v` carry biases (Qwen2).
    pub qkv_bias: bool,
    /// No `output.weight`: the embedding is the output projection.
    pub tied: bool,
    pub rope_theta: f32,
    /// Llama 3's rotary scaling (factor, low and high frequency factors,
    /// original context), written as `rope_freqs.weight` the way
    /// llama.cpp's converter does.
    pub llama3_rope: Option<(f32, f32, f32, f32)>,
    /// `{arch}.attention.key_length` where heads are not `hidden / heads`
    /// wide (Qwen3); `None`: `hidden / heads`, and the key is not written.
    pub head_dim: Option<usize>,
    /// Per-head RMSNorm weights of q and k (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Routed experts in place of the dense feed-forward.
    pub experts: Option<Experts>,
    /// Gemma's block: norms after attention and feed-forward
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub gemma: bool,
    /// `{arch}.attention.sliding_window` (0: not written).
    pub window: usize,
    /// Phi-3's stacked projections: one `attn_qkv`, one gate-up `ffn_up`.
    pub stacked: bool,
    /// Phi-3's LongRoPE: the original context (the long and short factor
    /// sets and the `cos`/`sin` factor are written with it).
    pub longrope: Option<usize>,
    /// Gemma 2's soft-caps (attention, final logits), written as keys.
    pub softcaps: Option<(f32, f32)>,
    /// The rotated dimensions of a head where fewer than all
    /// (`rope.dimension_count`; Phi-4-mini turns 96 of 128).
    pub rotary: Option<usize>,
}

/// What a shape has unless it says otherwise: a plain llama block.
const PLAIN: Shape = Shape {
    name: "",
    arch: "llama",
    hidden: 0,
    layers: 0,
    heads: 0,
    kv_heads: 0,
    ffn: 0,
    vocab: 0,
    qkv_bias: false,
    tied: false,
    rope_theta: 10_000.0,
    llama3_rope: None,
    head_dim: None,
    qk_norm: false,
    experts: None,
    gemma: false,
    window: 0,
    stacked: false,
    longrope: None,
    softcaps: None,
    rotary: None,
};

/// A mixture of experts: `count` experts of `ffn` width, `used` a token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Experts {
    pub count: usize,
    pub used: usize,
    pub ffn: usize,
}

impl Shape {
    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads)
    }

    /// The rotated width of one attention head.
    pub fn rot_dim(&self) -> usize {
        self.rotary.unwrap_or(self.head_dim())
    }
}

/// Llama 3.2's `rope_scaling`.
const LLAMA32_ROPE: Option<(f32, f32, f32, f32)> = Some((32.0, 1.0, 4.0, 8192.0));

/// The shapes of Llama-3.2-1B and -3B, Qwen2.5-0.5B, Qwen3-4B,
/// Qwen3-30B-A3B and Gemma-3-4B.
pub const SHAPES: [Shape; 6] = [
    Shape {
        name: "llama-1b",
        arch: "llama",
        hidden: 2048,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        ffn: 8192,
        vocab: 128_256,
        tied: true,
        rope_theta: 500_000.0,
        llama3_rope: LLAMA32_ROPE,
        ..PLAIN
    },
    Shape {
        name: "llama-3b",
        arch: "llama",
        hidden: 3072,
        layers: 28,
        heads: 24,
        kv_heads: 8,
        ffn: 8192,
        vocab: 128_256,
        tied: true,
        rope_theta: 500_000.0,
        llama3_rope: LLAMA32_ROPE,
        ..PLAIN
    },
    Shape {
        name: "qwen2-0.5b",
        arch: "qwen2",
        hidden: 896,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        ffn: 4864,
        vocab: 151_936,
        qkv_bias: true,
        tied: true,
        rope_theta: 1_000_000.0,
        ..PLAIN
    },
    Shape {
        name: "qwen3-4b",
        arch: "qwen3",
        hidden: 2560,
        layers: 36,
        heads: 32,
        kv_heads: 8,
        ffn: 9728,
        vocab: 151_936,
        tied: true,
        rope_theta: 1_000_000.0,
        head_dim: Some(128),
        qk_norm: true,
        ..PLAIN
    },
    // Qwen3-30B-A3B: 128 experts of 768, 8 a token.
    Shape {
        name: "qwen3-30b-a3b",
        arch: "qwen3moe",
        hidden: 2048,
        layers: 48,
        heads: 32,
        kv_heads: 4,
        ffn: 6144,
        vocab: 151_936,
        rope_theta: 1_000_000.0,
        head_dim: Some(128),
        qk_norm: true,
        experts: Some(Experts {
            count: 128,
            used: 8,
            ffn: 768,
        }),
        ..PLAIN
    },
    // Gemma 3 4B: 34 layers, five of six sliding over 1024 positions.
    Shape {
        name: "gemma3-4b",
        arch: "gemma3",
        hidden: 2560,
        layers: 34,
        heads: 8,
        kv_heads: 4,
        ffn: 10_240,
        vocab: 262_144,
        tied: true,
        rope_theta: 1_000_000.0,
        head_dim: Some(256),
        qk_norm: true,
        gemma: true,
        window: 1024,
        ..PLAIN
    },
];

/// A small llama for the parity tests (one file per weight type, each
/// compared with llama.cpp on the same file): every row a whole number of
/// 256-blocks, so each type applies to every matrix as named.
pub const PARITY: Shape = Shape {
    name: "parity-llama",
    arch: "llama",
    hidden: 256,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    ffn: 768,
    vocab: 49_152,
    ..PLAIN
};

/// `PARITY` with Llama 3.2's rotary scaling (`rope_freqs.weight`) and base.
pub const PARITY_LLAMA3: Shape = Shape {
    name: "parity-llama3",
    rope_theta: 500_000.0,
    llama3_rope: LLAMA32_ROPE,
    ..PARITY
};

/// Qwen3's block at parity size: heads 128 wide over a 256 hidden size
/// (so the q projection is wider than the hidden state, as in Qwen3-4B),
/// and per-head norms of q and k.
pub const PARITY_QWEN3: Shape = Shape {
    name: "parity-qwen3",
    arch: "qwen3",
    rope_theta: 1_000_000.0,
    head_dim: Some(128),
    qk_norm: true,
    ..PARITY
};

/// Qwen3-MoE's block at parity size: 16 experts, 4 a token.
pub const PARITY_QWEN3MOE: Shape = Shape {
    name: "parity-qwen3moe",
    arch: "qwen3moe",
    experts: Some(Experts {
        count: 16,
        used: 4,
        ffn: 256,
    }),
    ..PARITY_QWEN3
};

/// Mixtral's block (a `llama` file with experts) at parity size: 8
/// experts, 2 a token.
pub const PARITY_MIXTRAL: Shape = Shape {
    name: "parity-mixtral",
    experts: Some(Experts {
        count: 8,
        used: 2,
        ffn: 512,
    }),
    ..PARITY
};

/// Gemma 3's block at parity size: six layers, so that the last is the
/// global one of llama.cpp's default pattern (five sliding, one global),
/// an 8-position window the parity prompts run far past, tied embeddings.
pub const PARITY_GEMMA3: Shape = Shape {
    name: "parity-gemma3",
    arch: "gemma3",
    layers: 6,
    kv_heads: 1,
    tied: true,
    rope_theta: 1_000_000.0,
    head_dim: Some(128),
    qk_norm: true,
    gemma: true,
    window: 8,
    ..PARITY
};

/// Gemma 2's block at parity size: every other layer sliding (layers 0,
/// 2), no norms of q and k, and soft-caps low enough that the parity
/// prompts' scores and logits reach them (Gemma 2's own are 50 and 30).
pub const PARITY_GEMMA2: Shape = Shape {
    name: "parity-gemma2",
    arch: "gemma2",
    layers: 4,
    head_dim: Some(128),
    qk_norm: false,
    softcaps: Some((1.0, 8.0)),
    ..PARITY_GEMMA3
};

/// Phi-3's block at parity size: Q, K and V in one `attn_qkv`, gate and up
/// in one `ffn_up`, LongRoPE's long factors (the file's 8192 context is
/// past its original 1024) and their `cos`/`sin` factor, and Phi-4-mini's
/// partial rotary embedding (three quarters of each head). Not named
/// "phi3": llama.cpp gives the special tokens of a model so named Phi-3's
/// whitespace rules, which need Phi-3's vocabulary.
pub const PARITY_PHI: Shape = Shape {
    name: "parity-phi",
    arch: "phi3",
    stacked: true,
    longrope: Some(1024),
    rotary: Some(48),
    ..PARITY
};

/// The parity tests' shapes.
pub const PARITY_SHAPES: [Shape; 8] = [
    PARITY,
    PARITY_LLAMA3,
    PARITY_QWEN3,
    PARITY_QWEN3MOE,
    PARITY_MIXTRAL,
    PARITY_GEMMA3,
    PARITY_GEMMA2,
    PARITY_PHI,
];

/// The shape named `name`.
pub fn shape(name: &str) -> Result<Shape> {
    SHAPES
        .iter()
        .chain(&PARITY_SHAPES)
        .find(|s| s.name == name)
        .copied()
        .with_context(|| {
            let names: Vec<_> = SHAPES
                .iter()
                .chain(&PARITY_SHAPES)
                .map(|s| s.name)
                .collect();
            format!("unknown shape `{name}` ({})", names.join(", "))
        })
}
