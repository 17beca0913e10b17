//! What the fleet shows on `/metrics`: the connections that ended, the
//! attempts replayed elsewhere, the answers that broke the server's count
//! (recorded where each happens), and each connected worker's figures
//! (read when scraped, so a worker that left leaves no series).

use super::registry::{Registry, WorkerInfo};
use crate::telemetry::{Collector, IntCounter, MetricFamily, Scraped, collect, int_counter};

/// The fleet's event counters.
#[derive(Debug, Clone)]
pub struct FleetCounts {
    /// Worker connections that ended.
    pub disconnects: IntCounter,
    /// Attempts lost on a worker and replayed elsewhere.
    pub replays: IntCounter,
    /// Worker messages that broke the server's count of a job (a token
    /// past the end, an end before it).
    pub violations: IntCounter,
}

impl Default for FleetCounts {
    fn default() -> Self {
        Self {
            disconnects: int_counter(
                "synor:fleet_disconnects_total",
                "Worker connections that ended.",
            ),
            replays: int_counter(
                "synor:fleet_replays_total",
                "Attempts lost on a worker and replayed elsewhere.",
            ),
            violations: int_counter(
                "synor:fleet_protocol_violations_total",
                "Worker answers that broke the server's own count (a token past the answer's end, an end before it).",
            ),
        }
    }
}

/// Reads one figure of a worker.
type WorkerFigure = fn(&WorkerInfo) -> f64;

/// Per worker: what this server measured and what the worker reports.
const WORKER_FAMILIES: [(&str, bool, &str, WorkerFigure); 8] = [
    (
        "synor:worker_up",
        false,
        "1 for each connected worker.",
        |_| 1.0,
    ),
    (
        "synor:worker_jobs_running",
        false,
        "Choices of this server running on the worker.",
        |w| w.jobs_running as f64,
    ),
    (
        "synor:worker_tokens_delivered_total",
        true,
        "Tokens the worker delivered for this server.",
        |w| w.tokens_delivered as f64,
    ),
    (
        "synor:worker_errors_total",
        true,
        "Attempts lost on the worker (then replayed elsewhere).",
        |w| w.jobs_lost as f64,
    ),
    (
        "synor:worker_queue",
        false,
        "Requests waiting in the worker's engine (self-reported).",
        |w| f64::from(w.load.queued),
    ),
    (
        "synor:worker_running",
        false,
        "Sequences running on the worker (self-reported).",
        |w| f64::from(w.load.running),
    ),
    (
        "synor:worker_step_ms",
        false,
        "The worker's mean engine step, ms (self-reported).",
        |w| f64::from(w.load.step_ms),
    ),
    (
        "synor:worker_free_kv_blocks",
        false,
        "Free KV blocks on the worker (self-reported).",
        |w| f64::from(w.load.free_kv_blocks),
    ),
];

/// Each connected worker's series (labels `worker`, `name`, `provider`).
fn worker_families(workers: &[WorkerInfo]) -> Vec<MetricFamily> {
    WORKER_FAMILIES
        .iter()
        .map(|&(name, total, help, get)| {
            let mut f = Scraped::scalar(name, help, total);
            for w in workers {
                let labels = [
                    ("worker", w.id.as_str()),
                    ("name", w.name.as_str()),
                    ("provider", w.provider_id.as_str()),
                ];
                f.sample(&labels, get(w));
            }
            f.done()
        })
        .collect()
}

impl Registry {
    /// Every fleet family: the events counted so far and this replica's
    /// workers as they are now.
    pub fn families(&self) -> Vec<MetricFamily> {
        let c = &self.counts;
        let t = &self.transfers;
        let mut out = collect(&[
            &c.disconnects as &dyn Collector,
            &c.replays,
            &c.violations,
            &t.bytes,
            &t.frames,
        ]);
        out.extend(worker_families(&self.local()));
        out
    }
}
