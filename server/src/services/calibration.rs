//! Calibration: the server measures every executor itself, on the real
//! model, with a seeded challenge it times on its own clock: a prefill of
//! `PREFILL` random tokens (the time to the first token, best of two) and
//! one of `PREFILL_LONG` (a long prompt's tokens cost more), then
//! decoding `DECODE` tokens alone and four sequences at once (the time to
//! the last token over the tokens, the median over sequences). A worker
//! gets no work until it is calibrated, and is
//! measured again every `RECALIBRATE` (sooner, `DRIFT_RECHECK`, when its
//! observed steps drift past 2x of its profile); what it reports about itself is
//! shown to admins, never used. The challenge travels as ordinary
//! assignments, so a worker cannot tell it from real traffic. The house
//! engine is calibrated the same way at start-up.
//!
//! The decode challenges are also canaries: their greedy answers are
//! known (the house engine scores them, as a spot check would), so a
//! worker that does not run the model it registered is quarantined
//! before it earns anything, as is one that fails
//! `MAX_FAILED_CALIBRATIONS` challenges in a row.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::core::CoreEvent;
use engine::{EngineHandle, GenerateRequest, SamplingParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;

use crate::fleet::jobs::JobEvent;
use crate::fleet::protocol::{JobParams, ToWorker, VERSION};
use crate::fleet::registry::{Profile, Registry, WorkerInfo};
use crate::services::dispatch::Dispatch;
use crate::services::models::ModelRegistry;
use crate::services::spotcheck::{Sample, Verdict};

/// Prompt tokens of the prefill challenges.
const PREFILL: usize = crate::fleet::registry::PREFILL_SHORT;
const PREFILL_LONG: usize = crate::fleet::registry::PREFILL_LONG;
/// Tokens of each decode challenge.
const DECODE: usize = 24;
/// How long one challenge job may take before the worker fails it.
const JOB_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a calibrated worker is measured again.
const RECALIBRATE: Duration = Duration::from_secs(600);
/// How soon after a calibration a worker whose steps drifted from its
/// profile is measured again.
const DRIFT_RECHECK: Duration = Duration::from_secs(30);
/// How often the calibrator looks for workers to measure.
const SCAN: Duration = Duration::from_millis(200);

/// Where a challenge runs.
#[derive(Clone, Copy)]
enum On<'a> {
    House(&'a EngineHandle),
    Worker(&'a Registry, &'a str, &'a str),
}

/// Measures every worker as it comes (and again every `RECALIBRATE`),
/// until the process ends; the house engine is measured once, when the
/// first worker arrives (a server without workers does no extra work).
pub async fn run(fleet: Arc<Registry>, models: Arc<ModelRegistry>, dispatch: Arc<Dispatch>) {
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let failures: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    // One challenge at a time: challenges that overlap on shared cores
    // measure each other, not the executor.
    let one_at_a_time = Arc::new(tokio::sync::Semaphore::new(1));
    let mut house_done = false;
    let mut tick = tokio::time::interval(SCAN);
    loop {
        tick.tick().await;
        // Workers connected here (another replica measures its own).
        let workers = fleet.local();
        if !house_done && !fleet.list().is_empty() {
            house_done = true;
            let _turn = one_at_a_time.acquire().await;
            calibrate_house(&models, &dispatch).await;
        }
        let now = crate::store::now();
        for w in workers {
            let due = match (&w.state[..], &w.profile) {
                ("calibrating", _) => true,
                ("active", Some(p)) => {
                    let age = now - p.measured_at;
                    age >= RECALIBRATE.as_secs() as i64
                        || (age >= DRIFT_RECHECK.as_secs() as i64 && dispatch.drifted(&w.id))
                }
                _ => false,
            };
            if !due
                || !busy
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(w.id.clone())
            {
                continue;
            }
            let (fleet, models, dispatch, busy, failures, turns) = (
                fleet.clone(),
                models.clone(),
                dispatch.clone(),
                busy.clone(),
                failures.clone(),
                one_at_a_time.clone(),
            );
            tokio::spawn(async move {
                let _turn = turns.acquire().await;
                calibrate_worker(&fleet, &models, &dispatch, &w, &failures).await;
                busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&w.id);
            });
        }
    }
}

async fn calibrate_house(models: &ModelRegistry, dispatch: &Dispatch) {
    let house = models.list().iter().find_map(|m| match &m.kind {
        crate::services::models::ModelKind::Text(h) => Some(h.clone()),
        crate::services::models::ModelKind::Embedding(_) => None,
    });
    let Some(house) = house else { return };
    match challenge(On::House(&house), house.info().vocab_size, 0).await {
        Ok((p, _)) => {
            tracing::info!(?p, "house engine calibrated");
            dispatch.set_profile("house", p);
        }
        Err(e) => tracing::warn!(error = %e, "house calibration failed"),
    }
}

async fn calibrate_worker(
    fleet: &Registry,
    models: &ModelRegistry,
    dispatch: &Dispatch,
    w: &WorkerInfo,
    failures: &Mutex<HashMap<String, u32>>,
) {
    let Some((model, house)) = w
        .models
        .iter()
        .find_map(|m| models.text(&m.name).ok().map(|h| (m.name.clone(), h)))
    else {
        tracing::warn!(worker = %w.id, "serves no model this server knows: left uncalibrated");
        return;
    };
    let seed =
        w.id.bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    match challenge(
        On::Worker(fleet, &w.id, &model),
        house.info().vocab_size,
        seed,
    )
    .await
    {
        Ok((p, answers)) => {
            let who = crate::services::spotcheck::Who {
                worker: &w.id,
                provider: &w.provider_id,
            };
            if let Some(why) = canaries(dispatch, &house, &answers, who).await {
                dispatch
                    .quarantine(&w.id, &w.provider_id, &format!("canary: {why}"))
                    .await;
                return;
            }
            failures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&w.id);
            tracing::info!(worker = %w.id, ?p, "worker calibrated");
            fleet.set_profile(&w.id, p);
            dispatch.set_profile(&w.id, p);
        }
        Err(e) => {
            // A worker that fails the challenge pays for it like a lost job;
            // one that cannot run it time after time does not serve the
            // model it registered.
            fleet.standing.attempt(&w.provider_id, true);
            tracing::warn!(worker = %w.id, error = %e, "calibration failed; retrying");
            let n = {
                let mut f = failures.lock().unwrap_or_else(|e| e.into_inner());
                let n = f.entry(w.id.clone()).or_insert(0);
                *n += 1;
                *n
            };
            if n >= MAX_FAILED_CALIBRATIONS {
                let why = format!("{n} failed calibrations, the last: {e}");
                dispatch.quarantine(&w.id, &w.provider_id, &why).await;
            }
        }
    }
}

/// Failed calibrations in a row after which a worker is quarantined.
const MAX_FAILED_CALIBRATIONS: u32 = 3;

/// Checks the greedy answers of a worker's challenge against the house
/// engine's reference, as spot checks do: why the first one fails.
async fn canaries(
    dispatch: &Dispatch,
    house: &EngineHandle,
    answers: &[Sample],
    who: crate::services::spotcheck::Who<'_>,
) -> Option<String> {
    for a in answers {
        if let Some(Verdict::Fail(why)) = dispatch.spot.check(house, a, who).await {
            return Some(why);
        }
    }
    None
}

/// Runs the whole challenge on `on` and derives the profile; the
/// greedy answers of its decode challenges are the canaries' (checked
/// against the house engine's reference).
async fn challenge(on: On<'_>, vocab: usize, seed: u64) -> Result<(Profile, Vec<Sample>), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tokens = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| rng.random_range(3..vocab.max(4) as u32))
            .collect()
    };
    let long = tokens(PREFILL);
    let mut prefill = f64::MAX;
    for _ in 0..2 {
        let t = timed(on, long.clone(), 1).await?;
        let first = t
            .times
            .first()
            .ok_or("no token from the prefill challenge")?;
        prefill = prefill.min(first.duration_since(t.start).as_secs_f64());
    }
    // A long prompt's tokens cost more (attention): timed once more.
    let t = timed(on, tokens(PREFILL_LONG), 1).await?;
    let first = t
        .times
        .first()
        .ok_or("no token from the long prefill challenge")?;
    let prefill_long = first.duration_since(t.start).as_secs_f64();
    let mut answers = Vec::new();
    let one = decode_gap(on, vec![tokens(8)], &mut answers).await?;
    let four = decode_gap(on, (0..4).map(|_| tokens(8)).collect(), &mut answers).await?;
    let profile = Profile {
        prefill_tokens_per_s: PREFILL as f64 / prefill.max(1e-6),
        prefill_ms_long: prefill_long * 1e3,
        decode_step_ms_1: one,
        decode_step_ms_4: four.max(one),
        measured_at: crate::store::now(),
    };
    Ok((profile, answers))
}

/// The decode step (ms) with these prompts at once: for each, the time
/// from sending it to its last token over the tokens it produced (its
/// short prompt's prefill counts about one step; a worker may send
/// several tokens in one message, so gaps between arrivals say nothing,
/// and the round trip is part of what a client waits for), and the
/// median over the prompts.
async fn decode_gap(
    on: On<'_>,
    prompts: Vec<Vec<u32>>,
    answers: &mut Vec<Sample>,
) -> Result<f64, String> {
    let runs =
        futures_util::future::join_all(prompts.iter().map(|p| timed(on, p.clone(), DECODE))).await;
    let mut steps = Vec::new();
    for (r, prompt) in runs.into_iter().zip(prompts) {
        let t = r?;
        if let Some(last) = t.times.last() {
            let span = last.duration_since(t.start).as_secs_f64() * 1e3;
            steps.push(span / t.times.len() as f64);
        }
        answers.push(Sample {
            context: prompt,
            tokens: t.tokens,
            plain_greedy: true,
        });
    }
    if steps.is_empty() {
        return Err("no decode steps".into());
    }
    steps.sort_by(f64::total_cmp);
    Ok(steps[steps.len() / 2])
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        logprobs: Some(0),
        ..SamplingParams::default()
    }
}

/// One challenge job: when it was sent, when each token arrived, and the
/// tokens with their reported log-probabilities.
struct Timed {
    start: Instant,
    times: Vec<Instant>,
    tokens: Vec<(u32, Option<f32>)>,
}

/// Runs one challenge job; returns when it was sent and when each token
/// arrived, on this server's clock.
async fn timed(on: On<'_>, prompt: Vec<u32>, max_tokens: usize) -> Result<Timed, String> {
    let start = Instant::now();
    let mut times = Vec::with_capacity(max_tokens);
    let mut tokens = Vec::with_capacity(max_tokens);
    match on {
        On::House(h) => {
            let req = GenerateRequest {
                prompt_tokens: prompt,
                params: greedy(max_tokens),
            };
            let mut raw = h.submit_raw(req, Vec::new()).map_err(|e| e.to_string())?;
            loop {
                match tokio::time::timeout(JOB_TIMEOUT, raw.next()).await {
                    Ok(Some(CoreEvent::Token { id, logprob })) => {
                        times.push(Instant::now());
                        tokens.push((id, logprob.map(|l| l.logprob)));
                    }
                    Ok(Some(CoreEvent::Finished { .. })) => {
                        return Ok(Timed {
                            start,
                            times,
                            tokens,
                        });
                    }
                    Ok(Some(CoreEvent::Accepted)) => {}
                    Ok(Some(CoreEvent::Failed(e))) => return Err(e.to_string()),
                    Ok(None) | Err(_) => return Err("the house engine did not finish".into()),
                }
            }
        }
        On::Worker(fleet, worker, model) => {
            let job = fleet.jobs.next_id();
            let (tx, mut rx) = mpsc::unbounded_channel();
            fleet.jobs.place(job, worker, 1, tx);
            let p = greedy(max_tokens);
            let assign = ToWorker::Assign {
                v: VERSION,
                job,
                attempt: 1,
                model: model.to_string(),
                prompt,
                resume: Vec::new(),
                kv: None,
                params: JobParams {
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: 0,
                    min_p: 0.0,
                    seed: job,
                    max_tokens: max_tokens as u32,
                    stop_token_ids: Vec::new(),
                    ignore_eos: p.ignore_eos,
                    repetition_penalty: 1.0,
                    frequency_penalty: 0.0,
                    presence_penalty: 0.0,
                    logit_bias: Vec::new(),
                    // The canary's check compares them with the house's.
                    logprobs: Some(0),
                },
            };
            let result = async {
                if !fleet.send(worker, assign).await {
                    return Err("the worker is gone".to_string());
                }
                loop {
                    match tokio::time::timeout(JOB_TIMEOUT, rx.recv()).await {
                        Ok(Some(JobEvent::Core(CoreEvent::Token { id, logprob }))) => {
                            times.push(Instant::now());
                            tokens.push((id, logprob.map(|l| l.logprob)));
                        }
                        Ok(Some(JobEvent::Core(CoreEvent::Finished { .. }))) => return Ok(()),
                        Ok(Some(JobEvent::Core(CoreEvent::Accepted))) => {}
                        Ok(Some(JobEvent::Core(CoreEvent::Failed(e)))) => return Err(e.to_string()),
                        Ok(Some(JobEvent::Lost(why))) => return Err(why),
                        Ok(Some(JobEvent::Embedded(_))) => {
                            return Err("vectors for a generation".into());
                        }
                        Ok(None) | Err(_) => return Err("the worker did not finish".into()),
                    }
                }
            }
            .await;
            fleet.jobs.end(job);
            result.map(|()| Timed {
                start,
                times,
                tokens,
            })
        }
    }
}
