//! The fleet bus's format (`docs/fleet-bus.md`): what `synor serve`
//! replicas send each other over Redis pub/sub. A replica announces its
//! workers (`WorkerInfo`, with the `Profile` the server measured),
//! forwards a worker message to the replica holding the worker, and sends
//! an attempt's events back to the replica that placed it. JSON, one
//! message a pub/sub payload; `decode_bus` takes untrusted bytes (any
//! client of the deployment's Redis can publish) and answers a typed error,
//! never a panic.

use serde::{Deserialize, Serialize};

use crate::{Ask, Device, Load, ProtocolError, ServedModel, ToWorker};

/// The largest bus message accepted: an announcement of a few thousand
/// workers.
pub const MAX_BUS_MESSAGE: usize = 16 << 20;

/// What the server measured of a worker on its own challenge (never what
/// the worker claims): prefill throughput and the decode step time at one
/// and at four sequences.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Profile {
    /// Prefill throughput on a `PREFILL_SHORT`-token prompt.
    pub prefill_tokens_per_s: f64,
    /// Milliseconds to prefill a `PREFILL_LONG`-token prompt (0: not
    /// measured; longer prompts then scale linearly from the short one).
    #[serde(default)]
    pub prefill_ms_long: f64,
    pub decode_step_ms_1: f64,
    pub decode_step_ms_4: f64,
    /// Unix seconds.
    pub measured_at: i64,
}

/// The prompt lengths calibration times prefill at.
pub const PREFILL_SHORT: usize = 128;
pub const PREFILL_LONG: usize = 512;

impl Profile {
    /// Expected milliseconds to prefill `n` tokens: linear in the short
    /// prompt's throughput up to `PREFILL_SHORT`, then along the line
    /// through the two measured lengths (attention makes a long prompt's
    /// tokens dearer).
    pub fn prefill_ms(&self, n: usize) -> f64 {
        let per = 1e3 / self.prefill_tokens_per_s.max(1.0);
        let short = PREFILL_SHORT as f64 * per;
        if n <= PREFILL_SHORT || self.prefill_ms_long <= short {
            return n as f64 * per;
        }
        let slope = (self.prefill_ms_long - short) / (PREFILL_LONG - PREFILL_SHORT) as f64;
        short + (n - PREFILL_SHORT) as f64 * slope
    }

    /// The expected decode step with `batch` sequences (linear between the
    /// measured points, extended past them).
    pub fn step_ms(&self, batch: u32) -> f64 {
        let slope = ((self.decode_step_ms_4 - self.decode_step_ms_1) / 3.0).max(0.0);
        self.decode_step_ms_1 + slope * f64::from(batch.max(1) - 1)
    }
}

/// A worker as admins see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerInfo {
    pub id: String,
    /// The server replica its connection is on (work placed by another
    /// replica travels over the fleet bus).
    #[serde(default)]
    pub replica: String,
    /// The provider account it earns for.
    pub provider_id: String,
    /// The token it connected with.
    pub token_id: String,
    pub name: String,
    pub build: String,
    /// The peer address of its connection.
    pub remote: String,
    /// What it detected (self-reported: shown, never trusted).
    pub devices: Vec<Device>,
    pub models: Vec<ServedModel>,
    /// The embedding models it serves.
    #[serde(default)]
    pub encoders: Vec<String>,
    /// The models it can hold a part of (a pipeline stage), and the parts
    /// it holds now.
    #[serde(default)]
    pub parts: Vec<crate::stage::PartOffer>,
    #[serde(default)]
    pub holds: Vec<crate::stage::HeldPart>,
    pub threads: u32,
    pub region: String,
    /// Its prices per model in ticks, as the bus carries them (none: it
    /// takes the house's). The admin API shows them in units instead
    /// (the server's `WorkerView`), so the schema leaves them out here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(ignore)]
    pub asks: Vec<Ask>,
    /// Its provider's measured standing (basis points): reputation
    /// 0.5-2.0x and uptime.
    pub reputation_bps: i64,
    pub uptime_bps: i64,
    /// `calibrating` (measured before it gets work), `active`,
    /// `draining` (no new work), or `quarantined` (caught by a spot check
    /// or a canary: no work, its token refused on reconnect).
    pub state: String,
    /// What the server measured of it (`None` until calibrated).
    pub profile: Option<Profile>,
    /// Its last `status` (self-reported).
    pub load: Load,
    /// The round trip of its connection, measured by the gateway's pings
    /// (ms, smoothed; 0 until measured).
    #[serde(default)]
    pub rtt_ms: f64,
    /// Choices of this server running on it now.
    pub jobs_running: u64,
    /// Tokens it delivered for this server, and attempts it lost.
    pub tokens_delivered: u64,
    pub jobs_lost: u64,
    /// Unix seconds.
    pub connected_at: i64,
    pub last_seen: i64,
}

/// One message between replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BusMessage {
    /// A replica's own workers, every second.
    Announce {
        replica: String,
        workers: Vec<WorkerInfo>,
    },
    /// For a worker of the receiving replica, from `origin`'s relay.
    ToWorker {
        origin: String,
        worker: String,
        msg: Box<ToWorker>,
    },
    /// Events of an attempt, back to the replica that placed it.
    Events {
        job: u64,
        attempt: u32,
        worker: String,
        events: Vec<BusEvent>,
    },
}

/// A job event on the bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BusEvent {
    Accepted,
    Token {
        id: u32,
        logprob: Option<f32>,
        #[serde(default)]
        top: Vec<(u32, f32)>,
    },
    Finished {
        reason: String,
        prompt: usize,
        cached: usize,
        completion: usize,
    },
    Lost {
        why: String,
    },
}

impl BusEvent {
    /// Whether the attempt ends with it.
    pub fn terminal(&self) -> bool {
        matches!(self, Self::Finished { .. } | Self::Lost { .. })
    }
}

/// Decodes one bus payload.
pub fn decode_bus(payload: &[u8]) -> Result<BusMessage, ProtocolError> {
    if payload.len() > MAX_BUS_MESSAGE {
        return Err(ProtocolError::TooLarge(payload.len()));
    }
    serde_json::from_slice(payload)
        .map_err(|e| ProtocolError::Malformed(crate::short(&e.to_string())))
}

/// Encodes one bus message.
pub fn encode_bus(msg: &BusMessage) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_payload_is_refused_before_it_is_read() {
        let big = vec![b' '; MAX_BUS_MESSAGE + 1];
        assert!(matches!(decode_bus(&big), Err(ProtocolError::TooLarge(_))));
        assert!(matches!(
            decode_bus(b"{\"type\":\"nope\"}"),
            Err(ProtocolError::Malformed(_))
        ));
    }

    #[test]
    fn events_round_trip_and_know_their_end() {
        let m = BusMessage::Events {
            job: 7,
            attempt: 1,
            worker: "w".into(),
            events: vec![
                BusEvent::Accepted,
                BusEvent::Token {
                    id: 3,
                    logprob: Some(-0.5),
                    top: vec![(3, -0.5)],
                },
                BusEvent::Lost { why: "gone".into() },
            ],
        };
        let back = decode_bus(encode_bus(&m).as_bytes()).expect("decodes");
        assert_eq!(back, m);
        let BusMessage::Events { events, .. } = back else {
            panic!("events");
        };
        let ends: Vec<bool> = events.iter().map(BusEvent::terminal).collect();
        assert_eq!(ends, [false, false, true]);
    }
}
