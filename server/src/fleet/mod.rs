//! The fleet: provider workers that connect over WebSocket, register their
//! devices and models, report their load, and run the work placed on them.
//! A domain module: it knows nothing of HTTP (the gateway route in `http`
//! adapts the socket to it) and is used by the services. The wire format
//! (control messages, binary frames) is the `protocol` crate.
//!
//! - `session`: one worker's connection, from registration to its end;
//! - `registry`: the connected workers, their devices, models, asks and
//!   load;
//! - `assignments`: the attempts running on workers, routed to their relays;
//! - `transfers`: KV relayed from a prefill worker to a decode worker;
//! - `stage_calls`: pipeline stage steps in flight on workers;
//! - `standing`: each provider's reputation and uptime, measured;
//! - `bus`: replicas sharing their workers over Redis pub/sub;
//! - `counts`: what the fleet shows on `/metrics`.
//!
//! Calibration, placement and the market's use of asks are services.

pub mod assignments;
pub mod bus;
pub mod counts;
pub mod registry;
pub mod session;
pub mod stage_calls;
pub mod standing;
pub mod transfers;
