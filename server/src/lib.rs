//! The Synor Compute server, in three layers (see README, "Architecture"):
//!
//! - `http`: the OpenAI-compatible API, routes, auth middleware, OpenAPI and
//!   the one error-to-HTTP mapping; `http::app(state)` builds the router
//!   (used by the `synor` binary and by the in-process tests).
//! - `services`: what a request does, HTTP-free: per-key limits, metering,
//!   the response-cache policy, dispatch to the fleet and the one
//!   generation path that chat, completions and embeddings share.
//! - domain modules that know nothing of HTTP or services: `cache` (the
//!   response cache's tiers) and `fleet` (provider workers: the wire
//!   protocol, registry, sessions), used by the services. The money (the
//!   store, ledger and market) is its own crate, `money`.
//!
//! Beside them: `listen`, the HTTP/1 listener, and `telemetry`, the
//! Prometheus metrics every layer records into. The command line, logging,
//! signals and the wiring are the `synor` binary crate's; the provider side
//! of the fleet (`synor worker`) is the `worker` crate.

pub mod cache;
pub mod fleet;
pub mod http;
pub mod listen;
pub mod services;
pub mod telemetry;

pub use http::app;
