//! The fleet: provider workers that connect over WebSocket, register their
//! devices and models, report their load, and run the work placed on them.
//! A domain module like `ledger` and `market`: it knows nothing of HTTP
//! (the gateway route in `http` adapts the socket to it) and is used by
//! the services.
//!
//! - `protocol`: the wire format (control messages, binary frames);
//! - `session`: one worker's connection, from registration to its end;
//! - `registry`: the connected workers, their devices, models and load.
//!
//! Calibration, placement and running work on workers come next.

pub mod jobs;
pub mod protocol;
pub mod registry;
pub mod session;
