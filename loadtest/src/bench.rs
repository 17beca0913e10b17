//! Runs one benchmark: a warm-up request, then every request at its
//! arrival time, at most `max_concurrency` in flight, with a live progress
//! bar; returns each request's outcome and when it was sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Semaphore;

use crate::client::{self, Outcome, Target};
use crate::dataset::RequestSpec;
use crate::metrics::Record;
use crate::traffic;

/// What to run.
#[derive(Clone)]
pub struct Plan {
    pub target: Target,
    pub specs: Vec<RequestSpec>,
    /// Requests per second; infinity sends everything at once.
    pub request_rate: f64,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub warmup: bool,
    /// Drop each connection after this many content chunks.
    pub cancel_after: Option<usize>,
    pub progress: bool,
    pub timeout: Duration,
    /// Stop sending once this much time has passed since the start.
    pub duration: Option<Duration>,
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub records: Vec<Record>,
    pub duration: Duration,
    pub peak_concurrency: usize,
}

/// Runs `plan`. Fails only when the warm-up request fails (the server is
/// unreachable or refuses the model); later failures are counted.
pub async fn run(plan: &Plan) -> anyhow::Result<RunOutput> {
    let client = reqwest::Client::builder()
        .timeout(plan.timeout)
        // A fresh connection per request, as vLLM's benchmark does: no request
        // fails on a keep-alive connection the server has just closed.
        .pool_max_idle_per_host(0)
        .build()?;
    if plan.warmup
        && let Some(first) = plan.specs.first()
    {
        let mut warm = first.clone();
        warm.max_tokens = warm.max_tokens.min(16);
        match client::send(&client, &plan.target, &warm, None).await {
            Outcome::Success(_) => {}
            Outcome::Failed(e) => bail!("the warm-up request failed: {e}"),
            Outcome::Rejected { status, .. } => bail!("the warm-up request was refused ({status})"),
            Outcome::Cancelled(_) => {}
        }
    }
    let offsets = traffic::arrival_offsets(
        plan.specs.len(),
        plan.request_rate,
        plan.burstiness,
        plan.seed,
    );
    let bar = progress_bar(plan.progress, plan.specs.len());
    let limit = Arc::new(Semaphore::new(
        plan.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS),
    ));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(plan.specs.len());
    let deadline = plan.duration.map(|d| start + d);
    for (spec, offset) in plan.specs.iter().cloned().zip(offsets) {
        if deadline.is_some_and(|d| start + offset >= d) {
            break;
        }
        let (client, target) = (client.clone(), plan.target.clone());
        let (limit, in_flight, peak, bar) =
            (limit.clone(), in_flight.clone(), peak.clone(), bar.clone());
        let cancel_after = plan.cancel_after;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((start + offset).into()).await;
            let _permit = limit.acquire_owned().await;
            // Past the deadline while it waited for a slot: not sent.
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            let sent_at = start.elapsed();
            let outcome = client::send(&client, &target, &spec, cancel_after).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            bar.inc(1);
            Some(Record { sent_at, outcome })
        }));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        match t.await {
            Ok(Some(r)) => records.push(r),
            Ok(None) => {}
            Err(e) => records.push(Record {
                sent_at: Duration::ZERO,
                outcome: Outcome::Failed(format!("request task failed: {e}")),
            }),
        }
    }
    let duration = start.elapsed();
    bar.finish_and_clear();
    Ok(RunOutput {
        records,
        duration,
        peak_concurrency: peak.load(Ordering::SeqCst),
    })
}

fn progress_bar(show: bool, n: usize) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} requests ({per_sec})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
