//! What recording the request series costs a token (`services::served`):
//! a stream's events observed one token at a time, as the server does for
//! every generation, against the same loop without the recording, side by
//! side in one run; with one replay moving the stream to another executor
//! halfway, and with 16 streams on the same (model, executor) from 16
//! threads (the cells' counters are shared atomics).
//!
//! `cargo bench -p server --bench served`

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{FinishReason, TokenEvent, Usage};
use server::services::served::{Served, executor};

const TOKENS: usize = 200_000;

fn delta() -> TokenEvent {
    TokenEvent::Delta {
        text: "x".into(),
        token_ids: vec![7],
        logprobs: Vec::new(),
    }
}

fn finished() -> TokenEvent {
    TokenEvent::Finished {
        reason: FinishReason::Length,
        usage: Usage {
            prompt_tokens: 16,
            completion_tokens: TOKENS,
            cached_tokens: 0,
        },
    }
}

/// Nanoseconds a token: one stream of `TOKENS` events, recorded or not.
fn one_stream(record: bool, replay: bool) -> f64 {
    let served = Arc::new(Served::default());
    let on = executor("cpu");
    let ev = delta();
    let t0 = Instant::now();
    let mut w = record.then(|| served.watch("m", on.clone(), t0));
    let mut seen = 0usize;
    for i in 0..TOKENS {
        if replay && i == TOKENS / 2 {
            *on.lock().unwrap_or_else(|p| p.into_inner()) = "w@provider:p".into();
        }
        let now = t0 + Duration::from_nanos(i as u64 * 1_000);
        match &mut w {
            Some(w) => w.observe(&ev, now, 16),
            None => seen += std::hint::black_box(&ev).clone_len(),
        }
    }
    if let Some(w) = &mut w {
        w.observe(&finished(), Instant::now(), 16);
    }
    std::hint::black_box(seen);
    t0.elapsed().as_nanos() as f64 / TOKENS as f64
}

/// Nanoseconds a token with `threads` streams recorded at once.
fn many_streams(threads: usize) -> f64 {
    let served = Arc::new(Served::default());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let served = served.clone();
            s.spawn(move || {
                let mut w = served.watch("m", executor("cpu"), Instant::now());
                let ev = delta();
                for _ in 0..TOKENS / threads {
                    w.observe(&ev, Instant::now(), 16);
                }
                w.observe(&finished(), Instant::now(), 16);
            });
        }
    });
    t0.elapsed().as_nanos() as f64 / TOKENS as f64
}

trait CloneLen {
    fn clone_len(&self) -> usize;
}

impl CloneLen for TokenEvent {
    /// What the loop without recording does with an event: reads it.
    fn clone_len(&self) -> usize {
        match self {
            TokenEvent::Delta { token_ids, .. } => token_ids.len(),
            TokenEvent::Finished { .. } | TokenEvent::Failed(_) => 0,
        }
    }
}

fn main() {
    println!("ns per token (median of 5 runs, {TOKENS} tokens each)");
    let median = |f: &dyn Fn() -> f64| {
        let mut xs: Vec<f64> = (0..5).map(|_| f()).collect();
        xs.sort_by(f64::total_cmp);
        xs[2]
    };
    println!(
        "  not recorded:              {:8.1}",
        median(&|| one_stream(false, false))
    );
    println!(
        "  recorded, one executor:    {:8.1}",
        median(&|| one_stream(true, false))
    );
    println!(
        "  recorded, one replay:      {:8.1}",
        median(&|| one_stream(true, true))
    );
    println!(
        "  recorded, 16 streams:      {:8.1}",
        median(&|| many_streams(16))
    );
}
