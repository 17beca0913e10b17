//! `synor-loadtest overhead`: the latency of cheap requests (a `GET` such as
//! `/v1/models`, or a `POST` the server rejects during validation) at a
//! fixed concurrency. This measures the HTTP path itself (routing, JSON,
//! middleware), not the model.

use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;

use crate::metrics::{Summary, summarize};

/// What to send and how hard.
#[derive(Debug, Clone, clap::Args)]
pub struct OverheadArgs {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub base_url: String,
    /// Path to request, e.g. `/v1/models`.
    #[arg(long, default_value = "/v1/models")]
    pub path: String,
    /// A JSON body: the request becomes a POST.
    #[arg(long)]
    pub body: Option<String>,
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 5000)]
    pub requests: usize,
}

/// Latencies (ms) and the status codes seen.
#[derive(Debug, Clone)]
pub struct OverheadResult {
    pub latency_ms: Summary,
    pub statuses: Vec<(u16, usize)>,
    pub throughput: f64,
}

pub async fn run(a: &OverheadArgs) -> anyhow::Result<OverheadResult> {
    if a.concurrency == 0 || a.requests == 0 {
        bail!("--concurrency and --requests must be at least 1");
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.concurrency)
        .build()?;
    let url = format!("{}{}", a.base_url.trim_end_matches('/'), a.path);
    let send = |client: reqwest::Client| {
        let (url, body) = (url.clone(), a.body.clone());
        async move {
            let t = Instant::now();
            let req = match body {
                Some(b) => client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(b),
                None => client.get(&url),
            };
            let status = match req.send().await {
                Ok(r) => {
                    let s = r.status().as_u16();
                    let _ = r.bytes().await;
                    s
                }
                Err(_) => 0,
            };
            (t.elapsed(), status)
        }
    };
    // Warm the connection pool first.
    futures_util::stream::iter(0..a.concurrency)
        .map(|_| send(client.clone()))
        .buffer_unordered(a.concurrency)
        .collect::<Vec<_>>()
        .await;
    let start = Instant::now();
    let results: Vec<(Duration, u16)> = futures_util::stream::iter(0..a.requests)
        .map(|_| send(client.clone()))
        .buffer_unordered(a.concurrency)
        .collect()
        .await;
    let wall = start.elapsed().as_secs_f64();
    if results.iter().all(|(_, s)| *s == 0) {
        bail!("cannot reach {url}");
    }
    let ms: Vec<f64> = results.iter().map(|(d, _)| d.as_secs_f64() * 1e3).collect();
    let mut statuses: Vec<(u16, usize)> = Vec::new();
    for (_, s) in &results {
        match statuses.iter_mut().find(|(c, _)| c == s) {
            Some(e) => e.1 += 1,
            None => statuses.push((*s, 1)),
        }
    }
    statuses.sort();
    let latency_ms = summarize(&ms, &[50.0, 90.0, 99.0])
        .ok_or_else(|| anyhow::anyhow!("no requests completed"))?;
    Ok(OverheadResult {
        latency_ms,
        statuses,
        throughput: results.len() as f64 / wall,
    })
}
