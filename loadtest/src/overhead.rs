//! `synor-loadtest overhead`: the latency of cheap requests (a `GET` such as
//! `/v1/models`, or a `POST` the server rejects during validation) at a
//! fixed concurrency. This measures the HTTP path itself (routing, JSON,
//! middleware), not the model. A `POST` carries `x-synor-cache: bypass`
//! unless `--cache allow`, and the answers' `x-synor-cache` headers are
//! counted, so a generation request answered from the cache is reported.

use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;

use crate::client::{CACHE_HEADER, CacheMode, cache_outcome};
use crate::metrics::{CacheStats, Summary, summarize};

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
    /// With `--body`: `bypass` sends `x-synor-cache: bypass`; `allow` lets
    /// the server's response cache answer.
    #[arg(long, value_enum, default_value_t = CacheMode::Bypass)]
    pub cache: CacheMode,
}

/// Latencies (ms) and the status codes seen.
#[derive(Debug, Clone)]
pub struct OverheadResult {
    pub latency_ms: Summary,
    pub statuses: Vec<(u16, usize)>,
    pub throughput: f64,
    /// The answers by their `x-synor-cache` header.
    pub cache: CacheStats,
}

/// One request: its latency (to the end of the body), its status (0 when
/// the server cannot be reached) and its `x-synor-cache` header.
async fn send_one(
    client: reqwest::Client,
    url: String,
    body: Option<String>,
    cache: CacheMode,
) -> (Duration, u16, Option<String>) {
    let t = Instant::now();
    let req = match body {
        Some(b) => {
            let post = client
                .post(&url)
                .header("content-type", "application/json")
                .body(b);
            match cache {
                CacheMode::Bypass => post.header(CACHE_HEADER, "bypass"),
                CacheMode::Allow => post,
            }
        }
        None => client.get(&url),
    };
    match req.send().await {
        Ok(r) => {
            let (status, cached) = (r.status().as_u16(), cache_outcome(r.headers()));
            let _ = r.bytes().await;
            (t.elapsed(), status, cached)
        }
        Err(_) => (t.elapsed(), 0, None),
    }
}

pub async fn run(a: &OverheadArgs) -> anyhow::Result<OverheadResult> {
    if a.concurrency == 0 || a.requests == 0 {
        bail!("--concurrency and --requests must be at least 1");
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.concurrency)
        .build()?;
    let url = format!("{}{}", a.base_url.trim_end_matches('/'), a.path);
    let send = |client: reqwest::Client| send_one(client, url.clone(), a.body.clone(), a.cache);
    // Warm the connection pool first.
    futures_util::stream::iter(0..a.concurrency)
        .map(|_| send(client.clone()))
        .buffer_unordered(a.concurrency)
        .collect::<Vec<_>>()
        .await;
    let start = Instant::now();
    let results: Vec<(Duration, u16, Option<String>)> = futures_util::stream::iter(0..a.requests)
        .map(|_| send(client.clone()))
        .buffer_unordered(a.concurrency)
        .collect()
        .await;
    let wall = start.elapsed().as_secs_f64();
    if results.iter().all(|(_, s, _)| *s == 0) {
        bail!("cannot reach {url}");
    }
    let ms: Vec<f64> = results
        .iter()
        .map(|(d, _, _)| d.as_secs_f64() * 1e3)
        .collect();
    let mut statuses: Vec<(u16, usize)> = Vec::new();
    for (_, s, _) in &results {
        match statuses.iter_mut().find(|(c, _)| c == s) {
            Some(e) => e.1 += 1,
            None => statuses.push((*s, 1)),
        }
    }
    statuses.sort();
    let latency_ms = summarize(&ms, &[50.0, 90.0, 99.0])
        .ok_or_else(|| anyhow::anyhow!("no requests completed"))?;
    let reached = results.iter().filter(|(_, s, _)| *s != 0);
    Ok(OverheadResult {
        latency_ms,
        statuses,
        throughput: results.len() as f64 / wall,
        cache: CacheStats::count(reached.map(|(_, _, c)| c.as_deref())),
    })
}
