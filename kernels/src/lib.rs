//! Compute kernels for Synor's engine and the plain-Rust reference
//! implementations they are tested against.
//!
//! `reference` holds straightforward, obviously-correct versions of every
//! op a forward pass needs (RMSNorm, RoPE in both layouts, softmax, causal
//! grouped-query attention). They are the test oracle for the engine's
//! tensor code and for the SIMD, WGSL and CUDA kernels that later issues add
//! beside them.

pub mod reference;
