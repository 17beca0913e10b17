//! `synor-loadtest compare a.json b.json`: the headline metrics of two
//! result files side by side, with the ratio b / a (the response cache's
//! hit rate among them, so a cached run is not mistaken for a fast one).

use crate::metrics::Summary;
use crate::report::BenchResult;

/// The comparison table.
pub fn render(a: &BenchResult, b: &BenchResult, names: (&str, &str)) -> String {
    let mut rows: Vec<(String, Option<f64>, Option<f64>)> = Vec::new();
    let (x, y) = (&a.aggregates, &b.aggregates);
    let mut add = |k: &str, p: Option<f64>, q: Option<f64>| rows.push((k.to_string(), p, q));
    add(
        "completed requests",
        Some(x.completed as f64),
        Some(y.completed as f64),
    );
    add(
        "failed requests",
        Some(x.failed as f64),
        Some(y.failed as f64),
    );
    add(
        "rejected (429/503)",
        Some(x.rejected as f64),
        Some(y.rejected as f64),
    );
    add("duration (s)", Some(x.duration_s), Some(y.duration_s));
    add(
        "request throughput (req/s)",
        Some(x.request_throughput),
        Some(y.request_throughput),
    );
    add(
        "output throughput (tok/s)",
        Some(x.output_throughput),
        Some(y.output_throughput),
    );
    add(
        "total throughput (tok/s)",
        Some(x.total_token_throughput),
        Some(y.total_token_throughput),
    );
    add("goodput (req/s)", x.goodput, y.goodput);
    let hit_pct = |a: &crate::metrics::Aggregates| a.cache.hit_rate.map(|r| r * 100.0);
    add("cache hit rate (%)", hit_pct(x), hit_pct(y));
    let metrics: [(&str, &Option<Summary>, &Option<Summary>); 4] = [
        ("TTFT", &x.ttft_ms, &y.ttft_ms),
        ("TPOT", &x.tpot_ms, &y.tpot_ms),
        ("ITL", &x.itl_ms, &y.itl_ms),
        ("E2EL", &x.e2el_ms, &y.e2el_ms),
    ];
    for (name, p, q) in metrics {
        add(
            &format!("{name} mean (ms)"),
            p.as_ref().map(|s| s.mean),
            q.as_ref().map(|s| s.mean),
        );
        add(
            &format!("{name} median (ms)"),
            p.as_ref().map(|s| s.median),
            q.as_ref().map(|s| s.median),
        );
        for key in ["p90", "p99"] {
            let get =
                |s: &Option<Summary>| s.as_ref().and_then(|s| s.percentiles.get(key).copied());
            add(&format!("{name} {key} (ms)"), get(p), get(q));
        }
    }
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let mut out = format!(
        "{:<30}{:>14}{:>14}{:>10}\n",
        "metric", names.0, names.1, "b/a"
    );
    for (k, p, q) in rows {
        let ratio = match (p, q) {
            (Some(p), Some(q)) if p != 0.0 => format!("{:.2}x", q / p),
            _ => "-".into(),
        };
        out.push_str(&format!("{k:<30}{:>14}{:>14}{ratio:>10}\n", fmt(p), fmt(q)));
    }
    out
}
