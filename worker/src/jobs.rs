//! The jobs a worker runs for its server: each assignment becomes one raw
//! engine submission (token ids, no text work: the server detokenizes and
//! matches stop strings), continued after the tokens an earlier attempt
//! delivered, and its events go back as protocol messages, in order,
//! through the connection's bounded queue. Cancelled jobs and jobs left
//! behind by a lost connection are aborted in the engine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use engine::core::CoreEvent;
use engine::{EngineHandle, FinishReason, GenerateRequest, RequestId};
use tokio::sync::mpsc;

use engine::core::Handoff;
use engine::kv_cache::transfer::KvRows;

use super::Out;
use engine::registry::ModelRegistry;
use protocol::engine_side::{job_message, served_model};
use protocol::kv_stream::KvAssembly;
use protocol::{FromWorker, JobParams, JobToken, VERSION};

/// One assignment, as received.
#[derive(Debug, Clone)]
pub struct Assignment {
    pub job: u64,
    pub attempt: u32,
    pub model: String,
    pub prompt: Vec<u32>,
    pub resume: Vec<u32>,
    pub params: JobParams,
}

/// The jobs running now.
#[derive(Default)]
pub struct Running {
    jobs: Mutex<HashMap<u64, (EngineHandle, RequestId)>>,
    /// Assignments taken so far.
    started: std::sync::atomic::AtomicU64,
    /// Split jobs waiting for their KV: transfer -> what arrives for it,
    /// and job -> transfer (for cancels).
    incoming: Mutex<HashMap<u64, mpsc::UnboundedSender<Arrival>>>,
    waiting: Mutex<HashMap<u64, u64>>,
    /// Testing (`--debug-cheat replay`): the tokens of the first job run
    /// with log-probabilities, sent again for every later job.
    replay: Option<Mutex<Option<Vec<JobToken>>>>,
    /// With `replay`: assignments run honestly before it starts.
    honest_first: u64,
}

/// How an assignment runs: after which tokens, with what KV, and whether
/// its tokens are recorded for replay (`--debug-cheat replay`).
struct Run {
    resume: Vec<u32>,
    handoff: Handoff,
    record: bool,
}

/// What reaches a split job waiting for its KV.
#[derive(Debug)]
pub enum Arrival {
    Frame(Vec<u8>),
    End {
        tokens: u32,
        digest: String,
        first: JobToken,
    },
    Abort(String),
    Cancel,
}

/// How long a decode worker waits for the end of a transfer before it
/// gives the job up (the server ends a transfer long before).
const KV_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("jobs", &self.len())
            .finish()
    }
}

fn encode(msg: &FromWorker) -> Out {
    Out::Text(serde_json::to_string(msg).unwrap_or_default())
}

impl Running {
    /// Jobs that replay the first job's tokens instead of running (a
    /// cheating provider, for tests).
    pub fn replaying(honest_first: u64) -> Self {
        Self {
            replay: Some(Mutex::default()),
            honest_first,
            ..Default::default()
        }
    }

    /// With `--debug-cheat replay` and a job recorded: answers `a` with
    /// the recorded tokens; false when it must run for real.
    fn replayed(&self, a: &Assignment, out: &mpsc::Sender<Out>) -> bool {
        let Some(canned) = self.replay.as_ref().and_then(|r| lock(r).clone()) else {
            return false;
        };
        let (job, attempt) = (a.job, a.attempt);
        let room = (a.params.max_tokens as usize)
            .saturating_sub(a.resume.len())
            .max(1);
        let tokens: Vec<JobToken> = canned.into_iter().take(room).collect();
        let n = tokens.len() as u32;
        let msgs = [
            FromWorker::Accepted {
                v: VERSION,
                job,
                attempt,
            },
            FromWorker::Tokens {
                v: VERSION,
                job,
                attempt,
                tokens,
            },
            FromWorker::Done {
                v: VERSION,
                job,
                attempt,
                reason: "length".into(),
                prompt_tokens: a.prompt.len() as u32,
                cached_tokens: 0,
                completion_tokens: n,
            },
        ];
        let out = out.clone();
        tokio::spawn(async move {
            for m in msgs {
                let _ = out.send(encode(&m)).await;
            }
        });
        true
    }

    /// Starts `a` on this worker's engine for its model; a refusal goes
    /// back as `failed` (the server places it elsewhere).
    /// `delay` holds each token back (`--debug-token-delay-ms`).
    pub fn start(
        self: &Arc<Self>,
        models: &ModelRegistry,
        a: Assignment,
        out: &mpsc::Sender<Out>,
        delay: std::time::Duration,
        stall_after: Option<u64>,
    ) {
        let n = self
            .started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if stall_after.is_some_and(|s| n >= s) {
            return; // `--debug-stall-after`: a hung device never answers
        }
        let engine = match models.text(&a.model) {
            Ok(e) => e,
            Err(e) => {
                send_later(out, failed(a.job, a.attempt, e.to_string()));
                return;
            }
        };
        // `--debug-cheat replay`: honest for a while, then the first job
        // is recorded and sent again for every later one.
        let record = self.replay.is_some() && n >= self.honest_first;
        if record && self.replayed(&a, out) {
            return;
        }
        let resume = a.resume.clone();
        let run = Run {
            resume,
            handoff: Handoff::default(),
            record,
        };
        self.submit(engine, a, run, out, delay);
    }

    /// Submits `a` (continued after `run.resume`) and forwards its events.
    fn submit(
        self: &Arc<Self>,
        engine: EngineHandle,
        a: Assignment,
        run: Run,
        out: &mpsc::Sender<Out>,
        delay: std::time::Duration,
    ) {
        let Run {
            resume,
            handoff,
            record,
        } = run;
        let (job, attempt) = (a.job, a.attempt);
        let req = GenerateRequest {
            prompt_tokens: a.prompt,
            params: a.params.sampling(),
        };
        // What the server sent is checked once, here, where it arrives.
        let raw = engine
            .validate(req)
            .and_then(|r| engine.submit_handoff(r, resume, handoff));
        let mut raw = match raw {
            Ok(r) => r,
            Err(e) => {
                send_later(out, failed(job, attempt, e.to_string()));
                return;
            }
        };
        self.lock().insert(job, (engine, raw.id()));
        let (me, out) = (self.clone(), out.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(ev) = raw.next().await {
                if matches!(ev, CoreEvent::Token { .. }) && !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let msg = job_message(job, attempt, ev);
                if let (true, FromWorker::Tokens { tokens, .. }) = (record, &msg) {
                    seen.extend(tokens.iter().filter(|t| t.logprob.is_some()).cloned());
                }
                if out.send(encode(&msg)).await.is_err() {
                    break; // the connection is gone: dropping `raw` aborts
                }
            }
            if let Some(r) = me.replay.as_ref().filter(|_| record)
                && !seen.is_empty()
            {
                lock(r).get_or_insert(seen);
            }
            me.lock().remove(&job);
        });
    }

    /// Starts the decode side of a split: asks for the KV its prefix
    /// cache lacks, gathers and verifies it, then generates after the
    /// prefill side's first token; on any doubt it recomputes the prompt.
    pub fn start_split(
        self: &Arc<Self>,
        models: &ModelRegistry,
        a: Assignment,
        transfer: u64,
        out: &mpsc::Sender<Out>,
        delay: std::time::Duration,
    ) {
        let engine = match models.text(&a.model) {
            Ok(e) => e,
            Err(e) => {
                send_later(out, failed(a.job, a.attempt, e.to_string()));
                return;
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.incoming).insert(transfer, tx);
        lock(&self.waiting).insert(a.job, transfer);
        let split = Split {
            engine,
            a,
            transfer,
            rx,
            out: out.clone(),
            delay,
        };
        tokio::spawn(self.clone().split_job(split));
    }

    /// The decode side of a split: says which positions it lacks,
    /// receives the KV, tells the server whether it imports it (the
    /// engine's verdict), then runs the assignment after the first token.
    async fn split_job(self: Arc<Self>, s: Split) {
        let Split {
            engine,
            a,
            transfer,
            mut rx,
            out,
            delay,
        } = s;
        let (job, attempt) = (a.job, a.attempt);
        let from = engine.cached_prefix(a.prompt.clone()).await.unwrap_or(0);
        let want = FromWorker::KvWant {
            v: VERSION,
            job,
            attempt,
            transfer,
            from: from as u32,
        };
        let _ = out.send(encode(&want)).await;
        // Frames past the prompt are refused as past the "context": what a
        // transfer can make this worker hold is bounded.
        let mut geometry = served_model(&a.model, engine.info());
        geometry.context_length = u32::try_from(a.prompt.len()).unwrap_or(u32::MAX);
        let kv = KvAssembly::new(transfer, geometry, from);
        let decided = receive(kv, &mut rx, a.prompt.len()).await;
        lock(&self.incoming).remove(&transfer);
        lock(&self.waiting).remove(&job);
        let Some((rows, first)) = decided else {
            let end = CoreEvent::Finished {
                reason: FinishReason::Abort,
                usage: engine::Usage::default(),
            };
            let _ = out.send(encode(&job_message(job, attempt, end))).await;
            return;
        };
        let mut resume = a.resume.clone();
        resume.extend(first.map(|t| t.id));
        let handoff = Handoff {
            verdict: verdict_to_server(&out, (job, attempt, transfer), &rows).await,
            import: rows.ok(),
            ..Default::default()
        };
        let run = Run {
            resume,
            handoff,
            record: false,
        };
        self.submit(engine, a, run, &out, delay);
    }

    /// Starts the prefill side of a split (see `kv::prefill`).
    pub fn start_prefill(
        self: &Arc<Self>,
        models: &ModelRegistry,
        job: super::kv::Prefill,
        out: &mpsc::Sender<Out>,
        faults: super::kv::Faults,
    ) {
        let transfer = job.transfer;
        let engine = match models.text(&job.model) {
            Ok(e) => e,
            Err(e) => {
                let msg = FromWorker::KvFailed {
                    v: VERSION,
                    transfer,
                    message: e.to_string(),
                };
                send_later(out, encode(&msg));
                return;
            }
        };
        let (me, out) = (self.clone(), out.clone());
        tokio::spawn(async move {
            let track = |id| {
                me.lock().insert(transfer, (engine.clone(), id));
            };
            let end = super::kv::prefill(&engine, job, &out, faults, &track).await;
            me.lock().remove(&transfer);
            if let Some(end) = end {
                let _ = out.send(encode(&end)).await;
            }
        });
    }

    /// Hands what arrived for `transfer` to its job; false when no job
    /// waits for it.
    pub fn arrive(&self, transfer: u64, a: Arrival) -> bool {
        lock(&self.incoming)
            .get(&transfer)
            .is_some_and(|tx| tx.send(a).is_ok())
    }

    /// Stops `job` (its `done` with `abort` follows).
    pub fn cancel(&self, job: u64) {
        if let Some((engine, id)) = self.lock().get(&job) {
            engine.abort(*id);
        }
        let transfer = lock(&self.waiting).get(&job).copied();
        if let Some(t) = transfer {
            self.arrive(t, Arrival::Cancel);
        }
    }

    /// Stops every job (the connection was lost; the server replays them).
    pub fn abort_all(&self) {
        for (engine, id) in self.lock().values() {
            engine.abort(*id);
        }
        for tx in lock(&self.incoming).values() {
            let _ = tx.send(Arrival::Cancel);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len() + lock(&self.waiting).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (EngineHandle, RequestId)>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs an `embed` job on this worker's encoder `model` and answers
/// `embedded` (or `failed`), from a task of its own.
pub fn embed(
    models: &ModelRegistry,
    job: u64,
    model: &str,
    texts: Vec<String>,
    tokens: Vec<Vec<u32>>,
    query: bool,
    out: &mpsc::Sender<Out>,
) {
    let encoder = models.embedding(model);
    let out = out.clone();
    tokio::spawn(async move {
        let result = match encoder {
            Err(e) => Err(e.to_string()),
            Ok(e) => {
                let input = if tokens.is_empty() {
                    engine::EmbedInput::Texts(texts)
                } else {
                    engine::EmbedInput::Tokens(tokens)
                };
                match (query, input) {
                    (true, engine::EmbedInput::Texts(t)) if t.len() == 1 => {
                        e.embed_query(&t[0]).await.map(|v| engine::Embeddings {
                            vectors: vec![v],
                            prompt_tokens: 0,
                        })
                    }
                    (_, input) => match e.validate(&input) {
                        Ok(()) => e.embed_input(input).await,
                        Err(err) => Err(err),
                    },
                }
                .map_err(|e| e.to_string())
            }
        };
        let msg = match result {
            Ok(done) => FromWorker::Embedded {
                v: VERSION,
                job,
                vectors: done.vectors,
                prompt_tokens: done.prompt_tokens as u32,
            },
            Err(message) => FromWorker::Failed {
                v: VERSION,
                job,
                attempt: 1,
                message,
            },
        };
        let _ = out.send(encode(&msg)).await;
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A split assignment waiting for its KV.
struct Split {
    engine: EngineHandle,
    a: Assignment,
    transfer: u64,
    rx: mpsc::UnboundedReceiver<Arrival>,
    out: mpsc::Sender<Out>,
    delay: std::time::Duration,
}

/// The rows a transfer delivered (or why not) and its first token;
/// `None` when the job was cancelled meanwhile.
type Received = Option<(Result<KvRows, String>, Option<JobToken>)>;

/// Receives a transfer's frames until its end, abort or `KV_PATIENCE`.
async fn receive(
    mut kv: KvAssembly,
    rx: &mut mpsc::UnboundedReceiver<Arrival>,
    prompt: usize,
) -> Received {
    let deadline = tokio::time::Instant::now() + KV_PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Arrival::Frame(f))) => kv.push(&f),
            Ok(Some(Arrival::End {
                tokens,
                digest,
                first,
            })) => {
                let rows = kv.finish(tokens, &digest, prompt).map(|s| KvRows {
                    first: s.first,
                    count: s.count,
                    layers: s.layers,
                });
                return Some((rows, Some(first)));
            }
            Ok(Some(Arrival::Abort(why))) => return Some((Err(why), None)),
            Ok(Some(Arrival::Cancel)) => return None,
            Ok(None) | Err(_) => return Some((Err("no end of the transfer".into()), None)),
        }
    }
}

/// Tells the server whether the transfer's rows are used: refused rows
/// at once; rows that passed the transfer's checks when the engine has
/// judged them (it recomputes a few positions before it uses them),
/// through the sender this returns.
async fn verdict_to_server<T>(
    out: &mpsc::Sender<Out>,
    (job, attempt, transfer): (u64, u32, u64),
    rows: &Result<T, String>,
) -> Option<tokio::sync::oneshot::Sender<Result<(), String>>> {
    let result = move |verdict: Result<(), String>| FromWorker::KvResult {
        v: VERSION,
        job,
        attempt,
        transfer,
        imported: verdict.is_ok(),
        reason: verdict.err().unwrap_or_default(),
    };
    match rows {
        Ok(_) => {
            let (verdict, told) = tokio::sync::oneshot::channel();
            let out = out.clone();
            tokio::spawn(async move {
                if let Ok(v) = told.await {
                    let _ = out.send(encode(&result(v))).await;
                }
            });
            Some(verdict)
        }
        Err(why) => {
            tracing::warn!(transfer, reason = %why, "KV transfer refused: recomputing the prompt");
            let _ = out.send(encode(&result(Err(why.clone())))).await;
            None
        }
    }
}

fn failed(job: u64, attempt: u32, message: String) -> Out {
    encode(&FromWorker::Failed {
        v: VERSION,
        job,
        attempt,
        message,
    })
}

/// Queues `msg` for the server from a task of its own: the connection
/// loop that drains the queue may be the caller, so it must not wait on
/// a full queue here.
pub fn send_later(out: &mpsc::Sender<Out>, msg: Out) {
    let out = out.clone();
    tokio::spawn(async move {
        let _ = out.send(msg).await;
    });
}
