//! The jobs a worker runs for its server: each assignment becomes one raw
//! engine submission (token ids, no text work: the server detokenizes and
//! matches stop strings), continued after the tokens an earlier attempt
//! delivered, and its events go back as protocol messages, in order,
//! through the connection's bounded queue. Cancelled jobs and jobs left
//! behind by a lost connection are aborted in the engine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use engine::core::CoreEvent;
use engine::{EngineHandle, FinishReason, GenerateRequest, RequestId, SamplingParams};
use tokio::sync::mpsc;

use crate::fleet::protocol::{FromWorker, JobParams, JobToken, VERSION};
use crate::services::models::ModelRegistry;

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
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("jobs", &self.len())
            .finish()
    }
}

fn encode(msg: &FromWorker) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}

impl Running {
    /// Starts `a` on this worker's engine for its model; a refusal goes
    /// back as `failed` (the server places it elsewhere).
    /// `delay` holds each token back (`--debug-token-delay-ms`).
    pub fn start(
        self: &Arc<Self>,
        models: &ModelRegistry,
        a: Assignment,
        out: &mpsc::Sender<String>,
        delay: std::time::Duration,
        stall_after: Option<u64>,
    ) {
        let (job, attempt) = (a.job, a.attempt);
        let n = self
            .started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if stall_after.is_some_and(|s| n >= s) {
            return; // `--debug-stall-after`: a hung device never answers
        }
        let failed = |message: String| {
            encode(&FromWorker::Failed {
                v: VERSION,
                job,
                attempt,
                message,
            })
        };
        let engine = match models.text(&a.model) {
            Ok(e) => e,
            Err(e) => {
                send_later(out, failed(e.to_string()));
                return;
            }
        };
        let req = GenerateRequest {
            prompt_tokens: a.prompt,
            params: sampling(&a.params),
        };
        let mut raw = match engine.submit_raw(req, a.resume) {
            Ok(r) => r,
            Err(e) => {
                send_later(out, failed(e.to_string()));
                return;
            }
        };
        self.lock().insert(job, (engine, raw.id()));
        let (me, out) = (self.clone(), out.clone());
        tokio::spawn(async move {
            while let Some(ev) = raw.next().await {
                let msg = match ev {
                    CoreEvent::Accepted => FromWorker::Accepted {
                        v: VERSION,
                        job,
                        attempt,
                    },
                    CoreEvent::Token { id, logprob } => {
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        FromWorker::Tokens {
                            v: VERSION,
                            job,
                            attempt,
                            tokens: vec![JobToken {
                                id,
                                logprob: logprob.as_ref().map(|l| l.logprob),
                                top: logprob.map(|l| l.top).unwrap_or_default(),
                            }],
                        }
                    }
                    CoreEvent::Finished { reason, usage } => FromWorker::Done {
                        v: VERSION,
                        job,
                        attempt,
                        reason: match reason {
                            FinishReason::Stop => "stop",
                            FinishReason::Length => "length",
                            FinishReason::Abort => "abort",
                        }
                        .into(),
                        prompt_tokens: usage.prompt_tokens as u32,
                        cached_tokens: usage.cached_tokens as u32,
                        completion_tokens: usage.completion_tokens as u32,
                    },
                    CoreEvent::Failed(e) => FromWorker::Failed {
                        v: VERSION,
                        job,
                        attempt,
                        message: e.to_string(),
                    },
                };
                if out.send(encode(&msg)).await.is_err() {
                    break; // the connection is gone: dropping `raw` aborts
                }
            }
            me.lock().remove(&job);
        });
    }

    /// Stops `job` (its `done` with `abort` follows).
    pub fn cancel(&self, job: u64) {
        if let Some((engine, id)) = self.lock().get(&job) {
            engine.abort(*id);
        }
    }

    /// Stops every job (the connection was lost; the server replays them).
    pub fn abort_all(&self) {
        for (engine, id) in self.lock().values() {
            engine.abort(*id);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (EngineHandle, RequestId)>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Queues `msg` for the server from a task of its own: the connection
/// loop that drains the queue may be the caller, so it must not wait on
/// a full queue here.
pub fn send_later(out: &mpsc::Sender<String>, msg: String) {
    let out = out.clone();
    tokio::spawn(async move {
        let _ = out.send(msg).await;
    });
}

/// The engine's parameters for a job (one choice, no stop strings).
pub fn sampling(p: &JobParams) -> SamplingParams {
    SamplingParams {
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k as usize,
        seed: Some(p.seed),
        max_tokens: p.max_tokens as usize,
        stop: Vec::new(),
        stop_token_ids: p.stop_token_ids.clone(),
        ignore_eos: p.ignore_eos,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        frequency_penalty: p.frequency_penalty,
        presence_penalty: p.presence_penalty,
        logit_bias: p.logit_bias.clone(),
        logprobs: p.logprobs.map(|n| n as usize),
        n: 1,
        priority: 0,
        grammar: None,
    }
}
