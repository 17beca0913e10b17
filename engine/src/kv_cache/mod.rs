//! The paged KV cache: `BlockPool` (blocks, refcounts, prefix cache),
//! `KvManager` (per-sequence block tables, prefix lookup) on the scheduler
//! side, and `KvStorage` (the f16 memory itself) on the executor side.

pub mod block_pool;
pub mod manager;
pub mod storage;

pub use block_pool::{BlockId, BlockPool};
pub use manager::KvManager;
pub use storage::{KvLayout, KvStorage};
