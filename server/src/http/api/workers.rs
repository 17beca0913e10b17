//! Workers as the admin and provider APIs show them: the registry's
//! `WorkerInfo` with its asks in currency units (`"0.40"` per million
//! tokens), as every other amount in the API, where the fleet protocol and
//! the bus carry ticks.

use serde::Serialize;
use utoipa::ToSchema;

use protocol::Ask;
use protocol::bus::WorkerInfo;

/// A worker's standing offer for one model, per million tokens of each
/// phase, in units (the protocol fee not included: the market adds it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AskView {
    pub model: String,
    /// Per million prompt tokens computed (prefill).
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.10")]
    pub input: i64,
    /// Per million prompt tokens served from its prefix cache.
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.05")]
    pub cached_input: i64,
    /// Per million generated tokens (decode).
    #[serde(with = "money::ledger::units")]
    #[schema(value_type = String, example = "0.40")]
    pub output: i64,
    /// Generated tokens per second it offers (0: what calibration
    /// measured).
    pub capacity: u64,
    /// Unix seconds after which the ask lapses (0: while connected).
    pub until: i64,
    pub preemptible: bool,
}

impl From<Ask> for AskView {
    fn from(a: Ask) -> Self {
        Self {
            model: a.model,
            input: a.input,
            cached_input: a.cached_input,
            output: a.output,
            capacity: a.capacity,
            until: a.until,
            preemptible: a.preemptible,
        }
    }
}

/// A connected worker: everything the registry knows of it, with its
/// asks in units.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkerView {
    #[serde(flatten)]
    pub worker: WorkerInfo,
    /// Its prices per model (empty: it takes the house's).
    pub asks: Vec<AskView>,
}

impl From<WorkerInfo> for WorkerView {
    fn from(mut worker: WorkerInfo) -> Self {
        let asks = std::mem::take(&mut worker.asks);
        Self {
            worker,
            asks: asks.into_iter().map(AskView::from).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(asks: Vec<Ask>) -> WorkerInfo {
        WorkerInfo {
            id: "w1".into(),
            replica: String::new(),
            provider_id: "p".into(),
            token_id: "t".into(),
            name: "n".into(),
            build: "b".into(),
            remote: "r".into(),
            devices: vec![],
            models: vec![],
            encoders: vec![],
            parts: vec![],
            holds: vec![],
            threads: 2,
            region: "eu".into(),
            asks,
            reputation_bps: 10_000,
            uptime_bps: 10_000,
            state: "active".into(),
            profile: None,
            load: Default::default(),
            rtt_ms: 0.0,
            jobs_running: 0,
            tokens_delivered: 0,
            jobs_lost: 0,
            connected_at: 0,
            last_seen: 0,
        }
    }

    #[test]
    fn asks_show_once_and_in_units() {
        let ask = Ask {
            model: "m".into(),
            input: 1_000_000_000,
            cached_input: 0,
            output: 4_000_000_000,
            capacity: 0,
            until: 0,
            preemptible: false,
        };
        let v = serde_json::to_value(WorkerView::from(worker(vec![ask]))).expect("view");
        let text = serde_json::to_string(&v).expect("text");
        assert_eq!(text.matches("\"asks\"").count(), 1, "{text}");
        assert_eq!(v["asks"][0]["input"], "0.10");
        assert_eq!(v["asks"][0]["output"], "0.40");
        assert_eq!(v["id"], "w1");
    }

    #[test]
    fn the_bus_keeps_ticks_and_round_trips() {
        let ask = Ask {
            model: "m".into(),
            input: 7,
            cached_input: 3,
            output: 9,
            capacity: 5,
            until: 0,
            preemptible: true,
        };
        for w in [worker(vec![ask]), worker(vec![])] {
            let text = serde_json::to_string(&w).expect("encode");
            let back: WorkerInfo = serde_json::from_str(&text).expect("decode");
            assert_eq!(back, w, "{text}");
        }
    }
}
