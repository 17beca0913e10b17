//! Calibration: the server measures every executor itself, on the real
//! model, with a challenge it times on its own clock: a prompt of
//! `PREFILL` tokens (the time to the first token, best of two) and one of
//! `PREFILL_LONG` (a long prompt's tokens cost more), then prompts decoded
//! alone and four at once (the time to the last token over the tokens,
//! the median over sequences). A worker gets no work until it is
//! calibrated, and is measured again every `RECALIBRATE` (sooner,
//! `DRIFT_RECHECK`, when its observed steps drift past 2x of its
//! profile); what it reports about itself is shown to admins, never used.
//!
//! The challenge looks like traffic: ordinary assignments of fresh prose
//! (tokenized by the model's own tokenizer), with a random seed, a
//! sampling temperature, an answer length and log-probabilities as
//! ordinary requests have them (every attempt asks for those). Every
//! answer is a canary: the house engine scores its tokens as a spot check
//! would, so a worker that does not run the model it registered (or that
//! answers a prefill at once with any token) is quarantined before it
//! earns anything, as is one that fails `MAX_FAILED_CALIBRATIONS`
//! challenges in a row. A job has `Timeouts::job` in all (`accepted`
//! buys no time, 60 s by default), a whole calibration `Timeouts::whole`.
//! A worker that answered challenges right and then ran out of time is
//! honest but too slow for the model (a browser tab on a software GPU):
//! it is told so and rests `SLOW_REST` before it is measured again,
//! neither quarantined nor counted as failing. One that never answers is
//! not slow but stalled, and fails. One calibration runs at a time (they
//! would measure each other on shared cores), and the turn goes to the
//! provider whose workers waited longest, so one provider's many workers
//! cannot keep another's from being measured.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::core::CoreEvent;
use engine::{EngineHandle, GenerateRequest, SamplingParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;

use crate::fleet::assignments::JobEvent;
use crate::fleet::registry::{Profile, Registry, WorkerInfo};
use crate::services::dispatch::Dispatch;
use crate::services::spotcheck::{Sample, Verdict};
use engine::registry::ModelRegistry;
use protocol::{JobParams, ToWorker, VERSION};

/// Prompt tokens of the prefill challenges.
const PREFILL: usize = crate::fleet::registry::PREFILL_SHORT;
const PREFILL_LONG: usize = crate::fleet::registry::PREFILL_LONG;
/// Tokens of each decode challenge.
const DECODE: usize = 24;
/// How long a worker told it is too slow for its model waits before it
/// is measured again.
const SLOW_REST: Duration = Duration::from_secs(3600);
/// How often a calibrated worker is measured again.
const RECALIBRATE: Duration = Duration::from_secs(600);
/// How soon after a calibration a worker whose steps drifted from its
/// profile is measured again.
const DRIFT_RECHECK: Duration = Duration::from_secs(30);
/// How often the calibrator looks for workers to measure.
const SCAN: Duration = Duration::from_millis(200);

/// How long challenges may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// One challenge job, in all.
    pub job: Duration,
    /// A whole calibration.
    pub whole: Duration,
}

impl Timeouts {
    /// `job` for each challenge, 2.5 times as long for the whole.
    pub fn per_job(job: Duration) -> Self {
        Self {
            job,
            whole: job.mul_f64(2.5),
        }
    }
}

/// Why a challenge failed.
#[derive(Debug)]
enum Miss {
    /// Its time ran out (a job's or the whole calibration's).
    Late(String),
    /// Anything else: a wrong answer, a lost worker, a house error.
    Bad(String),
}

impl From<String> for Miss {
    fn from(why: String) -> Self {
        Self::Bad(why)
    }
}

impl From<&str> for Miss {
    fn from(why: &str) -> Self {
        Self::Bad(why.to_string())
    }
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Late(why) | Self::Bad(why) => f.write_str(why),
        }
    }
}

/// Where a challenge runs.
#[derive(Clone, Copy)]
enum On<'a> {
    House(&'a EngineHandle),
    Worker(&'a Registry, &'a str, &'a str),
}

impl On<'_> {
    /// Whether a timeout here is the executor's (the house's is not).
    fn late(&self, why: &str) -> Miss {
        match self {
            On::House(_) => Miss::Bad(why.to_string()),
            On::Worker(..) => Miss::Late(why.to_string()),
        }
    }
}

/// Measures every worker as it comes (and again every `RECALIBRATE`),
/// until the process ends; the house engine is measured once, when the
/// first worker arrives (a server without workers does no extra work).
pub async fn run(
    fleet: Arc<Registry>,
    models: Arc<ModelRegistry>,
    dispatch: Arc<Dispatch>,
    job_timeout: Duration,
) {
    let limits = Timeouts::per_job(job_timeout);
    let failures: Arc<Mutex<Notes>> = Arc::default();
    // One calibration at a time: challenges that overlap on shared cores
    // measure each other, not the executor.
    let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut turns = Turns::default();
    let mut house_done = false;
    let mut tick = tokio::time::interval(SCAN);
    loop {
        tick.tick().await;
        if !house_done && !fleet.list().is_empty() {
            house_done = true;
            calibrate_house(&models, &dispatch, limits).await;
        }
        if running.load(std::sync::atomic::Ordering::Acquire) {
            continue;
        }
        // Workers connected here (another replica measures its own).
        let now = money::store::now();
        // A worker serving no model this server knows is never due (it
        // would take every turn of its provider's); it is told why once.
        let (due, unserved): (Vec<WorkerInfo>, Vec<WorkerInfo>) = fleet
            .local()
            .into_iter()
            .filter(|w| is_due(w, now, &dispatch) && !lock(&failures).resting(&w.id, now))
            .partition(|w| w.models.iter().any(|m| models.text(&m.name).is_ok()));
        for w in unserved {
            if lock(&failures).unserved.insert(w.id.clone()) && !w.models.is_empty() {
                tell_unserved(&fleet, &models, &w).await;
            }
        }
        let Some(w) = turns.next(due) else { continue };
        running.store(true, std::sync::atomic::Ordering::Release);
        let (fleet, models, dispatch, failures, running) = (
            fleet.clone(),
            models.clone(),
            dispatch.clone(),
            failures.clone(),
            running.clone(),
        );
        tokio::spawn(async move {
            calibrate_worker(&fleet, &models, &dispatch, &w, &failures, limits).await;
            running.store(false, std::sync::atomic::Ordering::Release);
        });
    }
}

/// Whether worker `w` is to be measured now.
fn is_due(w: &WorkerInfo, now: i64, dispatch: &Dispatch) -> bool {
    match (&w.state[..], &w.profile) {
        ("calibrating", _) => true,
        ("active", Some(p)) => {
            let age = now - p.measured_at;
            age >= RECALIBRATE.as_secs() as i64
                || (age >= DRIFT_RECHECK.as_secs() as i64 && dispatch.drifted(&w.id))
        }
        _ => false,
    }
}

/// Whose turn it is: among the workers due, one of the provider whose
/// last turn is oldest (a provider never served first), so a provider
/// with many workers takes one turn in each round, not every turn.
#[derive(Debug, Default)]
struct Turns {
    last: HashMap<String, u64>,
    clock: u64,
}

impl Turns {
    fn next(&mut self, due: Vec<WorkerInfo>) -> Option<WorkerInfo> {
        let w = due
            .into_iter()
            .min_by_key(|w| (self.last.get(&w.provider_id).copied(), w.id.clone()))?;
        self.clock += 1;
        self.last.insert(w.provider_id.clone(), self.clock);
        Some(w)
    }
}

async fn calibrate_house(models: &ModelRegistry, dispatch: &Dispatch, limits: Timeouts) {
    let house = models.list().iter().find_map(|m| match &m.kind {
        engine::registry::ModelKind::Text(h) => Some(h.clone()),
        engine::registry::ModelKind::Embedding(_) => None,
    });
    let Some(house) = house else { return };
    match challenge(
        On::House(&house),
        house.tokenizer(),
        limits.job,
        &mut Vec::new(),
    )
    .await
    {
        Ok(p) => {
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
    failures: &Mutex<Notes>,
    limits: Timeouts,
) {
    let Some((model, house)) = w
        .models
        .iter()
        .find_map(|m| models.text(&m.name).ok().map(|h| (m.name.clone(), h)))
    else {
        // Unloaded since the scan: the next one tells the worker.
        return;
    };
    let mut answers = Vec::new();
    let on = On::Worker(fleet, &w.id, &model);
    let run = challenge(on, house.tokenizer(), limits.job, &mut answers);
    let outcome = tokio::time::timeout(limits.whole, run)
        .await
        .unwrap_or_else(|_| {
            let secs = limits.whole.as_secs_f64();
            Err(Miss::Late(format!("no whole answer in {secs:.0} s")))
        });
    // Every answer it gave is a canary, whatever became of the rest.
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
    match outcome {
        Ok(p) => {
            lock(failures).failed.remove(&w.id);
            tracing::info!(worker = %w.id, ?p, "worker calibrated");
            fleet.set_profile(&w.id, p);
            dispatch.set_profile(&w.id, p);
        }
        // Right answers, then out of time: honest, and too slow.
        Err(Miss::Late(why)) if !answers.is_empty() => {
            too_slow(fleet, failures, w, &model, &why, answers.len()).await;
        }
        Err(e) => {
            // A worker that fails the challenge pays for it like a lost job;
            // one that cannot run it time after time does not serve the
            // model it registered.
            fleet.standing.attempt(&w.provider_id, true);
            tracing::warn!(worker = %w.id, error = %e, "calibration failed; retrying");
            let n = {
                let mut f = lock(failures);
                let n = f.failed.entry(w.id.clone()).or_insert(0);
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

/// Tells worker `w`, whose `answered` challenge answers were right but
/// which ran out of time (`why`), that it is too slow for `model`: it
/// gets no work for it, and rests `SLOW_REST` before it is measured
/// again (so a slow worker cannot hold the one calibration slot).
async fn too_slow(
    fleet: &Registry,
    failures: &Mutex<Notes>,
    w: &WorkerInfo,
    model: &str,
    why: &str,
    answered: usize,
) {
    let until = money::store::now() + SLOW_REST.as_secs() as i64;
    {
        let mut f = lock(failures);
        f.failed.remove(&w.id);
        f.slow.insert(w.id.clone(), until);
    }
    let message = format!(
        "this worker is too slow to serve {model} here: its {answered} answers were right, \
         then {why}. It gets no work for {model}; serve a smaller model or run it on a faster \
         device. It is measured again in {} minutes.",
        SLOW_REST.as_secs() / 60
    );
    tracing::warn!(worker = %w.id, %message, "worker too slow for its model");
    let msg = ToWorker::Error {
        v: VERSION,
        code: "too_slow".into(),
        message,
    };
    let _ = fleet.send(&w.id, msg).await;
}

/// What calibration remembers of workers between rounds.
#[derive(Debug, Default)]
struct Notes {
    /// Failed calibrations in a row, by worker.
    failed: HashMap<String, u32>,
    /// Workers told that this server serves none of their models.
    unserved: std::collections::HashSet<String>,
    /// Workers told they are too slow, and until when they rest (unix
    /// seconds).
    slow: HashMap<String, i64>,
}

impl Notes {
    /// Whether worker `id` rests now (told it is too slow).
    fn resting(&mut self, id: &str, now: i64) -> bool {
        self.slow.retain(|_, until| *until > now);
        self.slow.contains_key(id)
    }
}

fn lock(notes: &Mutex<Notes>) -> std::sync::MutexGuard<'_, Notes> {
    notes.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tells a worker (once) that this server serves none of its models, so
/// it gets no work: its provider reads why in the worker's terminal.
async fn tell_unserved(fleet: &Registry, models: &ModelRegistry, w: &WorkerInfo) {
    let theirs: Vec<&str> = w.models.iter().map(|m| m.name.as_str()).collect();
    let served: Vec<String> = models
        .list()
        .into_iter()
        .filter(|m| matches!(m.kind, engine::registry::ModelKind::Text(_)))
        .map(|m| m.name)
        .collect();
    let message = format!(
        "this server does not serve {} (it serves: {}); this worker gets no work until it \
         serves one of those (`synor worker --model ...`, named as the server names it)",
        theirs.join(", "),
        served.join(", ")
    );
    tracing::warn!(worker = %w.id, %message, "worker serves no model of this server");
    let msg = protocol::ToWorker::Error {
        v: protocol::VERSION,
        code: "model_not_served".into(),
        message,
    };
    let _ = fleet.send(&w.id, msg).await;
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
        if let Some(Verdict::Fail(why)) = dispatch.spot.checker().check(house, a, who).await {
            return Some(why);
        }
    }
    None
}

/// Runs the whole challenge on `on` and derives the profile; every
/// answer is a canary (checked against the house engine's reference).
async fn challenge(
    on: On<'_>,
    tok: &engine::TextTokenizer,
    limit: Duration,
    answers: &mut Vec<Sample>,
) -> Result<Profile, Miss> {
    let mut rng = StdRng::from_os_rng();
    let short = prose(&mut rng, tok, PREFILL)?;
    let mut prefill = f64::MAX;
    for _ in 0..2 {
        let t = timed(on, short.clone(), Draw::new(&mut rng), PREFILL_WANT, limit).await?;
        prefill = prefill.min(t.first_token()?);
        answers.push(t.sample(short.clone()));
    }
    // A long prompt's tokens cost more (attention): timed once more.
    let long = prose(&mut rng, tok, PREFILL_LONG)?;
    let t = timed(on, long.clone(), Draw::new(&mut rng), PREFILL_WANT, limit).await?;
    let prefill_long = t.first_token()?;
    answers.push(t.sample(long));
    let one = vec![prose(&mut rng, tok, DECODE_PROMPT)?];
    let one = decode_gap(on, one, &mut rng, answers, limit).await?;
    let four = (0..4)
        .map(|_| prose(&mut rng, tok, DECODE_PROMPT))
        .collect::<Result<Vec<_>, _>>()?;
    let four = decode_gap(on, four, &mut rng, answers, limit).await?;
    let profile = Profile {
        prefill_tokens_per_s: PREFILL as f64 / prefill.max(1e-6),
        prefill_ms_long: prefill_long * 1e3,
        decode_step_ms_1: one,
        decode_step_ms_4: four.max(one),
        measured_at: money::store::now(),
    };
    Ok(profile)
}

/// Prompt tokens of the decode challenges.
const DECODE_PROMPT: usize = 24;
/// Tokens a prefill challenge takes before it is cancelled (its first
/// times the prefill; one more, as a stop string often comes early).
const PREFILL_WANT: usize = 2;

/// Words the challenges' prose is drawn from.
const WORDS: &[&str] = &[
    "the",
    "a",
    "river",
    "city",
    "old",
    "new",
    "light",
    "morning",
    "people",
    "work",
    "house",
    "market",
    "water",
    "road",
    "small",
    "great",
    "long",
    "time",
    "year",
    "day",
    "night",
    "story",
    "garden",
    "school",
    "music",
    "book",
    "letter",
    "question",
    "answer",
    "reason",
    "history",
    "mountain",
    "village",
    "train",
    "window",
    "friend",
    "family",
    "language",
    "number",
    "price",
    "energy",
    "machine",
    "program",
    "computer",
    "simple",
    "quickly",
    "slowly",
    "often",
    "never",
    "always",
    "because",
    "although",
    "while",
    "after",
    "before",
    "between",
    "under",
    "over",
    "through",
    "with",
    "without",
    "and",
    "but",
    "or",
    "so",
    "then",
    "was",
    "is",
    "were",
    "will",
    "can",
    "could",
    "should",
    "made",
    "found",
    "took",
    "gave",
    "wrote",
    "explained",
    "described",
    "asked",
    "remembered",
    "built",
    "opened",
    "closed",
    "carried",
    "followed",
    "learned",
    "told",
    "red",
    "green",
    "blue",
    "quiet",
    "busy",
    "early",
    "late",
    "northern",
    "southern",
    "ancient",
    "modern",
    "careful",
    "happy",
    "tired",
    "clear",
    "bright",
    "dark",
    "warm",
    "cold",
    "open",
];

/// Fresh prose of exactly `n` tokens (as the model's tokenizer encodes a
/// prompt): sentences of common words, different every time.
fn prose(rng: &mut StdRng, tok: &engine::TextTokenizer, n: usize) -> Result<Vec<u32>, String> {
    let mut text = String::new();
    loop {
        let words = rng.random_range(6..16);
        for i in 0..words {
            let w = WORDS[rng.random_range(0..WORDS.len())];
            if i == 0 {
                let mut c = w.chars();
                text.extend(c.next().map(|f| f.to_ascii_uppercase()));
                text.push_str(c.as_str());
            } else {
                text.push(' ');
                text.push_str(w);
            }
        }
        text.push_str(if rng.random_bool(0.2) { "? " } else { ". " });
        let ids = tok.encode_prompt(&text).map_err(|e| e.to_string())?;
        if ids.len() >= n {
            return Ok(ids[..n].to_vec());
        }
    }
}

/// A challenge job's sampling, drawn as ordinary requests' are: a random
/// seed, a temperature, nucleus sampling, an answer length.
#[derive(Debug, Clone, Copy)]
struct Draw {
    seed: u64,
    temperature: f32,
    top_p: f32,
    max_tokens: usize,
}

impl Draw {
    fn new(rng: &mut StdRng) -> Self {
        Self {
            // Below 2^53: exact in any JSON reader, as request seeds are.
            seed: rng.random_range(0..1u64 << 53),
            temperature: [0.0, 0.6, 0.7, 0.8, 1.0][rng.random_range(0..5)],
            top_p: [1.0, 0.9, 0.95][rng.random_range(0..3)],
            max_tokens: rng.random_range(DECODE..=2 * DECODE),
        }
    }

    fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            seed: Some(self.seed),
            max_tokens: self.max_tokens,
            logprobs: Some(0),
            ..SamplingParams::default()
        }
    }

    fn job(&self) -> JobParams {
        // Like a key's request: a tenant of its own.
        JobParams::of(&self.sampling(), rand::random::<u64>() | 1)
    }
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
    rng: &mut StdRng,
    answers: &mut Vec<Sample>,
    limit: Duration,
) -> Result<f64, Miss> {
    let draws: Vec<Draw> = prompts.iter().map(|_| Draw::new(rng)).collect();
    let runs = futures_util::future::join_all(
        prompts
            .iter()
            .zip(&draws)
            .map(|(p, d)| timed(on, p.clone(), *d, DECODE, limit)),
    )
    .await;
    let mut steps = Vec::new();
    for (r, prompt) in runs.into_iter().zip(prompts) {
        let t = r?;
        if let Some(last) = t.times.last() {
            let span = last.duration_since(t.start).as_secs_f64() * 1e3;
            steps.push(span / t.times.len() as f64);
        }
        answers.push(t.sample(prompt));
    }
    if steps.is_empty() {
        return Err(Miss::Bad("no decode steps".into()));
    }
    steps.sort_by(f64::total_cmp);
    Ok(steps[steps.len() / 2])
}

/// One challenge job: when it was sent, when each token arrived, and the
/// tokens with their reported log-probabilities.
struct Timed {
    start: Instant,
    times: Vec<Instant>,
    tokens: Vec<(u32, Option<f32>)>,
    /// Greedy with no penalty (its tokens must be the reference's top).
    greedy: bool,
}

impl Timed {
    /// Seconds to the first token (the prefill and one round trip).
    fn first_token(&self) -> Result<f64, String> {
        let first = self.times.first().ok_or("no token from a challenge")?;
        Ok(first.duration_since(self.start).as_secs_f64())
    }

    /// The answer as a canary after `prompt`.
    fn sample(&self, prompt: Vec<u32>) -> Sample {
        Sample {
            context: prompt,
            tokens: self.tokens.clone(),
            plain_greedy: self.greedy,
        }
    }
}

/// Runs one challenge job until it ends or `want` tokens came (then it is
/// cancelled, as a client that saw its stop string would); returns when
/// it was sent and when each token arrived, on this server's clock.
async fn timed(
    on: On<'_>,
    prompt: Vec<u32>,
    draw: Draw,
    want: usize,
    limit: Duration,
) -> Result<Timed, Miss> {
    let mut t = Timed {
        start: Instant::now(),
        times: Vec::with_capacity(draw.max_tokens),
        tokens: Vec::with_capacity(draw.max_tokens),
        greedy: draw.temperature == 0.0,
    };
    let deadline = tokio::time::Instant::now() + limit;
    match on {
        On::House(h) => {
            let req = GenerateRequest {
                prompt_tokens: prompt,
                params: draw.sampling(),
            };
            let raw = h.validate(req).and_then(|r| h.submit_raw(r, Vec::new()));
            let mut raw = raw.map_err(|e| e.to_string())?;
            loop {
                let ev = tokio::time::timeout_at(deadline, raw.next()).await;
                let ev = ev
                    .ok()
                    .flatten()
                    .ok_or_else(|| on.late("the house engine did not finish"))?;
                let finished = matches!(ev, CoreEvent::Finished { .. });
                if t.took(ev, want)? {
                    if !finished {
                        raw.abort();
                    }
                    return Ok(t);
                }
            }
        }
        On::Worker(fleet, worker, model) => {
            let job = fleet.jobs.next_id();
            let (tx, mut rx) = mpsc::unbounded_channel();
            fleet.jobs.place(job, worker, 1, tx);
            let assign = ToWorker::Assign {
                v: VERSION,
                job,
                attempt: 1,
                model: model.to_string(),
                prompt,
                resume: Vec::new(),
                kv: None,
                params: draw.job(),
            };
            let run = WorkerJob {
                fleet,
                worker,
                job,
                deadline,
            };
            let result = run.run(assign, &mut rx, want, &mut t).await;
            fleet.jobs.end(job);
            result.map(|()| t)
        }
    }
}

/// A calibration job on a worker.
struct WorkerJob<'a> {
    fleet: &'a Registry,
    worker: &'a str,
    job: u64,
    deadline: tokio::time::Instant,
}

impl WorkerJob<'_> {
    /// Runs `assign` into `t` until `want` tokens or its end (a job cut
    /// short is cancelled).
    async fn run(
        &self,
        assign: ToWorker,
        rx: &mut mpsc::UnboundedReceiver<JobEvent>,
        want: usize,
        t: &mut Timed,
    ) -> Result<(), Miss> {
        if !self.fleet.send(self.worker, assign).await {
            return Err("the worker is gone".into());
        }
        loop {
            let ev = match tokio::time::timeout_at(self.deadline, rx.recv()).await {
                Ok(Some(JobEvent::Core(ev))) => ev,
                Ok(Some(JobEvent::Lost(why))) => return Err(Miss::Bad(why)),
                Ok(Some(JobEvent::Embedded(_))) => return Err("vectors for a generation".into()),
                Ok(None) => return Err("the worker is gone".into()),
                Err(_) => return Err(Miss::Late("a challenge took too long".into())),
            };
            let finished = matches!(ev, CoreEvent::Finished { .. });
            if t.took(ev, want)? {
                if !finished {
                    let cancel = ToWorker::Cancel {
                        v: VERSION,
                        job: self.job,
                    };
                    self.fleet.send(self.worker, cancel).await;
                }
                return Ok(());
            }
        }
    }
}

impl Timed {
    /// Takes one event of the job; whether the job is done (finished,
    /// or `want` tokens in).
    fn took(&mut self, ev: CoreEvent, want: usize) -> Result<bool, String> {
        match ev {
            CoreEvent::Token { id, logprob } => {
                self.times.push(Instant::now());
                self.tokens.push((id, logprob.map(|l| l.logprob)));
                Ok(self.tokens.len() >= want)
            }
            CoreEvent::Finished { .. } => Ok(true),
            CoreEvent::Accepted => Ok(false),
            CoreEvent::Failed(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::registry::Registration;

    /// Workers `names` of `provider`, as the registry lists them.
    fn workers(fleet: &Registry, provider: &str, names: &[&str]) -> Vec<WorkerInfo> {
        for n in names {
            let mut r = Registration::for_test(n, vec![]);
            r.provider_id = format!("provider:{provider}");
            let (tx, rx) = mpsc::channel(1);
            std::mem::forget(rx);
            fleet.register(r, tx);
        }
        fleet
            .list()
            .into_iter()
            .filter(|w| w.provider_id == format!("provider:{provider}"))
            .collect()
    }

    #[test]
    fn a_provider_with_many_workers_takes_one_turn_a_round() {
        let fleet = Registry::default();
        let many = workers(&fleet, "many", &["m1", "m2", "m3", "m4", "m5", "m6"]);
        let one = workers(&fleet, "one", &["o1"]);
        let other = workers(&fleet, "other", &["x1", "x2"]);
        let mut turns = Turns::default();
        let mut due: Vec<WorkerInfo> = [many, one, other].concat();
        let mut order = Vec::new();
        while let Some(w) = turns.next(due.clone()) {
            due.retain(|d| d.id != w.id);
            order.push(w.provider_id);
        }
        // Every provider is served in the first round, whoever has more
        // workers waiting.
        let first: std::collections::BTreeSet<&str> =
            order[..3].iter().map(String::as_str).collect();
        assert_eq!(first.len(), 3, "{order:?}");
        assert_eq!(order.len(), 9);
        assert!(
            order[3..]
                .iter()
                .filter(|p| p.as_str() == "provider:one")
                .count()
                == 0,
            "{order:?}"
        );
        assert!(Turns::default().next(Vec::new()).is_none());
    }

    #[test]
    fn challenge_draws_look_like_traffic() {
        let mut rng = StdRng::seed_from_u64(1);
        let draws: Vec<Draw> = (0..200).map(|_| Draw::new(&mut rng)).collect();
        let seeds: std::collections::HashSet<u64> = draws.iter().map(|d| d.seed).collect();
        assert_eq!(seeds.len(), 200, "fresh seeds");
        assert!(draws.iter().all(|d| d.seed < 1 << 53));
        assert!(
            draws.iter().any(|d| d.temperature > 0.0) && draws.iter().any(|d| d.temperature == 0.0)
        );
        for d in &draws {
            let j = d.job();
            assert!(!j.ignore_eos && j.logprobs == Some(0) && j.max_tokens as usize >= DECODE);
        }
    }
}
