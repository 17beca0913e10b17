//! The engine's side of the wire, for every worker (the native process and
//! the browser tab): a job's engine events as protocol messages, a served
//! model's KV geometry, and the load its engines report each heartbeat.

use engine::core::CoreEvent;
use engine::{EngineHandle, FinishReason, ModelInfo};

use crate::{FromWorker, JobToken, Load, ServedModel, VERSION};

/// The protocol message for one engine event of a job's attempt.
pub fn job_message(job: u64, attempt: u32, ev: CoreEvent) -> FromWorker {
    match ev {
        CoreEvent::Accepted => FromWorker::Accepted {
            v: VERSION,
            job,
            attempt,
        },
        CoreEvent::Token { id, logprob } => FromWorker::Tokens {
            v: VERSION,
            job,
            attempt,
            tokens: vec![JobToken {
                id,
                logprob: logprob.as_ref().map(|l| l.logprob),
                top: logprob.map(|l| l.top).unwrap_or_default(),
            }],
        },
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
    }
}

/// `model`'s KV geometry as an engine holds it (`info`).
pub fn served_model(model: &str, info: &ModelInfo) -> ServedModel {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    ServedModel {
        name: model.to_string(),
        layers: n(info.layers),
        kv_heads: n(info.kv_heads),
        head_dim: n(info.head_dim),
        block_size: n(info.block_size),
        context_length: n(info.context_length),
    }
}

/// The combined load of a worker's engines, with the mean step time since
/// the last reading.
#[derive(Debug, Default)]
pub struct Meter {
    last: (u64, u64),
}

impl Meter {
    pub fn load<'a>(&mut self, engines: impl IntoIterator<Item = &'a EngineHandle>) -> Load {
        let mut load = Load::default();
        let (mut busy, mut steps) = (0u64, 0u64);
        for h in engines {
            let s = h.stats();
            load.queued += s.num_waiting as u32;
            load.running += s.num_running as u32;
            let free = 1.0 - s.kv_usage_ppm as f64 / 1e6;
            load.free_kv_blocks += (h.info().kv_blocks as f64 * free) as u32;
            busy += s.busy_micros;
            steps += s.steps;
        }
        let (db, ds) = (busy - self.last.0.min(busy), steps - self.last.1.min(steps));
        load.step_ms = if ds == 0 {
            0.0
        } else {
            db as f32 / ds as f32 / 1e3
        };
        self.last = (busy, steps);
        load
    }
}
