//! Services: what a request does, with no HTTP in sight. Each takes its
//! dependencies explicitly (never the handlers' state) and answers with a
//! `ServiceError`, which the HTTP layer maps to a status once.
//!
//! (The served models' registry is the engine's, `engine::registry`.)
//! - `limits`: per-key requests, tokens per minute and concurrency.
//! - `metering`: quote, hold, count and settle a request's tokens; the
//!   house provider's market round.
//! - `caching`: which requests may use the response cache, lookups,
//!   pricing hits and storing answers; `cache_judge`: a served model asked
//!   whether a near match gets the same answer.
//! - `dispatch`: where each choice runs (house engine or a worker), its
//!   relay, replay of lost attempts; `placement`: how executors are
//!   scored; `calibration`: measuring workers.
//! - `spotcheck`: re-scoring a sample of workers' output on the house
//!   engine; what a failed check costs the provider.
//! - `asks`: workers' asks posted on the order book.
//! - `pipelines`: models served as chains of workers that each hold a
//!   layer range, planned here.
//! - `standing_sync`: persisting providers' measured reputation and uptime.
//! - `sanctions`: quarantines stored with the token, live sessions of a
//!   sanctioned token closed on every replica, an admin's clearing.
//! - `generation`: the one path of a generation (chat, completions) and of
//!   an embedding request: limits, cache, hold, submission, settlement and
//!   cache store around the token stream.

pub mod asks;
pub mod cache_judge;
pub mod caching;
pub mod calibration;
pub mod dispatch;
pub mod generation;
pub mod limits;
pub mod metering;
pub mod pipelines;
pub mod placement;
pub mod sanctions;
pub mod served;
pub mod spotcheck;
pub mod standing_sync;

use engine::EngineError;

use money::ledger::LedgerError;
use money::market::MarketError;

impl From<engine::registry::RegistryError> for ServiceError {
    fn from(e: engine::registry::RegistryError) -> Self {
        use engine::registry::RegistryError as R;
        match e {
            R::NotFound(m) => Self::ModelNotFound(m),
            R::WrongKind { model, endpoint } => Self::WrongModelKind { model, endpoint },
            R::NameTaken(m) => Self::NameTaken(m),
        }
    }
}

/// Why a service refused or failed a request.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The requested model is not served.
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// The model exists but cannot serve this endpoint.
    #[error("the model `{model}` does not support {endpoint}")]
    WrongModelKind {
        model: String,
        endpoint: &'static str,
    },
    /// A model of this name is already served.
    #[error("a model named `{0}` is already served")]
    NameTaken(String),
    /// A per-key limit is reached; retry after this many seconds.
    #[error("rate limit reached for this key ({what}); retry in {retry_after} s")]
    RateLimited {
        what: &'static str,
        retry_after: u64,
    },
    /// The request's worst case (prompt plus `max_tokens` for every
    /// choice) is more than the key's tokens per minute: it can never run.
    /// `param` names the field to make smaller.
    #[error(
        "this request may use up to {need} tokens, more than this key's limit of {limit} \
         tokens per minute, so it can never run: make `{param}` smaller"
    )]
    OverLimit {
        param: &'static str,
        need: u64,
        limit: u64,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Market(#[from] MarketError),
}
