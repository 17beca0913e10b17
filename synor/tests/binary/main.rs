//! Tests against the real `synor` binary on port 0: a client that goes
//! away, shutdown on SIGTERM, and what the process says when it serves.

mod process;
mod serve;
mod simulate;
