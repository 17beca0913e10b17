//! Compute kernels for Synor's engine and the plain-Rust reference
//! implementations they are tested against.
//!
//! - `backend`: the compute-backend trait the forward passes are written
//!   over;
//! - `quant`: the weight formats (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) and Q8
//!   activations;
//! - `kquant`: GGML's K-quant super-blocks and their reference
//!   dequantization;
//! - `layout`, `klayout`: the interleaved 16-row weight layouts the
//!   kernels read;
//! - `cpu`: the CPU backend: quantized matmul, multi-threaded, AVX-512 VNNI
//!   / AVX2 / scalar, picked at run time; row ops; the paged f16 KV memory
//!   and attention over it;
//! - `wgpu`, `cuda` (features): the GPU backends, sharing `gpu_pack`;
//! - `reference`: straightforward, obviously-correct versions of every op a
//!   forward pass needs (RMSNorm, LayerNorm, GELU, RoPE, softmax, causal GQA
//!   attention, f32 matmul): the test oracle for the fast paths here and in the engine.

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod gpu_pack;
#[cfg(all(test, any(feature = "wgpu", feature = "cuda")))]
mod gpu_tests;
pub mod iquant;
pub mod klayout;
pub mod kquant;
pub mod layout;
pub mod quant;
pub mod reference;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use quant::{KernelError, QMatrix, QuantType};
