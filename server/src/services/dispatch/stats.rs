//! What dispatch counts for `/metrics` and the fleet's admin routes:
//! each executor's stage totals and utilization, the steals, embeddings
//! on workers, and the split's plans, transfers, link bandwidths and the
//! cost model's accuracy (estimated against measured, per plan).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use super::lock;
use super::stages::Stages;
use super::utilization::{ExecutorUse, Utilization};
use crate::services::placement::Estimate;
use crate::telemetry::{
    Collector, IntCounter, IntCounterVec, MetricFamily, Scraped, collect, int_counter,
    int_counter_vec,
};

/// Everything dispatch counts.
#[derive(Debug)]
pub struct DispatchStats {
    /// Each executor's prefill and decode totals, as relays saw them.
    pub stages: Stages,
    /// How busy each executor is.
    pub utilization: Utilization,
    /// Plans, transfers and the cost model's accuracy.
    pub split: SplitStats,
    /// Choices an idle worker took over from a busy one.
    pub steals: IntCounter,
    /// Embedding jobs workers answered.
    pub embedded_on_workers: IntCounter,
}

impl Default for DispatchStats {
    fn default() -> Self {
        Self {
            stages: Stages::default(),
            utilization: Utilization::default(),
            split: SplitStats::default(),
            steals: int_counter(
                "synor:fleet_steals_total",
                "Choices a worker had not started, taken by an idle worker.",
            ),
            embedded_on_workers: int_counter(
                "synor:embed_jobs_on_workers_total",
                "Embedding jobs (requests and semantic-cache queries) workers answered.",
            ),
        }
    }
}

impl DispatchStats {
    /// What dispatch counted, and each executor's utilization now.
    pub fn families(&self) -> Vec<MetricFamily> {
        let mut out = collect(&[&self.steals as &dyn Collector, &self.embedded_on_workers]);
        out.extend(self.stages.families());
        out.extend(self.split.families());
        out.extend(utilization_families(&self.utilization.report()));
        out
    }
}

impl super::Dispatch {
    /// Every dispatch family: its counts, the admission queue and the
    /// spot checks.
    pub fn families(&self) -> Vec<MetricFamily> {
        let mut out = self.stats.families();
        let mut queued = Scraped::gauge(
            "synor:fleet_queued",
            "Choices waiting while every executor of their model is at its batch cap.",
        );
        queued.sample(&[], self.queued() as f64);
        out.push(queued.done());
        out.extend(self.spot.checker().families());
        out
    }
}

/// Per executor: the share of the last minute and five minutes it was
/// busy, and of the last minute it was moving KV.
fn utilization_families(uses: &[ExecutorUse]) -> Vec<MetricFamily> {
    let mut busy = Scraped::gauge(
        "synor:executor_busy_ratio",
        "Share of the window with a choice of this server running on the executor.",
    );
    let mut moving = Scraped::gauge(
        "synor:executor_transfer_ratio",
        "Share of the last minute the executor was sending or receiving KV.",
    );
    for u in uses {
        let e = u.executor.as_str();
        busy.sample(&[("executor", e), ("window", "1m")], u.busy_1m);
        busy.sample(&[("executor", e), ("window", "5m")], u.busy_5m);
        moving.sample(&[("executor", e), ("window", "1m")], u.transferring);
    }
    vec![busy.done(), moving.done()]
}

/// Link bandwidth assumed before a transfer measured it (bytes/s).
const DEFAULT_BANDWIDTH: f64 = 500e6;
/// Estimates kept per plan for the predicted-vs-measured report.
const KEEP: usize = 256;

/// One finished choice: its estimate, and its measured TTFT and TPOT (ms).
type Sample = (Estimate, f64, f64);

/// Counters of plans and transfers, for `/metrics` and the benchmark.
#[derive(Debug)]
pub struct SplitStats {
    /// Choices by plan (`colocated`, `split`).
    plans: IntCounterVec,
    /// KV transfers by outcome (`imported`, `recomputed`, `aborted`).
    transfers: IntCounterVec,
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

impl Default for SplitStats {
    fn default() -> Self {
        let plans = int_counter_vec(
            "synor:fleet_plans_total",
            "Choices placed by plan: colocated (one worker) or split (prefill on another).",
            &["plan"],
        );
        let transfers = int_counter_vec(
            "synor:kv_transfers_total",
            "KV transfers by outcome: imported by the decode worker, recomputed there (refused), or aborted (the prefill failed, was lost or timed out).",
            &["outcome"],
        );
        for plan in PLANS {
            plans.with_label_values(&[plan]);
        }
        for outcome in TransferEnd::ALL {
            transfers.with_label_values(&[outcome.as_str()]);
        }
        Self {
            plans,
            transfers,
            samples: Mutex::default(),
            links: Mutex::default(),
        }
    }
}

/// The plans, as `/metrics` labels them.
const PLANS: [&str; 2] = ["colocated", "split"];

/// How a KV transfer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferEnd {
    /// The decode worker imported the KV.
    Imported,
    /// The decode worker refused it and recomputed the prompt.
    Recomputed,
    /// The prefill failed, was lost or timed out.
    Aborted,
}

impl TransferEnd {
    pub const ALL: [TransferEnd; 3] = [Self::Imported, Self::Recomputed, Self::Aborted];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Imported => "imported",
            Self::Recomputed => "recomputed",
            Self::Aborted => "aborted",
        }
    }
}

impl SplitStats {
    /// A first attempt was planned (`split`: to prefill elsewhere).
    pub fn planned(&self, split: bool) {
        self.plans
            .with_label_values(&[PLANS[usize::from(split)]])
            .inc();
    }

    /// A KV transfer ended.
    pub fn transferred(&self, how: TransferEnd) {
        self.transfers.with_label_values(&[how.as_str()]).inc();
    }

    /// The plans and transfers counted, and the cost model's recent
    /// accuracy per plan (gauge `synor:plan_latency_ms`).
    pub fn families(&self) -> Vec<MetricFamily> {
        let mut out = collect(&[&self.plans as &dyn Collector, &self.transfers]);
        let mut f = Scraped::gauge(
            "synor:plan_latency_ms",
            "Mean estimated and measured TTFT and TPOT of each plan's recent choices (the cost model's accuracy).",
        );
        for (plan, split) in [("colocated", false), ("split", true)] {
            let a = self.accuracy(split);
            for (metric, kind, v) in [
                ("ttft", "estimated", a.estimated_ttft_ms),
                ("ttft", "measured", a.measured_ttft_ms),
                ("tpot", "estimated", a.estimated_tpot_ms),
                ("tpot", "measured", a.measured_tpot_ms),
            ] {
                let labels = [("plan", plan), ("metric", metric), ("kind", kind)];
                f.sample(&labels, (v * 1e3).round() / 1e3);
            }
        }
        out.push(f.done());
        out
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
