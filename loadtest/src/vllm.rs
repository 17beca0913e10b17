//! vLLM's result file (`--save-result`): the flat JSON `benchmark_serving`
//! (`vllm bench serve`) writes, field for field, so tools that read vLLM's
//! results read ours: the run's settings, the totals and rates, the
//! per-request lists (`input_lens`, `output_lens`, `ttfts`, `itls`,
//! `errors`, in seconds as vLLM keeps them) and, for each metric, its
//! mean, median, standard deviation and percentiles in milliseconds
//! (`mean_ttft_ms`, `p99_itl_ms`, ...). Our own nested file stays beside it.

use serde_json::{Map, Value, json};

use crate::client::Outcome;
use crate::metrics::{Aggregates, Record, percentile};
use crate::report::RunInfo;

/// The metrics vLLM summarizes, by its names.
pub const METRICS: [&str; 4] = ["ttft", "tpot", "itl", "e2el"];

/// vLLM's default file name: `synor-<rate>qps-<model>-<YYYYMMDD-HHMMSS>.json`
/// (`-concurrency<N>` when capped), with the date of `run`.
pub fn file_name(run: &RunInfo) -> String {
    let stamp: String = run
        .date
        .chars()
        .filter(|c| c.is_ascii_digit())
        .enumerate()
        .flat_map(|(i, c)| (i == 8).then_some('-').into_iter().chain([c]))
        .collect();
    let concurrency = run
        .max_concurrency
        .map_or(String::new(), |c| format!("-concurrency{c}"));
    let model = run.model.replace('/', "_");
    format!(
        "synor-{}qps{concurrency}-{model}-{stamp}.json",
        run.request_rate
    )
}

/// A percentile's key word as vLLM writes it (`99`, `99.9`).
fn p_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// Each successful request's values of one metric, in milliseconds.
fn values(records: &[Record], metric: &str) -> Vec<f64> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let ok = records.iter().filter_map(|r| match &r.outcome {
        Outcome::Success(x) => Some(x),
        Outcome::Rejected { .. } | Outcome::Failed(_) | Outcome::Cancelled(_) => None,
    });
    match metric {
        "ttft" => ok.map(|x| ms(x.ttft)).collect(),
        "tpot" => ok.filter_map(|x| x.tpot().map(ms)).collect(),
        "itl" => ok.flat_map(|x| x.itl.iter().map(|d| ms(*d))).collect(),
        _ => ok.map(|x| ms(x.e2e)).collect(),
    }
}

/// Mean, median, standard deviation and percentiles of `xs` under vLLM's
/// keys (zeros for an empty list, as vLLM writes them).
fn summarize(out: &mut Map<String, Value>, metric: &str, xs: &[f64], percentiles: &[f64]) {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let at = |p: f64| {
        if xs.is_empty() {
            0.0
        } else {
            percentile(xs, p)
        }
    };
    out.insert(format!("mean_{metric}_ms"), json!(mean));
    out.insert(format!("median_{metric}_ms"), json!(at(50.0)));
    out.insert(format!("std_{metric}_ms"), json!(var.sqrt()));
    for &p in percentiles {
        out.insert(format!("p{}_{metric}_ms", p_word(p)), json!(at(p)));
    }
}

/// The flat result of a run.
pub fn flat(
    run: &RunInfo,
    a: &Aggregates,
    records: &[Record],
    percentiles: &[f64],
    metrics: &[String],
) -> Value {
    let secs = |d: &std::time::Duration| d.as_secs_f64();
    let rate: Value = run
        .request_rate
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite())
        .map_or(json!("inf"), |r| json!(r));
    let mut out = Map::new();
    let settings = json!({
        "date": run.date,
        "backend": "synor",
        "endpoint_type": run.endpoint,
        "label": null,
        "model_id": run.model,
        "tokenizer_id": run.model,
        "num_prompts": run.num_prompts,
        "request_rate": rate,
        "burstiness": run.burstiness,
        "max_concurrency": run.max_concurrency,
        "duration": a.duration_s,
        "completed": a.completed,
        "failed": a.failed + a.rejected,
        "total_input_tokens": a.total_input_tokens,
        "total_output_tokens": a.total_output_tokens,
        "request_throughput": a.request_throughput,
        "request_goodput": a.goodput,
        "output_throughput": a.output_throughput,
        "total_token_throughput": a.total_token_throughput,
        "max_output_tokens_per_s": a.peak_output_throughput,
        "max_concurrent_requests": a.peak_concurrency,
    });
    if let Value::Object(m) = settings {
        out.extend(m);
    }
    let mut input_lens = Vec::new();
    let mut output_lens = Vec::new();
    let mut ttfts = Vec::new();
    let mut itls = Vec::new();
    let mut errors = Vec::new();
    for r in records {
        let (x, error) = match &r.outcome {
            Outcome::Success(x) => (Some(x), String::new()),
            Outcome::Cancelled(x) => (Some(x), "cancelled".into()),
            Outcome::Rejected { status, .. } => (None, format!("HTTP {status}")),
            Outcome::Failed(e) => (None, e.clone()),
        };
        input_lens.push(x.map_or(0, |x| x.prompt_tokens));
        output_lens.push(x.map_or(0, |x| x.output_tokens));
        ttfts.push(x.map_or(0.0, |x| secs(&x.ttft)));
        itls.push(x.map_or(Vec::new(), |x| x.itl.iter().map(secs).collect()));
        errors.push(error);
    }
    out.insert("input_lens".into(), json!(input_lens));
    out.insert("output_lens".into(), json!(output_lens));
    out.insert("ttfts".into(), json!(ttfts));
    out.insert("itls".into(), json!(itls));
    out.insert("errors".into(), json!(errors));
    for m in metrics {
        summarize(&mut out, m, &values(records, m), percentiles);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::RequestResult;
    use std::time::Duration;

    fn ok(ttft_ms: u64, gaps_ms: &[u64]) -> Record {
        let ms = Duration::from_millis;
        let itl: Vec<Duration> = gaps_ms.iter().map(|&g| ms(g)).collect();
        let e2e = ms(ttft_ms + gaps_ms.iter().sum::<u64>());
        Record {
            sent_at: Duration::ZERO,
            outcome: Outcome::Success(RequestResult {
                ttft: ms(ttft_ms),
                e2e,
                itl,
                chunk_times: Vec::new(),
                output_tokens: gaps_ms.len() as u64 + 1,
                prompt_tokens: 10,
                cached_tokens: 0,
                usage_reported: true,
                cache: None,
                text: String::new(),
            }),
        }
    }

    fn run() -> RunInfo {
        RunInfo {
            date: "2026-12-06T08:30:00Z".into(),
            base_url: "http://x".into(),
            model: "org/m".into(),
            endpoint: "chat".into(),
            dataset: "Random".into(),
            num_prompts: 3,
            request_rate: "inf".into(),
            burstiness: 1.0,
            max_concurrency: Some(4),
            seed: 0,
            cache: None,
            command: "synor-loadtest".into(),
        }
    }

    #[test]
    fn the_flat_result_has_vllms_keys_and_units() {
        let records = vec![
            ok(100, &[10, 20]),
            ok(200, &[30]),
            Record {
                sent_at: Duration::ZERO,
                outcome: Outcome::Failed("boom".into()),
            },
        ];
        let a = crate::metrics::aggregate(
            &records,
            Duration::from_secs(1),
            2,
            &[50.0, 99.0],
            Default::default(),
        );
        let m: Vec<String> = METRICS.iter().map(|s| s.to_string()).collect();
        let v = flat(&run(), &a, &records, &[99.0, 99.9], &m);
        assert_eq!(v["backend"], "synor");
        assert_eq!(v["request_rate"], "inf");
        assert_eq!(v["completed"], 2);
        assert_eq!(v["failed"], 1);
        assert_eq!(v["input_lens"], json!([10, 10, 0]));
        assert_eq!(v["ttfts"], json!([0.1, 0.2, 0.0]));
        assert_eq!(v["itls"][0], json!([0.01, 0.02]));
        assert_eq!(v["errors"], json!(["", "", "boom"]));
        assert_eq!(v["mean_ttft_ms"], json!(150.0));
        assert_eq!(v["median_itl_ms"], json!(20.0));
        for key in ["p99_ttft_ms", "p99.9_tpot_ms", "std_e2el_ms", "mean_itl_ms"] {
            assert!(v.get(key).is_some(), "{key}: {v}");
        }
        assert_eq!(
            file_name(&run()),
            "synor-infqps-concurrency4-org_m-20261206-083000.json"
        );
    }
}
