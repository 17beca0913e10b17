//! `GET /metrics`: the exposition of every part's families (see
//! `telemetry`), served by `routes::health`. Each part records its own
//! where its events happen (the fleet, dispatch and its spot checks, the
//! response cache); this module adds the HTTP request counter the
//! middleware records into, each text model's engine series (names aligned
//! with vLLM's, label `model_name`: the engine records them, but knows no
//! served name, so they are read here when scraped) and the ledger's last
//! audit.

use crate::cache::ResponseCache;
use crate::fleet::registry::Registry;
use crate::services::dispatch::Dispatch;
use crate::services::served::{Served, ServedStats};
use crate::telemetry::{
    Collector, IntCounterVec, MetricFamily, Scraped, expose, in_order, int_counter_vec,
};
use engine::registry::{ModelKind, ModelRegistry};
use engine::{EngineStats, HistogramSnapshot, LatencyStats};

/// The HTTP counter's labels, in the order the exposition shows them.
const LABELS: [&str; 3] = ["route", "method", "status"];

/// HTTP request counts, by route, method and status.
#[derive(Debug)]
pub struct HttpMetrics {
    requests: IntCounterVec,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: int_counter_vec(
                "synor:http_requests_total",
                "HTTP requests, by route, method and status.",
                &LABELS,
            ),
        }
    }
}

impl HttpMetrics {
    pub fn record(&self, route: &str, method: &str, status: u16) {
        let status = status.to_string();
        self.requests
            .with_label_values(&[route, method, status.as_str()])
            .inc();
    }

    /// Every (route, method, status) counted, with its count.
    pub(crate) fn snapshot(&self) -> Vec<((String, String, u16), u64)> {
        let families = self.requests.collect();
        let series = families.iter().flat_map(|f| f.get_metric());
        series
            .map(|m| {
                let label = |name: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map_or_else(String::new, |l| l.value().to_string())
                };
                let status = label("status").parse().unwrap_or_default();
                let key = (label("route"), label("method"), status);
                (key, m.get_counter().get_value() as u64)
            })
            .collect()
    }

    fn families(&self) -> Vec<MetricFamily> {
        in_order(self.requests.collect(), &LABELS)
    }
}

/// Reads one figure of an engine.
type EngineFigure = fn(&EngineStats, &LatencyStats) -> f64;

/// Each text model's engine series, what only its engine knows: (name, a
/// counter?, help, figure). Requests as clients see them, on every
/// executor, are `served_families`.
const ENGINE_SCALARS: [(&str, bool, &str, EngineFigure); 9] = [
    (
        "synor:num_requests_waiting",
        false,
        "Requests waiting to be scheduled.",
        |s, _| s.num_waiting as f64,
    ),
    (
        "synor:kv_cache_usage_perc",
        false,
        "Fraction of KV cache blocks in use (0-1).",
        |s, _| s.kv_usage(),
    ),
    (
        "synor:kv_cache_bytes",
        false,
        "Bytes of KV cache memory held (CPU blocks are allocated when first written).",
        |s, _| s.kv_bytes as f64,
    ),
    (
        "synor:prefix_cache_queries_total",
        true,
        "Prompt tokens looked up in the prefix cache.",
        |s, _| s.prefix_queries as f64,
    ),
    (
        "synor:prefix_cache_hits_total",
        true,
        "Prompt tokens found in the prefix cache.",
        |s, _| s.prefix_hits as f64,
    ),
    (
        "synor:num_preemptions_total",
        true,
        "Sequences preempted for lack of KV blocks.",
        |s, _| s.preemptions as f64,
    ),
    (
        "synor:engine_busy_seconds_total",
        true,
        "Time the engine spent in forward passes (scoring included).",
        |s, _| s.busy_micros as f64 / 1e6,
    ),
    (
        "synor:engine_score_seconds_total",
        true,
        "Time the engine spent scoring continuations for spot checks.",
        |s, _| s.score_micros as f64 / 1e6,
    ),
    (
        "synor:engine_steps_total",
        true,
        "Engine steps (forward passes).",
        |s, _| s.steps as f64,
    ),
];

/// Picks one of an engine's latency histograms.
type Pick = fn(&LatencyStats) -> &HistogramSnapshot;

/// The request histograms of every executor, by model and executor.
const SERVED_HISTOGRAMS: [(&str, &str, Pick); 3] = [
    (
        "synor:time_to_first_token_seconds",
        "Time from submission to the first token reaching the server, by executor.",
        |l| &l.ttft,
    ),
    (
        "synor:inter_token_latency_seconds",
        "Time between tokens reaching the server, by executor (tokens that come together share the gap).",
        |l| &l.itl,
    ),
    (
        "synor:e2e_request_latency_seconds",
        "Time from submission to the end of a request, by executor.",
        |l| &l.e2e,
    ),
];

/// Each text model's engine series, read from its engine now.
fn engine_families(models: &ModelRegistry) -> Vec<MetricFamily> {
    let text: Vec<(String, EngineStats, LatencyStats)> = models
        .list()
        .into_iter()
        .filter_map(|m| match &m.kind {
            ModelKind::Text(h) => Some((m.name.clone(), h.stats(), h.latency())),
            ModelKind::Embedding(_) => None,
        })
        .collect();
    let mut out: Vec<MetricFamily> = ENGINE_SCALARS
        .iter()
        .map(|&(name, total, help, get)| {
            let mut f = Scraped::scalar(name, help, total);
            for (model, s, l) in &text {
                f.sample(&[("model_name", model)], get(s, l));
            }
            f.done()
        })
        .collect();
    let mut queue = Scraped::histogram(
        "synor:request_queue_time_seconds",
        "Time from submission to the first scheduled step on a house engine.",
    );
    for (model, _, l) in &text {
        let h = &l.queue;
        queue.distribution(&[("model_name", model)], h.bounds, &h.counts, h.sum_seconds);
    }
    out.push(queue.done());
    out
}

/// Requests as clients see them, by model and executor (the house's or a
/// worker's): running, tokens, finished by reason, and their latencies.
fn served_families(served: &Served) -> Vec<MetricFamily> {
    let all = served.snapshot();
    let scalar = |name, help, total, get: fn(&ServedStats) -> f64| {
        let mut f = Scraped::scalar(name, help, total);
        for s in &all {
            let labels = [
                ("model_name", s.model.as_str()),
                ("executor", s.executor.as_str()),
            ];
            f.sample(&labels, get(s));
        }
        f.done()
    };
    let mut out = vec![
        scalar(
            "synor:num_requests_running",
            "Requests running, on every executor.",
            false,
            |s| s.running as f64,
        ),
        scalar(
            "synor:prompt_tokens_total",
            "Prompt tokens of requests that got their first token.",
            true,
            |s| s.latency.prompt_tokens as f64,
        ),
        scalar(
            "synor:generation_tokens_total",
            "Generated tokens, as they reached the server.",
            true,
            |s| s.latency.generation_tokens as f64,
        ),
    ];
    let mut finished = Scraped::counter(
        "synor:request_success_total",
        "Finished requests, by finish reason (abort: the client left).",
    );
    for s in &all {
        for (reason, n) in &s.latency.finished {
            let labels = [
                ("model_name", s.model.as_str()),
                ("executor", s.executor.as_str()),
                ("finished_reason", reason),
            ];
            finished.sample(&labels, *n as f64);
        }
    }
    out.push(finished.done());
    for (name, help, pick) in SERVED_HISTOGRAMS {
        let mut f = Scraped::histogram(name, help);
        for s in &all {
            let h = pick(&s.latency);
            let labels = [
                ("model_name", s.model.as_str()),
                ("executor", s.executor.as_str()),
            ];
            f.distribution(&labels, h.bounds, &h.counts, h.sum_seconds);
        }
        out.push(f.done());
    }
    out
}

/// The ledger's last audit, if one ran.
fn audit_family(violations: Option<i64>) -> Vec<MetricFamily> {
    let mut f = Scraped::gauge(
        "synor:ledger_audit_violations",
        "Violations the ledger's last audit found (double entry and the economic invariants; it runs every five minutes and on GET /admin/ledger/audit).",
    );
    if let Some(n) = violations {
        f.sample(&[], n as f64);
    }
    vec![f.done()]
}

/// The whole exposition.
pub fn render(
    models: &ModelRegistry,
    cache: Option<&ResponseCache>,
    http: &HttpMetrics,
    fleet: &Registry,
    dispatch: &Dispatch,
    served: &Served,
    audit: Option<i64>,
) -> String {
    expose([
        audit_family(audit),
        cache.map(ResponseCache::families).unwrap_or_default(),
        fleet.families(),
        dispatch.families(),
        engine_families(models),
        served_families(served),
        http.families(),
    ])
}
