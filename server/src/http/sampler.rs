//! The console's overview: a sampler that reads the server's counters once
//! a second (engines, HTTP answers, response cache, fleet, utilization),
//! turns them into rates and percentiles over the last ten seconds, and
//! keeps one such sample every ten seconds for an hour, in the database
//! too when there is one, so a restart keeps the hour. Subscribers (the
//! console's event stream) get every sample as it is taken.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::cache::ResponseCache;
use crate::fleet::registry::Registry;
use crate::http::metrics::HttpMetrics;
use crate::services::dispatch::Dispatch;
use engine::registry::{ModelKind, ModelRegistry};

/// What the sampler reads.
#[derive(Debug, Clone)]
pub struct Sources {
    pub models: Arc<ModelRegistry>,
    pub http: Arc<HttpMetrics>,
    pub fleet: Arc<Registry>,
    pub cache: Option<Arc<ResponseCache>>,
    pub dispatch: Arc<Dispatch>,
    pub served: Arc<crate::services::served::Served>,
    /// Where the history points are kept (none: in memory only).
    pub store: Option<money::store::Db>,
}

/// How often the sampler reads the counters.
pub const TICK: Duration = Duration::from_secs(1);
/// The window rates and percentiles are taken over, and the spacing of the
/// history's points.
pub const WINDOW_S: u64 = 10;
/// Points the history keeps (an hour).
const HISTORY: usize = 360;
/// Routes whose answers are generation requests.
const GENERATION_ROUTES: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// Three latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// One executor's busy share (of the last minute).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecutorBusy {
    /// `house`, or a worker id.
    pub executor: String,
    pub busy: f64,
}

/// The platform at one moment: gauges now, and rates and percentiles over
/// the last ten seconds. Latency percentiles are the house engine's.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Sample {
    /// Unix milliseconds.
    pub t: u64,
    /// Whether this sample is also a point of the history (one every ten
    /// seconds).
    pub point: bool,
    /// Requests running (on any executor: the house's or a worker) and
    /// waiting on the house engines.
    pub running: u64,
    pub waiting: u64,
    /// Generation requests answered (2xx) since the server started.
    pub requests_total: u64,
    /// Tokens generated since the server started, on every executor.
    pub output_tokens_total: u64,
    pub output_tokens_per_s: f64,
    pub prompt_tokens_per_s: f64,
    pub requests_per_s: f64,
    /// `None` when no request finished its first token in the window.
    pub ttft_ms: Option<Percentiles>,
    pub itl_ms: Option<Percentiles>,
    /// KV blocks in use, 0..=1 (the fullest engine).
    pub kv_cache_usage: f64,
    /// Prompt tokens found in the prefix cache, of those looked up.
    pub prefix_cache_hit_rate: Option<f64>,
    /// Response-cache lookups that hit (any tier), of all lookups.
    pub response_cache_hit_rate: Option<f64>,
    /// HTTP answers with a 5xx and a 4xx status in the window.
    pub server_errors: u64,
    pub client_errors: u64,
    /// Workers connected.
    pub workers: u64,
    /// Each executor's busy share: the house's time in forward passes
    /// over the window; a worker's share of the last minute with work
    /// placed on it.
    pub executors: Vec<ExecutorBusy>,
}

/// `GET /admin/overview`: the current sample and the last hour.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OverviewAnswer {
    /// Seconds between history points.
    pub interval_s: u64,
    pub current: Sample,
    /// Oldest first.
    pub history: Vec<Sample>,
}

/// Cumulative counters read at one instant.
#[derive(Debug, Clone, Default)]
struct Reading {
    t_ms: u64,
    running: u64,
    waiting: u64,
    kv_usage: f64,
    generated: u64,
    prompt: u64,
    requests: u64,
    ttft: Vec<u64>,
    itl: Vec<u64>,
    /// The TTFT and inter-token histograms' bucket bounds.
    bounds: (&'static [f64], &'static [f64]),
    prefix: (u64, u64),
    cache: (u64, u64),
    errors: (u64, u64),
    workers: u64,
    executors: Vec<ExecutorBusy>,
    /// The house engines' time in forward passes (µs).
    house_busy_us: u64,
}

#[derive(Debug, Default)]
struct Kept {
    /// The last `WINDOW_S + 1` readings, oldest first.
    readings: VecDeque<Reading>,
    history: VecDeque<Sample>,
}

/// The sampler's state and its subscribers.
#[derive(Debug)]
pub struct Overview {
    kept: Mutex<Kept>,
    tx: broadcast::Sender<Sample>,
}

impl Default for Overview {
    fn default() -> Self {
        Self {
            kept: Mutex::default(),
            tx: broadcast::channel(64).0,
        }
    }
}

impl Overview {
    /// Samples `sources` every `TICK`, for as long as the runtime runs.
    pub fn start(self: Arc<Self>, sources: Sources) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            // After a stall, one reading, not a burst of them (a burst
            // would shrink the window rates are taken over).
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let s = self.take(read(&sources));
                if let (true, Some(db)) = (s.point, &sources.store) {
                    keep(db, &s).await;
                }
            }
        });
    }

    /// Takes back the last hour's points a previous run of the server
    /// kept (before `start`, so the first answer has them).
    pub async fn restore(&self, db: &money::store::Db) {
        let since = now_ms().saturating_sub(HISTORY as u64 * WINDOW_S * 1000);
        let points = match db.points_since(since as i64).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "the overview's history could not be read");
                return;
            }
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.history = points
            .iter()
            .filter_map(|p| serde_json::from_str::<Sample>(p).ok())
            .collect();
        while kept.history.len() > HISTORY {
            kept.history.pop_front();
        }
    }

    /// Every sample from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Sample> {
        self.tx.subscribe()
    }

    /// The last hour, and a sample taken now (not kept).
    pub fn answer(&self, sources: &Sources) -> OverviewAnswer {
        let now = read(sources);
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let mut current = sample(kept.readings.front().unwrap_or(&now), &now);
        current.point = false;
        OverviewAnswer {
            interval_s: WINDOW_S,
            current,
            history: kept.history.iter().cloned().collect(),
        }
    }

    /// Keeps a reading, makes it a sample (a history point every
    /// `WINDOW_S` seconds), sends it to subscribers and returns it.
    fn take(&self, r: Reading) -> Sample {
        let s = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            kept.readings.push_back(r);
            while kept.readings.len() > WINDOW_S as usize + 1 {
                kept.readings.pop_front();
            }
            let (first, last) = (&kept.readings[0], &kept.readings[kept.readings.len() - 1]);
            let mut s = sample(first, last);
            let due = kept
                .history
                .back()
                .is_none_or(|p| s.t >= p.t + WINDOW_S * 1000 - 500);
            s.point = due;
            if due {
                kept.history.push_back(s.clone());
                while kept.history.len() > HISTORY {
                    kept.history.pop_front();
                }
            }
            s
        };
        let _ = self.tx.send(s.clone());
        s
    }
}

/// Keeps a history point in the database (a failure costs only the
/// point, after a restart).
async fn keep(db: &money::store::Db, s: &Sample) {
    let Ok(json) = serde_json::to_string(s) else {
        return;
    };
    if let Err(e) = db.save_point(s.t as i64, &json).await {
        tracing::warn!(error = %e, "an overview point was not kept");
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Reads every counter the overview needs.
fn read(state: &Sources) -> Reading {
    let mut r = Reading {
        t_ms: now_ms(),
        ..Reading::default()
    };
    for m in state.models.list() {
        let ModelKind::Text(h) = &m.kind else {
            continue;
        };
        let s = h.stats();
        r.waiting += s.num_waiting;
        r.kv_usage = r.kv_usage.max(s.kv_usage());
        r.prefix.0 += s.prefix_queries;
        r.prefix.1 += s.prefix_hits;
        r.house_busy_us += s.busy_micros;
    }
    // Requests as clients see them, on every executor.
    for s in state.served.snapshot() {
        let l = &s.latency;
        r.running += s.running;
        r.generated += l.generation_tokens;
        r.prompt += l.prompt_tokens;
        add(&mut r.ttft, &l.ttft.counts);
        add(&mut r.itl, &l.itl.counts);
        r.bounds = (l.ttft.bounds, l.itl.bounds);
    }
    r.workers = state.fleet.list().len() as u64;
    for ((route, _, status), n) in state.http.snapshot() {
        match status {
            500.. => r.errors.0 += n,
            400..=499 => r.errors.1 += n,
            200..=299 if GENERATION_ROUTES.contains(&route.as_str()) => r.requests += n,
            _ => {}
        }
    }
    if let Some(cache) = &state.cache {
        for t in cache.stats() {
            r.cache.0 += t.hits.get() + t.misses.get();
            r.cache.1 += t.hits.get();
        }
    }
    r.executors = state
        .dispatch
        .stats
        .utilization
        .report()
        .into_iter()
        .map(|u| ExecutorBusy {
            executor: u.executor,
            busy: u.busy_1m,
        })
        .collect();
    r
}

/// Adds histogram bucket counts into `into`.
fn add(into: &mut Vec<u64>, counts: &[u64]) {
    into.resize(into.len().max(counts.len()), 0);
    for (a, b) in into.iter_mut().zip(counts) {
        *a += b;
    }
}

/// The sample between two readings (`a` earlier).
fn sample(a: &Reading, b: &Reading) -> Sample {
    let secs = (b.t_ms.saturating_sub(a.t_ms) as f64 / 1e3).max(1e-3);
    let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
    let ratio = |(q0, h0): (u64, u64), (q1, h1): (u64, u64)| {
        let q = q1.saturating_sub(q0);
        (q > 0).then(|| h1.saturating_sub(h0) as f64 / q as f64)
    };
    let delta = |x: &[u64], y: &[u64]| -> Vec<u64> {
        y.iter()
            .enumerate()
            .map(|(i, n)| n.saturating_sub(x.get(i).copied().unwrap_or(0)))
            .collect()
    };
    Sample {
        t: b.t_ms,
        point: false,
        running: b.running,
        waiting: b.waiting,
        requests_total: b.requests,
        output_tokens_total: b.generated,
        output_tokens_per_s: rate(a.generated, b.generated),
        prompt_tokens_per_s: rate(a.prompt, b.prompt),
        requests_per_s: rate(a.requests, b.requests),
        ttft_ms: percentiles(b.bounds.0, &delta(&a.ttft, &b.ttft)),
        itl_ms: percentiles(b.bounds.1, &delta(&a.itl, &b.itl)),
        kv_cache_usage: b.kv_usage,
        prefix_cache_hit_rate: ratio(a.prefix, b.prefix),
        response_cache_hit_rate: ratio(a.cache, b.cache),
        server_errors: b.errors.0.saturating_sub(a.errors.0),
        client_errors: b.errors.1.saturating_sub(a.errors.1),
        workers: b.workers,
        executors: executors(a, b, secs),
    }
}

/// Each executor's busy share: the workers' from the placement's
/// utilization (the last minute), the house's from its engines' time in
/// forward passes over the window (the house also serves what placement
/// never sees).
fn executors(a: &Reading, b: &Reading, secs: f64) -> Vec<ExecutorBusy> {
    let house = b.house_busy_us.saturating_sub(a.house_busy_us) as f64 / (secs * 1e6);
    let mut out = vec![ExecutorBusy {
        executor: "house".into(),
        busy: house.clamp(0.0, 1.0),
    }];
    out.extend(
        b.executors
            .iter()
            .filter(|e| e.executor != "house")
            .cloned(),
    );
    out
}

/// p50, p90 and p99 (ms) of a histogram's per-bucket counts (`bounds` in
/// seconds, one more count than bounds for `+Inf`), interpolated linearly
/// within a bucket as Prometheus' `histogram_quantile` does; `None` when
/// empty.
pub fn percentiles(bounds: &[f64], counts: &[u64]) -> Option<Percentiles> {
    let total: u64 = counts.iter().sum();
    if total == 0 || bounds.is_empty() {
        return None;
    }
    let q = |p: f64| {
        let rank = p * total as f64;
        let mut seen = 0.0;
        for (i, &n) in counts.iter().enumerate() {
            let next = seen + n as f64;
            if n > 0 && next >= rank {
                let Some(&hi) = bounds.get(i) else {
                    return bounds[bounds.len() - 1] * 1e3;
                };
                let lo = if i == 0 { 0.0 } else { bounds[i - 1] };
                return (lo + (hi - lo) * (rank - seen) / n as f64) * 1e3;
            }
            seen = next;
        }
        bounds[bounds.len() - 1] * 1e3
    };
    Some(Percentiles {
        p50: q(0.5),
        p90: q(0.9),
        p99: q(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_within_the_bucket() {
        let bounds = [0.01, 0.1, 1.0];
        // 100 observations: 50 under 10 ms, 40 in 10-100 ms, 10 in 0.1-1 s.
        let p = percentiles(&bounds, &[50, 40, 10, 0]).expect("some");
        assert!((p.p50 - 10.0).abs() < 1e-9, "{p:?}");
        assert!((p.p90 - 100.0).abs() < 1e-9, "{p:?}");
        assert!((p.p99 - 910.0).abs() < 1e-9, "{p:?}");
        assert_eq!(percentiles(&bounds, &[0, 0, 0, 0]), None);
        // Beyond the last bound: the last bound.
        let p = percentiles(&bounds, &[0, 0, 0, 5]).expect("some");
        assert_eq!(p.p99, 1000.0);
    }

    #[test]
    fn a_sample_is_rates_and_deltas_between_two_readings() {
        let bounds: &'static [f64] = &[0.1, 1.0];
        let a = Reading {
            t_ms: 1_000,
            generated: 100,
            requests: 3,
            ttft: vec![1, 0, 0],
            bounds: (bounds, bounds),
            prefix: (10, 5),
            cache: (4, 1),
            errors: (1, 2),
            ..Reading::default()
        };
        let b = Reading {
            t_ms: 11_000,
            generated: 600,
            requests: 8,
            ttft: vec![1, 2, 0],
            bounds: (bounds, bounds),
            prefix: (30, 20),
            cache: (4, 1),
            errors: (3, 2),
            running: 2,
            house_busy_us: 2_500_000,
            ..Reading::default()
        };
        let s = sample(&a, &b);
        assert_eq!(s.output_tokens_per_s, 50.0);
        assert_eq!(s.requests_per_s, 0.5);
        assert_eq!(s.requests_total, 8);
        assert_eq!(s.prefix_cache_hit_rate, Some(0.75));
        assert_eq!(s.response_cache_hit_rate, None, "no lookups in the window");
        assert_eq!((s.server_errors, s.client_errors), (2, 0));
        assert_eq!(s.executors[0].executor, "house");
        assert!(
            (s.executors[0].busy - 0.25).abs() < 1e-9,
            "{:?}",
            s.executors
        );
        let ttft = s.ttft_ms.expect("two first tokens in the window");
        assert!(ttft.p50 > 100.0 && ttft.p50 <= 1000.0, "{ttft:?}");
        // A counter that went down (a worker left) is not a negative rate.
        let s = sample(&b, &a);
        assert_eq!(s.output_tokens_per_s, 0.0);
    }

    #[test]
    fn the_history_keeps_one_point_per_window_for_an_hour() {
        let o = Overview::default();
        for i in 0..(HISTORY as u64 + 20) * WINDOW_S {
            o.take(Reading {
                t_ms: 1_000_000 + i * 1000,
                generated: i,
                ..Reading::default()
            });
        }
        let kept = o.kept.lock().expect("lock");
        assert_eq!(kept.history.len(), HISTORY);
        assert_eq!(kept.readings.len(), WINDOW_S as usize + 1);
        let gaps: Vec<u64> = kept
            .history
            .iter()
            .zip(kept.history.iter().skip(1))
            .map(|(a, b)| b.t - a.t)
            .collect();
        assert!(gaps.iter().all(|&g| g == WINDOW_S * 1000), "{gaps:?}");
        let last = kept.history.back().expect("points");
        assert!((last.output_tokens_per_s - 1.0).abs() < 1e-9);
        drop(kept);
        let mut rx = o.subscribe();
        o.take(Reading::default());
        assert!(rx.try_recv().is_ok(), "subscribers get samples");
    }
}
