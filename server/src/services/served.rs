//! Requests as their clients see them, whatever ran them: the vLLM-named
//! request series (requests running, time to first token, inter-token
//! latency, end-to-end time, finished requests by reason, prompt and
//! generated tokens), labelled by model and by executor (the house
//! engine's, or a provider worker's `name@provider`). They are recorded
//! where every generation's events pass on their way to the client
//! (`generation::Run`), so a request a worker served counts as one the
//! house served does, and a dashboard built for vLLM shows the whole fleet.
//! What only an engine knows (its queue, KV cache, steps) stays with the
//! engine's own series.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::latency::LatencyCell;
use engine::{FinishReason, LatencyStats, TokenEvent};

/// Where a choice runs now: set by whoever places it (a relay names each
/// attempt's executor), read when its events are recorded.
pub type Executor = Arc<Mutex<String>>;

/// An executor label for a choice that runs where `name` says.
pub fn executor(name: &str) -> Executor {
    Arc::new(Mutex::new(name.to_string()))
}

fn read(e: &Executor) -> String {
    e.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// One (model, executor)'s requests.
#[derive(Debug, Default)]
struct Cell {
    /// Latencies and finished requests (its token counts stay zero: the
    /// tokens are counted as they come, below).
    latency: LatencyCell,
    running: AtomicU64,
    /// Prompt tokens of requests that got their first token, and tokens
    /// generated, as they reached the server.
    prompt: AtomicU64,
    generated: AtomicU64,
}

/// Every (model, executor)'s requests, recorded as they run.
#[derive(Debug, Default)]
pub struct Served {
    cells: Mutex<BTreeMap<(String, String), Arc<Cell>>>,
}

/// One (model, executor)'s requests, read now.
#[derive(Debug, Clone)]
pub struct ServedStats {
    pub model: String,
    pub executor: String,
    pub running: u64,
    /// Its latency histograms, finished requests by reason, and tokens.
    pub latency: LatencyStats,
}

impl Served {
    fn cell(&self, model: &str, executor: &str) -> Arc<Cell> {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        cells
            .entry((model.to_string(), executor.to_string()))
            .or_default()
            .clone()
    }

    /// Starts watching one choice of `model` submitted at `since`, running
    /// where `executor` says.
    pub fn watch(self: &Arc<Self>, model: &str, executor: Executor, since: Instant) -> Watch {
        let label = read(&executor);
        let cell = self.cell(model, &label);
        cell.running.fetch_add(1, Ordering::Relaxed);
        Watch {
            served: self.clone(),
            model: model.to_string(),
            executor,
            started: since,
            last: None,
            running: cell.clone(),
            now: (label, cell),
            ended: false,
        }
    }

    /// Every (model, executor) seen, by model then executor.
    pub fn snapshot(&self) -> Vec<ServedStats> {
        let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        cells
            .iter()
            .map(|((model, executor), c)| {
                let mut latency = c.latency.snapshot();
                latency.prompt_tokens = c.prompt.load(Ordering::Relaxed);
                latency.generation_tokens = c.generated.load(Ordering::Relaxed);
                ServedStats {
                    model: model.clone(),
                    executor: executor.clone(),
                    running: c.running.load(Ordering::Relaxed),
                    latency,
                }
            })
            .collect()
    }
}

/// One choice on its way to the client. Dropped, it no longer counts as
/// running; dropped before its end (the client left), it counts as
/// aborted.
#[derive(Debug)]
pub struct Watch {
    served: Arc<Served>,
    model: String,
    executor: Executor,
    started: Instant,
    /// When its last token reached the server.
    last: Option<Instant>,
    /// The cell it counts as running in (its executor when it started).
    running: Arc<Cell>,
    /// The executor it ran on at its last event, and that one's cell
    /// (looked up again only when a replay moves it).
    now: (String, Arc<Cell>),
    ended: bool,
}

impl Watch {
    /// Records one event of the choice, at `now`.
    pub fn observe(&mut self, ev: &TokenEvent, now: Instant, prompt: usize) {
        match ev {
            TokenEvent::Delta { token_ids, .. } if !token_ids.is_empty() => {
                self.tokens(token_ids.len(), now, prompt);
            }
            TokenEvent::Delta { .. } => {}
            TokenEvent::Finished { reason, .. } => self.end(*reason, now),
            // A failure is an error answer, not a finished request.
            TokenEvent::Failed(_) => self.ended = true,
        }
    }

    /// `n` tokens arrived together: the first one's wait is the time to
    /// first token or an inter-token gap; a batch shares its gap evenly.
    fn tokens(&mut self, n: usize, now: Instant, prompt: usize) {
        let cell = self.current();
        cell.generated.fetch_add(n as u64, Ordering::Relaxed);
        let mut n = n;
        if self.last.is_none() {
            cell.latency.ttft.observe(now - self.started);
            cell.prompt.fetch_add(prompt as u64, Ordering::Relaxed);
            n -= 1;
        }
        if n > 0 {
            let gap = self.last.map_or(Duration::ZERO, |t| now - t) / n as u32;
            for _ in 0..n {
                cell.latency.itl.observe(gap);
            }
        }
        self.last = Some(now);
    }

    fn end(&mut self, reason: FinishReason, now: Instant) {
        if self.ended {
            return;
        }
        self.ended = true;
        let cell = self.current();
        cell.latency.e2e.observe(now - self.started);
        cell.latency.record_finish(reason, 0, 0);
    }

    /// The cell of the executor the choice runs on now: the last one's
    /// unless its executor changed (one uncontended lock and a string
    /// comparison per event otherwise).
    fn current(&mut self) -> Arc<Cell> {
        let moved = {
            let on = self.executor.lock().unwrap_or_else(|p| p.into_inner());
            (*on != self.now.0).then(|| on.clone())
        };
        if let Some(label) = moved {
            let cell = self.served.cell(&self.model, &label);
            self.now = (label, cell);
        }
        self.now.1.clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.running.running.fetch_sub(1, Ordering::Relaxed);
        if !self.ended {
            self.current()
                .latency
                .record_finish(FinishReason::Abort, 0, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::Usage;

    /// Prompt tokens of the test requests.
    const PROMPT: usize = 5;

    fn delta(n: usize) -> TokenEvent {
        TokenEvent::Delta {
            text: "x".repeat(n),
            token_ids: vec![1; n],
            logprobs: Vec::new(),
        }
    }

    #[test]
    fn a_choice_counts_where_it_runs_and_moves_with_a_replay() {
        let served = Arc::new(Served::default());
        let t0 = Instant::now();
        let on = executor("cpu");
        let mut w = served.watch("m", on.clone(), t0);
        w.observe(&delta(1), t0 + Duration::from_millis(50), PROMPT);
        // Replayed on a worker: later tokens count there.
        *on.lock().expect("label") = "w1@provider:p".into();
        w.observe(&delta(2), t0 + Duration::from_millis(70), PROMPT);
        let usage = Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 0,
        };
        let fin = TokenEvent::Finished {
            reason: FinishReason::Length,
            usage,
        };
        w.observe(&fin, t0 + Duration::from_millis(80), PROMPT);
        let by = |s: &[ServedStats], e: &str| {
            s.iter().find(|x| x.executor == e).cloned().expect("a cell")
        };
        let now = served.snapshot();
        assert_eq!(by(&now, "cpu").running, 1, "counted where it started");
        let house = by(&now, "cpu");
        assert_eq!(house.latency.ttft.count(), 1);
        let tokens = |s: &ServedStats| (s.latency.prompt_tokens, s.latency.generation_tokens);
        assert_eq!(tokens(&house), (5, 1));
        let worker = by(&now, "w1@provider:p");
        assert_eq!(worker.latency.itl.count(), 2, "two tokens, one gap shared");
        let itl = worker.latency.itl.sum_seconds;
        assert!((itl - 0.020).abs() < 1e-6, "{itl}");
        assert_eq!(worker.latency.e2e.count(), 1);
        assert_eq!(tokens(&worker), (0, 2));
        drop(w);
        let after = served.snapshot();
        assert_eq!(by(&after, "cpu").running, 0);
        let total: u64 = after
            .iter()
            .flat_map(|s| s.latency.finished.iter().map(|(_, n)| n))
            .sum();
        assert_eq!(total, 1, "finished once, not also aborted");
    }

    #[test]
    fn a_choice_the_client_left_is_an_abort() {
        let served = Arc::new(Served::default());
        let w = served.watch("m", executor("cpu"), Instant::now());
        drop(w);
        let s = served.snapshot();
        assert_eq!(
            s[0].latency
                .finished
                .iter()
                .find(|(r, _)| *r == "abort")
                .map(|x| x.1),
            Some(1)
        );
        assert_eq!(s[0].running, 0);
    }
}
