//! The paged KV memory of the CPU backend (`kernels::cpu::kv`), where the
//! engine's block tables point: re-exported so the engine names one type.

pub use kernels::cpu::kv::{KvDtype, KvLayout, KvStorage, SlidingBlocks};
