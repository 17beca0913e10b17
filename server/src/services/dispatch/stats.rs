//! What dispatch counts for `/metrics` and the fleet's admin routes:
//! each executor's stage totals and utilization, the steals, embeddings
//! on workers, and the split's plans, transfers, link bandwidths and the
//! cost model's accuracy (estimated against measured, per plan).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::lock;
use super::stages::Stages;
use super::utilization::Utilization;
use crate::services::placement::Estimate;

/// Everything dispatch counts.
#[derive(Debug, Default)]
pub struct DispatchStats {
    /// Each executor's prefill and decode totals, as relays saw them.
    pub stages: Stages,
    /// How busy each executor is.
    pub utilization: Utilization,
    /// Plans, transfers and the cost model's accuracy.
    pub split: SplitStats,
    /// Choices an idle worker took over from a busy one.
    pub steals: AtomicU64,
    /// Embedding jobs workers answered.
    pub embedded_on_workers: AtomicU64,
}

/// Link bandwidth assumed before a transfer measured it (bytes/s).
const DEFAULT_BANDWIDTH: f64 = 500e6;
/// Estimates kept per plan for the predicted-vs-measured report.
const KEEP: usize = 256;

/// One finished choice: its estimate, and its measured TTFT and TPOT (ms).
type Sample = (Estimate, f64, f64);

/// Counters of plans and transfers, for `/metrics` and the benchmark.
#[derive(Debug, Default)]
pub struct SplitStats {
    pub colocated: AtomicU64,
    pub split: AtomicU64,
    pub imported: AtomicU64,
    pub recomputed: AtomicU64,
    pub aborted: AtomicU64,
    /// Per plan (`false` colocated, `true` split): recent (estimated,
    /// measured) TTFT and TPOT in ms.
    samples: Mutex<HashMap<bool, VecDeque<Sample>>>,
    /// Measured bandwidth of each worker's link (bytes/s, smoothed).
    links: Mutex<HashMap<String, f64>>,
}

/// Mean estimated and measured TTFT and TPOT of one plan's recent choices.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, utoipa::ToSchema)]
pub struct PlanAccuracy {
    pub choices: usize,
    pub estimated_ttft_ms: f64,
    pub measured_ttft_ms: f64,
    pub estimated_tpot_ms: f64,
    pub measured_tpot_ms: f64,
}

impl SplitStats {
    /// A first attempt was planned (`split`: to prefill elsewhere).
    pub fn planned(&self, split: bool) {
        let n = if split { &self.split } else { &self.colocated };
        n.fetch_add(1, Relaxed);
    }

    /// Records a finished choice's estimate against what it measured.
    pub fn observe(&self, split: bool, e: Estimate, ttft_ms: f64, tpot_ms: f64) {
        let mut s = lock(&self.samples);
        let q = s.entry(split).or_default();
        q.push_back((e, ttft_ms, tpot_ms));
        if q.len() > KEEP {
            q.pop_front();
        }
    }

    /// The recent accuracy of one plan's estimates.
    pub fn accuracy(&self, split: bool) -> PlanAccuracy {
        let s = lock(&self.samples);
        let Some(q) = s.get(&split).filter(|q| !q.is_empty()) else {
            return PlanAccuracy::default();
        };
        let n = q.len() as f64;
        let mean = |f: &dyn Fn(&Sample) -> f64| q.iter().map(f).sum::<f64>() / n;
        PlanAccuracy {
            choices: q.len(),
            estimated_ttft_ms: mean(&|x| x.0.ttft_ms),
            measured_ttft_ms: mean(&|x| x.1),
            estimated_tpot_ms: mean(&|x| x.0.tpot_ms),
            measured_tpot_ms: mean(&|x| x.2),
        }
    }

    /// Takes a transfer's measured throughput into its link's.
    pub fn measured_link(&self, worker: &str, bytes: u64, span: Duration) {
        if bytes < 256 * 1024 || span < Duration::from_millis(1) {
            return; // too small to say anything about bandwidth
        }
        let bw = bytes as f64 / span.as_secs_f64();
        let mut l = lock(&self.links);
        let e = l.entry(worker.to_string()).or_insert(bw);
        *e += (bw - *e) / 4.0;
    }

    /// A worker link's bandwidth, measured or assumed (bytes/s).
    pub fn bandwidth(&self, worker: &str) -> f64 {
        lock(&self.links)
            .get(worker)
            .copied()
            .unwrap_or(DEFAULT_BANDWIDTH)
    }
}
