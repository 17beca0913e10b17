//! The fleet: provider workers that connect over WebSocket, register their
//! devices and models, report their load, and run the work placed on them.
//! A domain module like `ledger` and `market`: it knows nothing of HTTP
//! (the gateway route in `http` adapts the socket to it) and is used by
//! the services. So far it holds the wire protocol (`protocol`); the
//! registry of connected workers, calibration and placement come next.

pub mod protocol;
