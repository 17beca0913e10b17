//! The paged KV cache: `BlockPool` (blocks, refcounts, prefix cache),
//! `KvManager` (per-sequence block tables, prefix lookup) on the scheduler
//! side, `plan` (how a memory budget splits between full and sliding-window
//! layers), `KvStorage` (the f16 memory itself) on the executor side, and
//! `transfer` (a sequence's blocks as checksummed bytes, between executors).

pub mod block_pool;
pub mod manager;
pub mod plan;
pub mod storage;
pub mod transfer;

pub use block_pool::{BlockId, BlockPool};
pub use manager::{HOLE, KvManager};
pub use storage::{KvDtype, KvLayout, KvStorage, SlidingBlocks};
