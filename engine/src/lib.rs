//! Synor's inference engine: model loading (GGUF llama-family decoders,
//! BERT encoders), tokenization and chat templates, sampling, and the
//! continuous-batching core behind `EngineHandle`, the only interface the
//! server uses. No HTTP and no SQL live here.
//!
//! Flow: `EngineHandle::submit` validates a `GenerateRequest` and sends it to
//! the `EngineCore` thread, which runs `schedule -> execute -> update` steps
//! through an `Executor` (or two: prefill, then decode) that samples and
//! returns token ids; they flow back to the request's `RequestStream`,
//! which detokenizes incrementally and applies stop strings. Models are
//! written over `kernels::backend::Backend`; `EngineBuilder` starts an
//! engine around its executors.

pub mod chat;
pub mod constraint;
pub mod core;
pub mod embed;
pub mod error;
pub mod executor;
pub mod generation;
pub mod gguf;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod gpu_executor;
pub mod handle;
pub mod import_check;
pub mod kv_cache;
pub mod latency;
pub mod loader;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod registry;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod stage_check;
pub mod stats;
pub mod step_budget;
pub mod tokenizer;

pub use chat::{ChatMessage, TemplateChoice};
pub use constraint::Grammar;
pub use embed::{EmbedInput, EmbeddingHandle, Embeddings};
pub use error::EngineError;
pub use generation::GenerationDefaults;
pub use handle::{Device, EngineBuilder, EngineConfig, EngineHandle, ModelFacts, ModelInfo};
pub use kv_cache::KvDtype;
pub use latency::{HistogramSnapshot, LatencyStats};
pub use output::{RawStream, RequestStream};
pub use request::{
    FinishReason, GenerateRequest, RequestId, SamplingParams, TokenEvent, TokenLogprob, Usage,
    ValidRequest,
};
pub use scheduler::SchedulerConfig;
pub use stats::EngineStats;
pub use tokenizer::TextTokenizer;
