//! The compute-backend seam: the operations the llama and BERT forward
//! passes are made of, over memory the backend owns. A model is written
//! once over `Backend`: on the CPU (`cpu::backend::CpuBackend`), through
//! wgpu (`wgpu::WgpuBackend`, feature `wgpu`) and through CUDA
//! (`cuda::CudaBackend`, feature `cuda`). On a GPU, weights are uploaded
//! once with `matrix`, activations and the paged KV stay on the device
//! between operations, and only `to_host` brings rows back.
//!
//! Shapes: a `Tensor` is a row-major `[rows, cols]` f32 matrix (one row per
//! token); a `Matrix` is a weight `W` of `rows` outputs by `cols` inputs,
//! applied as `y = x · Wᵀ`; a `Vector` is a 1-D weight (a norm, a bias).

pub use crate::cpu::kv::KvLayout;
use crate::quant::{KernelError, QMatrix};

/// A weight matrix on the host, as loaded, before a backend takes it.
#[derive(Debug, Clone)]
pub enum HostMatrix {
    /// Quantized (Q4_0, Q4_1, Q8_0), in the kernels' layout.
    Quant(QMatrix),
    /// f32, row-major `rows x cols`.
    Dense {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
    /// f16 (or, `bf16`, bfloat16) bits, row-major `rows x cols`: kept at
    /// 16 bits on the CPU, widened to f32 (exactly) by the GPU backends.
    Half {
        bits: Vec<u16>,
        bf16: bool,
        rows: usize,
        cols: usize,
    },
}

/// 16-bit float bits widened to f32 (exact).
pub fn widen(bits: &[u16], bf16: bool) -> Vec<f32> {
    if bf16 {
        bits.iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect()
    } else {
        bits.iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect()
    }
}

/// f32 values rounded to f16 (or, `bf16`, bfloat16) bits: test weights for
/// the 16-bit paths.
pub fn narrow(values: &[f32], bf16: bool) -> Vec<u16> {
    if bf16 {
        values
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect()
    } else {
        values
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect()
    }
}

/// Checks that a half-precision matrix's bits are `rows x cols`.
pub fn check_half(bits: &[u16], rows: usize, cols: usize) -> Result<(), KernelError> {
    if bits.len() != rows * cols {
        return Err(KernelError::Shape {
            what: "half-precision matrix",
            expected: rows * cols,
            got: bits.len(),
        });
    }
    Ok(())
}

/// Checks that a dense matrix's data is `rows x cols` (what every backend's
/// `matrix` does first).
pub fn check_dense(data: &[f32], rows: usize, cols: usize) -> Result<(), KernelError> {
    if data.len() != rows * cols {
        return Err(KernelError::Shape {
            what: "dense matrix",
            expected: rows * cols,
            got: data.len(),
        });
    }
    Ok(())
}

/// Checks that every token id is a row of an embedding table of `rows`
/// (what every backend's `embed` does first).
pub fn check_ids(ids: &[u32], rows: usize) -> Result<(), KernelError> {
    match ids.iter().find(|&&id| id as usize >= rows) {
        Some(&bad) => Err(KernelError::Shape {
            what: "embedding row",
            expected: rows,
            got: bad as usize,
        }),
        None => Ok(()),
    }
}

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// A sliding window: a query at `pos` sees only positions
    /// `pos + 1 - window ..= pos` (llama.cpp's standard SWA); 0 sees all.
    pub window: usize,
    /// Attention logit soft-capping (Gemma 2): each scaled score `s`
    /// becomes `softcap * tanh(s / softcap)` before the softmax; 0: none.
    pub softcap: f32,
}

impl AttnShape {
    /// The first position a query at `pos` sees.
    pub fn first_visible(&self, pos: usize) -> usize {
        if self.window == 0 {
            0
        } else {
            (pos + 1).saturating_sub(self.window)
        }
    }

    /// Score `s` soft-capped as `softcap` says.
    pub fn cap(&self, s: f32) -> f32 {
        soft_cap(s, self.softcap)
    }
}

/// `cap * tanh(s / cap)`, as llama.cpp computes it (a scale, `tanhf`, a
/// scale); `cap` 0: `s` unchanged.
pub fn soft_cap(s: f32, cap: f32) -> f32 {
    if cap > 0.0 {
        (s * (1.0 / cap)).tanh() * cap
    } else {
        s
    }
}

/// Rotary embedding tables: `cos`/`sin` of position `p`, pair `i` at
/// `p * rot_dim / 2 + i`; pairs are `(2i, 2i+1)` (GGUF llama) or
/// `(i, i + rot_dim/2)` (NeoX, Qwen2) among a head's first `rot_dim`
/// dimensions, the rest left as they are (a partial rotary embedding,
/// Phi-4-mini's 96 of 128; `rot_dim == head_dim` turns the whole head).
#[derive(Debug, Clone)]
pub struct Rope {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub head_dim: usize,
    pub rot_dim: usize,
    pub neox: bool,
}

/// The operations of a forward pass, over the backend's own memory.
pub trait Backend: Send + Sync {
    /// Activations: `[rows, cols]` f32.
    type Tensor: Send + Sync;
    /// A weight matrix, kept in its loaded format.
    type Matrix: Send + Sync;
    /// A 1-D weight.
    type Vector: Send + Sync;
    /// The paged key/value memory of one model.
    type Kv: Send;

    /// A short name (`cpu`, `wgpu`, `cuda:0`).
    fn name(&self) -> &'static str;
    /// Takes a weight matrix into the backend's memory (once, at load).
    fn matrix(&self, m: HostMatrix) -> Result<Self::Matrix, KernelError>;
    /// `(rows, cols)` of a weight matrix.
    fn matrix_shape(&self, m: &Self::Matrix) -> (usize, usize);
    fn vector(&self, v: Vec<f32>) -> Self::Vector;
    /// Empty paged KV memory of this geometry.
    fn kv(&self, layout: KvLayout) -> Self::Kv;
    /// The geometry of a paged KV memory.
    fn kv_layout(&self, kv: &Self::Kv) -> KvLayout;
    /// The f16 bits of `blocks` of the KV: block by block and, in each,
    /// layer by layer, the keys then the values (`block_len` bits each,
    /// `[kv_head][slot][head_dim]`), as the KV transfer format lays them
    /// out. Every block id is below the layout's `num_blocks` (the caller
    /// checks).
    fn kv_blocks(&self, kv: &Self::Kv, blocks: &[u32]) -> Vec<u16>;
    /// Writes bits laid out as `kv_blocks` gives them into `blocks`.
    fn set_kv_blocks(&self, kv: &mut Self::Kv, blocks: &[u32], bits: &[u16]);
    /// Host rows into a tensor of `cols` columns.
    fn tensor(&self, data: Vec<f32>, cols: usize) -> Self::Tensor;
    /// The tensor's rows, back on the host, row-major.
    fn to_host(&self, x: &Self::Tensor) -> Vec<f32>;
    /// `to_host` of a tensor no longer needed: a backend whose tensors
    /// live on the host hands over their memory instead of a copy.
    fn take_host(&self, x: Self::Tensor) -> Vec<f32> {
        self.to_host(&x)
    }

    /// Rows `ids` of `table` (embedding lookup).
    fn embed(&self, table: &Self::Matrix, ids: &[u32]) -> Result<Self::Tensor, KernelError>;
    /// `x · Wᵀ`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Matrix) -> Result<Self::Tensor, KernelError>;
    /// `matmul` of each pair, in order (the experts of a mixture-of-experts
    /// layer). The CPU runs them in one parallel loop; the default runs them
    /// one after another.
    fn matmul_many(
        &self,
        pairs: &[(&Self::Tensor, &Self::Matrix)],
    ) -> Result<Vec<Self::Tensor>, KernelError> {
        pairs.iter().map(|(x, w)| self.matmul(x, w)).collect()
    }
    /// Splits every row into consecutive parts of these widths.
    fn split_cols(&self, x: &Self::Tensor, widths: &[usize]) -> Vec<Self::Tensor>;
    /// Joins the rows of several tensors side by side.
    fn concat_cols(&self, parts: &[Self::Tensor]) -> Self::Tensor;
    /// The given rows, in order.
    fn rows(&self, x: &Self::Tensor, rows: &[usize]) -> Self::Tensor;
    /// The same values re-cut into rows of `cols` (no copy): the heads of
    /// `[tokens, heads * head_dim]` as rows of `[tokens * heads, head_dim]`
    /// and back. `cols` divides the tensor's length.
    fn reshape(&self, x: Self::Tensor, cols: usize) -> Self::Tensor;
    /// `x[rows[i]] += scale[i] * y[i]` for every row `i` of `y`: experts'
    /// outputs back into their tokens' rows. `rows` holds no repeats.
    fn add_rows_scaled(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        rows: &[usize],
        scale: &[f32],
    );
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// Adds `b` to every row.
    fn add_bias(&self, x: &mut Self::Tensor, b: &Self::Vector);
    /// RMSNorm of every row, scaled by `w`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Vector, eps: f32) -> Self::Tensor;
    /// LayerNorm of every row, scaled by `w` and shifted by `b`.
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Vector,
        b: &Self::Vector,
        eps: f32,
    ) -> Self::Tensor;
    /// `silu(gate) * up` of rows laid out `[gate | up]`.
    fn swiglu(&self, gate_up: &Self::Tensor) -> Self::Tensor;
    /// `gelu(gate) * up` of rows laid out `[gate | up]` (Gemma's GeGLU),
    /// GELU's tanh form as llama.cpp's CPU backend takes it: from a table
    /// of f16 values at f16 inputs (`cpu::ops::gelu_tanh_f16`).
    fn geglu(&self, gate_up: &Self::Tensor) -> Self::Tensor;
    /// `x *= s`, every element.
    fn scale(&self, x: &mut Self::Tensor, s: f32);
    /// GELU (the exact, erf form BERT uses), in place.
    fn gelu(&self, x: &mut Self::Tensor);
    /// Softmax of every row, in place.
    fn softmax_rows(&self, x: &mut Self::Tensor);
    /// Rotates every head of row `t` by position `positions[t]`, in place.
    fn rope(&self, x: &mut Self::Tensor, positions: &[usize], rope: &Rope);
    /// Writes row `t` of `k` and `v` into layer `layer` at `slots[t]`
    /// (block, slot in block).
    fn write_kv(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        slots: &[(u32, usize)],
    );
    /// Bidirectional multi-head attention (an encoder's) over a batch of
    /// unpadded sequences stacked row after row, `seqs` their lengths
    /// (summing to the rows): every row of a sequence attends to every row
    /// of the same sequence, and to no other.
    fn self_attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        heads: usize,
        seqs: &[usize],
    ) -> Self::Tensor;
    /// Causal attention of every query row over the paged KV of `layer`:
    /// `queries[t]` is row `t`'s position and its sequence's block table.
    fn attention(
        &self,
        q: &Self::Tensor,
        kv: &Self::Kv,
        layer: usize,
        queries: &[(usize, &[u32])],
        shape: AttnShape,
    ) -> Self::Tensor;
}
