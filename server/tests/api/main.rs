//! The server's one integration test binary: in-process router tests
//! (`router`, `observability`, `hardening`, `keys`), the pinned metrics
//! reference (`metrics_reference`) and the layering
//! check (`layout`). The real `synor` binary is tested in its own crate
//! (`synor/tests/binary`).

mod hardening;
mod helpers;
mod keys;
mod layout;
mod metrics_reference;
mod observability;
mod router;
