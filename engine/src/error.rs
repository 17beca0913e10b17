//! `EngineError`: every way the engine can refuse or fail a request, with a
//! stable `error_type()` string. The server maps these to HTTP exactly once.

use thiserror::Error;

/// Errors surfaced by the engine to its callers.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum EngineError {
    /// A request parameter is out of range or malformed; `field` names it.
    #[error("{message}")]
    Validation {
        field: &'static str,
        message: String,
    },
    /// The prompt plus the requested output does not fit the model's context.
    #[error(
        "this model's maximum context length is {max_context} tokens, but you requested {} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion); shorten the prompt or lower max_tokens", prompt_tokens + max_tokens
    )]
    ContextLength {
        max_context: usize,
        prompt_tokens: usize,
        max_tokens: usize,
    },
    /// The waiting queue is full; the caller should retry later.
    #[error("the engine is overloaded ({waiting} requests waiting); retry later")]
    Overloaded { waiting: usize },
    /// The engine loop has stopped (shutdown or a fatal error).
    #[error("the engine is not running")]
    Shutdown,
    /// Loading a model or tokenizer failed.
    #[error("failed to load model: {0}")]
    Load(String),
    /// The tokenizer failed on an input.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// Rendering the chat template failed (for example, unsupported roles).
    #[error("chat template error: {0}")]
    Template(String),
    /// The forward pass or a kernel failed.
    #[error("model execution failed: {0}")]
    Execution(String),
    /// The executor cannot run the model now (a pipeline with no chain of
    /// workers): retry later.
    #[error("{0}")]
    Unavailable(String),
    /// The executor lost the KV of every sequence (a pipeline's stage was
    /// replaced): the engine recomputes them all, never fails them.
    #[error("the executor's KV was lost: {0}")]
    Recompute(String),
}

impl EngineError {
    /// A short, stable name for logs and metrics labels.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Validation { .. } => "validation",
            Self::ContextLength { .. } => "context_length",
            Self::Overloaded { .. } => "overloaded",
            Self::Shutdown => "shutdown",
            Self::Load(_) => "load",
            Self::Tokenizer(_) => "tokenizer",
            Self::Template(_) => "template",
            Self::Execution(_) => "execution",
            Self::Recompute(_) => "recompute",
            Self::Unavailable(_) => "unavailable",
        }
    }

    pub(crate) fn validation(field: &'static str, message: impl Into<String>) -> Self {
        Self::Validation {
            field,
            message: message.into(),
        }
    }
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        Self::Execution(e.to_string())
    }
}

/// Result alias for engine operations.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
