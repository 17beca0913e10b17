//! The Prometheus text exposition behind `GET /metrics` (served by
//! `routes::health`), and the HTTP request counters it reports. Per text model (label
//! `model_name`), names aligned with vLLM's: queue gauges, KV cache usage,
//! prefix cache and token counters, finished requests by reason, and the
//! TTFT / inter-token / end-to-end / queue-time histograms the engine
//! records; HTTP request counts by route, method and status; the
//! response cache's hits, misses, evictions, bytes and lookup time per
//! tier; and per connected worker, its jobs, tokens, errors and reported
//! load, with the fleet's disconnects and replays.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use engine::HistogramSnapshot;

use crate::cache::ResponseCache;
use crate::fleet::registry::{Registry, WorkerInfo};
use crate::services::dispatch::Dispatch;
use crate::services::dispatch::SplitStats;
use crate::services::dispatch::stages::StageTotals;
use crate::services::dispatch::utilization::ExecutorUse;
use engine::registry::{ModelKind, ModelRegistry};

/// HTTP request counts, by (route, method, status).
#[derive(Debug, Default)]
pub struct HttpMetrics {
    counts: Mutex<BTreeMap<(String, String, u16), u64>>,
}

impl HttpMetrics {
    pub fn record(&self, route: &str, method: &str, status: u16) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *c.entry((route.to_string(), method.to_string(), status))
            .or_default() += 1;
    }

    pub(crate) fn snapshot(&self) -> Vec<((String, String, u16), u64)> {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

/// Escapes a label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family<'a> {
    name: &'a str,
    kind: &'a str,
    help: &'a str,
}

impl Family<'_> {
    fn header(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
    }
}

/// Reads one figure of a worker.
type WorkerFigure = fn(&WorkerInfo) -> f64;

/// Per worker (labels `worker`, `name`, `provider`): what this server
/// measured (jobs running, tokens delivered, attempts lost) and what the
/// worker reports (queue, running sequences, step time, free KV blocks);
/// and for the fleet, disconnects and replayed attempts.
fn fleet_metrics(out: &mut String, fleet: &Registry) {
    let workers = fleet.local();
    let families: [(&str, &str, &str, WorkerFigure); 8] = [
        (
            "synor:worker_up",
            "gauge",
            "1 for each connected worker.",
            |_| 1.0,
        ),
        (
            "synor:worker_jobs_running",
            "gauge",
            "Choices of this server running on the worker.",
            |w| w.jobs_running as f64,
        ),
        (
            "synor:worker_tokens_delivered_total",
            "counter",
            "Tokens the worker delivered for this server.",
            |w| w.tokens_delivered as f64,
        ),
        (
            "synor:worker_errors_total",
            "counter",
            "Attempts lost on the worker (then replayed elsewhere).",
            |w| w.jobs_lost as f64,
        ),
        (
            "synor:worker_queue",
            "gauge",
            "Requests waiting in the worker's engine (self-reported).",
            |w| f64::from(w.load.queued),
        ),
        (
            "synor:worker_running",
            "gauge",
            "Sequences running on the worker (self-reported).",
            |w| f64::from(w.load.running),
        ),
        (
            "synor:worker_step_ms",
            "gauge",
            "The worker's mean engine step, ms (self-reported).",
            |w| f64::from(w.load.step_ms),
        ),
        (
            "synor:worker_free_kv_blocks",
            "gauge",
            "Free KV blocks on the worker (self-reported).",
            |w| f64::from(w.load.free_kv_blocks),
        ),
    ];
    for (name, kind, help, get) in families {
        Family { name, kind, help }.header(out);
        for w in &workers {
            let _ = writeln!(
                out,
                "{name}{{worker=\"{}\",name=\"{}\",provider=\"{}\"}} {}",
                label(&w.id),
                label(&w.name),
                label(&w.provider_id),
                get(w)
            );
        }
    }
    let totals = [
        (
            "synor:fleet_disconnects_total",
            "Worker connections that ended.",
            &fleet.disconnects,
        ),
        (
            "synor:fleet_replays_total",
            "Attempts lost on a worker and replayed elsewhere.",
            &fleet.replays,
        ),
        (
            "synor:fleet_protocol_violations_total",
            "Worker answers that broke the server's own count (a token past the answer's end, an end before it).",
            &fleet.violations,
        ),
    ];
    for (name, help, v) in totals {
        Family {
            name,
            kind: "counter",
            help,
        }
        .header(out);
        let _ = writeln!(
            out,
            "{name} {}",
            v.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
}

/// Reads one stage total of an executor.
type StageFigure = fn(&StageTotals) -> f64;

/// Per executor (label `executor`, as usage records name it): the prefill
/// and decode time and tokens the relays observed. Their rates are each
/// executor's prefill and decode throughput in production.
fn stage_metrics(out: &mut String, stages: &[(String, StageTotals)]) {
    let families: [(&str, &str, StageFigure); 5] = [
        (
            "synor:stage_attempts_total",
            "Attempts run on the executor for this server.",
            |t| t.attempts as f64,
        ),
        (
            "synor:stage_prefill_seconds_total",
            "Time from an attempt's start to its first token.",
            |t| t.prefill_seconds,
        ),
        (
            "synor:stage_prefill_tokens_total",
            "Prompt tokens the executor computed (replays included, cache hits not).",
            |t| t.prefill_tokens as f64,
        ),
        (
            "synor:stage_decode_seconds_total",
            "Time from an attempt's first token to its last.",
            |t| t.decode_seconds,
        ),
        (
            "synor:stage_decode_tokens_total",
            "Tokens decoded after each attempt's first.",
            |t| t.decode_tokens as f64,
        ),
    ];
    for (name, help, get) in families {
        Family {
            name,
            kind: "counter",
            help,
        }
        .header(out);
        for (executor, t) in stages {
            let _ = writeln!(out, "{name}{{executor=\"{}\"}} {}", label(executor), get(t));
        }
    }
}

/// Per executor: the share of the last minute and five minutes it was
/// busy, and of the last minute it was moving KV.
fn utilization_metrics(out: &mut String, uses: &[ExecutorUse]) {
    type Windows = fn(&ExecutorUse) -> Vec<(&'static str, f64)>;
    let families: [(&str, &str, Windows); 2] = [
        (
            "synor:executor_busy_ratio",
            "Share of the window with a choice of this server running on the executor.",
            |u| vec![("1m", u.busy_1m), ("5m", u.busy_5m)],
        ),
        (
            "synor:executor_transfer_ratio",
            "Share of the last minute the executor was sending or receiving KV.",
            |u| vec![("1m", u.transferring)],
        ),
    ];
    for (name, help, windows) in families {
        Family {
            name,
            kind: "gauge",
            help,
        }
        .header(out);
        for u in uses {
            let e = label(&u.executor);
            for (window, v) in windows(u) {
                let _ = writeln!(out, "{name}{{executor=\"{e}\",window=\"{window}\"}} {v}");
            }
        }
    }
}

/// Spot checks of workers' output, and the trusted compute they cost.
fn spot_metrics(out: &mut String, s: &crate::services::spotcheck::SpotCheck) {
    use std::sync::atomic::Ordering::Relaxed;
    let name = "synor:spot_checks_total";
    Family {
        name,
        kind: "counter",
        help: "Worker attempts re-scored on the house engine, by result (skipped: the reference could not run).",
    }
    .header(out);
    for (result, v) in [
        ("pass", &s.passed),
        ("fail", &s.failed),
        ("skipped", &s.skipped),
    ] {
        let _ = writeln!(out, "{name}{{result=\"{result}\"}} {}", v.load(Relaxed));
    }
    for (name, kind, help, v) in [
        (
            "synor:spot_check_seconds_total",
            "counter",
            "House engine time spent scoring spot checks.",
            s.check_micros.load(Relaxed) as f64 / 1e6,
        ),
        (
            "synor:spot_check_tokens_total",
            "counter",
            "Tokens re-scored by spot checks.",
            s.tokens.load(Relaxed) as f64,
        ),
        (
            "synor:spot_check_max_pass_deviation",
            "gauge",
            "The largest log-probability difference (nats) of a passing spot check.",
            f64::from(s.worst_pass()),
        ),
    ] {
        Family { name, kind, help }.header(out);
        let _ = writeln!(out, "{name} {v}");
    }
}

/// Prefill/decode plans, KV transfers, and the cost model's accuracy.
fn split_metrics(
    out: &mut String,
    s: &SplitStats,
    fleet: &Registry,
    (steals, embedded): (u64, u64),
) {
    use std::sync::atomic::Ordering::Relaxed;
    let name = "synor:fleet_plans_total";
    Family {
        name,
        kind: "counter",
        help: "Choices placed by plan: colocated (one worker) or split (prefill on another).",
    }
    .header(out);
    for (plan, v) in [("colocated", &s.colocated), ("split", &s.split)] {
        let _ = writeln!(out, "{name}{{plan=\"{plan}\"}} {}", v.load(Relaxed));
    }
    let name = "synor:embed_jobs_on_workers_total";
    Family {
        name,
        kind: "counter",
        help: "Embedding jobs (requests and semantic-cache queries) workers answered.",
    }
    .header(out);
    let _ = writeln!(out, "{name} {embedded}");
    let name = "synor:fleet_steals_total";
    Family {
        name,
        kind: "counter",
        help: "Choices a worker had not started, taken by an idle worker.",
    }
    .header(out);
    let _ = writeln!(out, "{name} {}", steals);
    let name = "synor:kv_transfers_total";
    Family {
        name,
        kind: "counter",
        help: "KV transfers by outcome: imported by the decode worker, recomputed there (refused), or aborted (the prefill failed, was lost or timed out).",
    }
    .header(out);
    for (outcome, v) in [
        ("imported", &s.imported),
        ("recomputed", &s.recomputed),
        ("aborted", &s.aborted),
    ] {
        let _ = writeln!(out, "{name}{{outcome=\"{outcome}\"}} {}", v.load(Relaxed));
    }
    for (name, help, v) in [
        (
            "synor:kv_transfer_bytes_total",
            "KV payload bytes relayed between workers.",
            &fleet.transfers.bytes,
        ),
        (
            "synor:kv_transfer_frames_total",
            "KV frames relayed between workers.",
            &fleet.transfers.frames,
        ),
    ] {
        Family {
            name,
            kind: "counter",
            help,
        }
        .header(out);
        let _ = writeln!(out, "{name} {}", v.load(Relaxed));
    }
    let name = "synor:plan_latency_ms";
    Family {
        name,
        kind: "gauge",
        help: "Mean estimated and measured TTFT and TPOT of each plan's recent choices (the cost model's accuracy).",
    }
    .header(out);
    for (plan, split) in [("colocated", false), ("split", true)] {
        let a = s.accuracy(split);
        for (metric, kind, v) in [
            ("ttft", "estimated", a.estimated_ttft_ms),
            ("ttft", "measured", a.measured_ttft_ms),
            ("tpot", "estimated", a.estimated_tpot_ms),
            ("tpot", "measured", a.measured_tpot_ms),
        ] {
            let _ = writeln!(
                out,
                "{name}{{plan=\"{plan}\",metric=\"{metric}\",kind=\"{kind}\"}} {v:.3}"
            );
        }
    }
}

/// Choices waiting for an executor with room (admission past saturation).
fn queue_metrics(out: &mut String, queued: usize) {
    let name = "synor:fleet_queued";
    Family {
        name,
        kind: "gauge",
        help: "Choices waiting while every executor of their model is at its batch cap.",
    }
    .header(out);
    let _ = writeln!(out, "{name} {queued}");
}

/// Reads one counter of a cache tier.
type TierCounter = fn(&crate::cache::TierStats) -> u64;

/// Response cache counters per tier (`l1`, `l2`, `l3`, `semantic`).
fn cache_metrics(out: &mut String, cache: &crate::cache::ResponseCache) {
    use std::sync::atomic::Ordering::Relaxed;
    let tiers = ["l1", "l2", "l3", "semantic"];
    let counters: [(&str, &str, TierCounter); 4] = [
        (
            "synor:cache_hits_total",
            "Response cache hits, by tier.",
            |t| t.hits.load(Relaxed),
        ),
        (
            "synor:cache_misses_total",
            "Response cache misses, by tier.",
            |t| t.misses.load(Relaxed),
        ),
        (
            "synor:cache_evictions_total",
            "Entries evicted to stay within bounds, by tier.",
            |t| t.evictions.load(Relaxed),
        ),
        (
            "synor:cache_lookups_total",
            "Lookups, by tier (with `_seconds_total`, the mean latency).",
            |t| t.lookups.load(Relaxed),
        ),
    ];
    for (name, help, get) in counters {
        Family {
            name,
            kind: "counter",
            help,
        }
        .header(out);
        for (tier, s) in tiers.iter().zip(&cache.stats) {
            let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {}", get(s));
        }
    }
    let name = "synor:cache_lookup_seconds_total";
    Family {
        name,
        kind: "counter",
        help: "Time spent in lookups, by tier.",
    }
    .header(out);
    for (tier, s) in tiers.iter().zip(&cache.stats) {
        let _ = writeln!(
            out,
            "{name}{{tier=\"{tier}\"}} {}",
            s.lookup_micros.load(Relaxed) as f64 / 1e6
        );
    }
    semantic_metrics(out, cache);
    let (b1, n1, b2, n2) = cache.sizes();
    let n3 = cache.semantic_len() as u64;
    for (name, help, rows) in [
        (
            "synor:cache_bytes",
            "Bytes held, by tier.",
            [("l1", b1), ("l2", b2)].to_vec(),
        ),
        (
            "synor:cache_entries",
            "Entries held, by tier.",
            [("l1", n1), ("l2", n2), ("semantic", n3)].to_vec(),
        ),
    ] {
        Family {
            name,
            kind: "gauge",
            help,
        }
        .header(out);
        for (tier, v) in rows {
            let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {v}");
        }
    }
}

/// The semantic cache's verifier rejections by reason, and the
/// histogram of each lookup's nearest similarity.
fn semantic_metrics(out: &mut String, cache: &crate::cache::ResponseCache) {
    use crate::cache::{SIMILARITY_BUCKETS, verify::Reject};
    use std::sync::atomic::Ordering::Relaxed;
    let counts = &cache.semantic_counts;
    let name = "synor:cache_semantic_rejections_total";
    Family {
        name,
        kind: "counter",
        help: "Semantic lookups that missed because the verifier rejected the nearest candidate over the threshold, by reason.",
    }
    .header(out);
    for (r, n) in Reject::ALL.iter().zip(&counts.rejections) {
        let _ = writeln!(
            out,
            "{name}{{reason=\"{}\"}} {}",
            r.as_str(),
            n.load(Relaxed)
        );
    }
    let name = "synor:cache_semantic_similarity";
    Family {
        name,
        kind: "histogram",
        help: "Similarity of each semantic lookup's nearest cached question (hit or not).",
    }
    .header(out);
    let mut total = 0;
    for (le, n) in SIMILARITY_BUCKETS.iter().zip(&counts.similarity) {
        total += n.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
    let sum = *counts
        .similarity_sum
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {total}");
}

/// The whole exposition.
pub fn render(
    models: &ModelRegistry,
    cache: Option<&ResponseCache>,
    http: &HttpMetrics,
    fleet: &Registry,
    dispatch: &Dispatch,
    audit: Option<i64>,
) -> String {
    let mut out = String::new();
    if let Some(n) = audit {
        let name = "synor:ledger_audit_violations";
        Family {
            name,
            kind: "gauge",
            help: "Violations the ledger's last audit found (double entry and the economic invariants; it runs every five minutes and on GET /admin/ledger/audit).",
        }
        .header(&mut out);
        let _ = writeln!(out, "{name} {n}");
    }
    if let Some(cache) = cache {
        cache_metrics(&mut out, cache);
    }
    fleet_metrics(&mut out, fleet);
    queue_metrics(&mut out, dispatch.queued());
    let stats = &dispatch.stats;
    stage_metrics(&mut out, &stats.stages.totals());
    utilization_metrics(&mut out, &stats.utilization.report());
    let steals = stats.steals.load(std::sync::atomic::Ordering::Relaxed);
    let embedded = stats
        .embedded_on_workers
        .load(std::sync::atomic::Ordering::Relaxed);
    split_metrics(&mut out, &stats.split, fleet, (steals, embedded));
    spot_metrics(&mut out, dispatch.spot.checker());
    let text: Vec<(String, engine::EngineStats, engine::LatencyStats)> = models
        .list()
        .iter()
        .filter_map(|m| match &m.kind {
            ModelKind::Text(h) => Some((label(&m.name), h.stats(), h.latency())),
            ModelKind::Embedding(_) => None,
        })
        .collect();
    let scalar =
        |out: &mut String,
         f: Family<'_>,
         get: &dyn Fn(&engine::EngineStats, &engine::LatencyStats) -> f64| {
            f.header(out);
            for (name, s, l) in &text {
                let _ = writeln!(out, "{}{{model_name=\"{name}\"}} {}", f.name, get(s, l));
            }
        };
    let fam = |name, kind, help| Family { name, kind, help };
    scalar(
        &mut out,
        fam(
            "synor:num_requests_running",
            "gauge",
            "Requests in the running batch.",
        ),
        &|s, _| s.num_running as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:num_requests_waiting",
            "gauge",
            "Requests waiting to be scheduled.",
        ),
        &|s, _| s.num_waiting as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:kv_cache_usage_perc",
            "gauge",
            "Fraction of KV cache blocks in use (0-1).",
        ),
        &|s, _| s.kv_usage(),
    );
    scalar(
        &mut out,
        fam(
            "synor:kv_cache_bytes",
            "gauge",
            "Bytes of KV cache memory held (CPU blocks are allocated when first written).",
        ),
        &|s, _| s.kv_bytes as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
        ),
        &|s, _| s.prefix_queries as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
        ),
        &|s, _| s.prefix_hits as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:num_preemptions_total",
            "counter",
            "Sequences preempted for lack of KV blocks.",
        ),
        &|s, _| s.preemptions as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
        ),
        &|_, l| l.prompt_tokens as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:generation_tokens_total",
            "counter",
            "Generated tokens of finished requests.",
        ),
        &|_, l| l.generation_tokens as f64,
    );
    scalar(
        &mut out,
        fam(
            "synor:engine_busy_seconds_total",
            "counter",
            "Time the engine spent in forward passes (scoring included).",
        ),
        &|s, _| s.busy_micros as f64 / 1e6,
    );
    scalar(
        &mut out,
        fam(
            "synor:engine_score_seconds_total",
            "counter",
            "Time the engine spent scoring continuations for spot checks.",
        ),
        &|s, _| s.score_micros as f64 / 1e6,
    );
    scalar(
        &mut out,
        fam(
            "synor:engine_steps_total",
            "counter",
            "Engine steps (forward passes).",
        ),
        &|s, _| s.steps as f64,
    );
    let f = fam(
        "synor:request_success_total",
        "counter",
        "Finished requests, by finish reason.",
    );
    f.header(&mut out);
    for (name, _, l) in &text {
        for (reason, n) in &l.finished {
            let _ = writeln!(
                out,
                "{}{{model_name=\"{name}\",finished_reason=\"{reason}\"}} {n}",
                f.name
            );
        }
    }
    type Pick = fn(&engine::LatencyStats) -> &HistogramSnapshot;
    let histograms: [(&str, &str, Pick); 4] = [
        (
            "synor:time_to_first_token_seconds",
            "Time from submission to the first token.",
            |l| &l.ttft,
        ),
        (
            "synor:inter_token_latency_seconds",
            "Time between token-emitting steps of a request.",
            |l| &l.itl,
        ),
        (
            "synor:e2e_request_latency_seconds",
            "Time from submission to the end of a request.",
            |l| &l.e2e,
        ),
        (
            "synor:request_queue_time_seconds",
            "Time from submission to the first scheduled step.",
            |l| &l.queue,
        ),
    ];
    for (name, help, pick) in histograms {
        fam(name, "histogram", help).header(&mut out);
        for (model, _, l) in &text {
            histogram(&mut out, name, &format!("model_name=\"{model}\""), pick(l));
        }
    }
    let f = fam(
        "synor:http_requests_total",
        "counter",
        "HTTP requests, by route, method and status.",
    );
    f.header(&mut out);
    for ((route, method, status), n) in http.snapshot() {
        let _ = writeln!(
            out,
            "{}{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {n}",
            f.name,
            label(&route),
            label(&method)
        );
    }
    out
}

/// Cumulative `_bucket` lines, then `_sum` and `_count`.
fn histogram(out: &mut String, name: &str, labels: &str, h: &HistogramSnapshot) {
    let mut cumulative = 0;
    for (bound, n) in h.bounds.iter().zip(&h.counts) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count());
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_seconds);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let h = HistogramSnapshot {
            bounds: &[0.1, 1.0],
            counts: vec![2, 1, 3],
            sum_seconds: 7.5,
        };
        let mut out = String::new();
        histogram(&mut out, "x", "model_name=\"m\"", &h);
        assert_eq!(
            out,
            "x_bucket{model_name=\"m\",le=\"0.1\"} 2\n\
             x_bucket{model_name=\"m\",le=\"1\"} 3\n\
             x_bucket{model_name=\"m\",le=\"+Inf\"} 6\n\
             x_sum{model_name=\"m\"} 7.5\n\
             x_count{model_name=\"m\"} 6\n"
        );
        assert_eq!(label("a\"b\\c"), "a\\\"b\\\\c");
    }
}
