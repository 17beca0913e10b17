//! The server's one integration test binary: in-process router tests
//! (`router`, `observability`) and tests against the real `synor` binary on
//! port 0 (`binary`).

mod binary;
mod hardening;
mod helpers;
mod keys;
mod layout;
mod observability;
mod router;
