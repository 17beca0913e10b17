//! The Synor Compute server, in three layers (see README, "Architecture"):
//!
//! - `http`: the OpenAI-compatible API, routes, auth middleware, OpenAPI and
//!   the one error-to-HTTP mapping; `http::app(state)` builds the router
//!   (used by `startup` and by the in-process tests).
//! - `services`: what a request does, HTTP-free: the served models, per-key
//!   limits, metering, the response-cache policy and the one generation
//!   path that chat, completions and embeddings share.
//! - domain modules that know nothing of HTTP or services: `cache` (the
//!   response cache's tiers) and `fleet` (provider workers: the wire
//!   protocol, registry, sessions), used by the services. The money (the
//!   store, ledger and market) is its own crate, `money`.
//!
//! Beside them: `config` (the command line), `startup` (wiring and serving),
//! `listen` (the HTTP/1 listener), `keys_cli` and `telemetry`. The provider
//! side of the fleet (`synor worker`) is the `worker` crate.

pub mod cache;
pub mod config;
pub mod fleet;
pub mod http;
pub mod keys_cli;
pub mod listen;
pub mod services;
pub mod startup;
pub mod telemetry;

pub use http::app;
