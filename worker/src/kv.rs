//! The worker's side of a split (prefill on one worker, decode on
//! another, the KV relayed by the server as binary frames).
//!
//! Prefill side (`prefill`): the prompt runs on this engine with one
//! token to generate; its KV rows stream out as they are computed (from
//! the position the decode side asked for) as the protocol's frames
//! (`protocol::kv_stream`), then `kv_end` with their digest and the first
//! token.
//!
//! Decode side: `jobs` gathers the frames in a `protocol::kv_stream::
//! KvAssembly`, which checks each one and, at `kv_end`, the coverage and
//! the digest; only KV that passed everything is used. Any doubt (a bad
//! frame, a wrong digest, a short layer, `kv_abort`) means the prompt is
//! recomputed here.

use tokio::sync::mpsc;

use engine::core::{CoreEvent, Handoff};
use engine::kv_cache::transfer::KvRows;
use engine::{EngineHandle, GenerateRequest};

use super::Out;
use protocol::kv_stream::{KvDigest, frames_of};
use protocol::{FromWorker, JobParams, JobToken, VERSION};

/// How a prefill worker misbehaves (tests only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Flip a byte of the second frame after its checksum.
    pub corrupt: bool,
    /// Never send `kv_end`.
    pub drop_end: bool,
    /// Wait before each frame.
    pub frame_delay: std::time::Duration,
}

/// A prefill to run for a split, as the server sent it.
#[derive(Debug, Clone)]
pub struct Prefill {
    pub transfer: u64,
    pub model: String,
    pub prompt: Vec<u32>,
    pub params: JobParams,
    /// The first position to send (the decode side holds those before).
    pub from: usize,
}

/// Runs a prefill for `transfer` and streams its KV to the server;
/// returns the message that ends it (`kv_end` or `kv_failed`), `None`
/// when a fault drops it.
pub async fn prefill(
    engine: &EngineHandle,
    job: Prefill,
    out: &mpsc::Sender<Out>,
    faults: Faults,
    started: &(dyn Fn(engine::RequestId) + Send + Sync),
) -> Option<FromWorker> {
    let Prefill {
        transfer,
        prompt,
        params,
        from,
        ..
    } = job;
    let failed = |message: String| {
        Some(FromWorker::KvFailed {
            v: VERSION,
            transfer,
            message,
        })
    };
    let mut sampling = params.sampling();
    sampling.max_tokens = 1;
    let req = GenerateRequest {
        prompt_tokens: prompt,
        params: sampling,
    };
    let (tx, mut rows) = mpsc::unbounded_channel();
    let handoff = Handoff {
        export: Some((from, tx)),
        ..Default::default()
    };
    let raw = engine
        .validate(req)
        .and_then(|r| engine.submit_handoff(r, Vec::new(), handoff));
    let mut raw = match raw {
        Ok(r) => r,
        Err(e) => return failed(e.to_string()),
    };
    started(raw.id());
    let (sent, digest) = stream_rows(&mut rows, transfer, out, faults).await?;
    let (first, counts) = match first_token(&mut raw).await {
        Ok(f) => f,
        Err(why) => return failed(why),
    };
    if faults.drop_end {
        return None;
    }
    Some(FromWorker::KvEnd {
        v: VERSION,
        transfer,
        tokens: sent as u32,
        digest,
        first,
        prompt_tokens: counts.0,
        cached_tokens: counts.1,
    })
}

/// Sends the prompt's rows as frames while the engine computes them;
/// answers how many positions went and the frames' digest (`None`: the
/// connection is gone).
async fn stream_rows(
    rows: &mut mpsc::UnboundedReceiver<KvRows>,
    transfer: u64,
    out: &mpsc::Sender<Out>,
    faults: Faults,
) -> Option<(usize, String)> {
    let mut digest = KvDigest::default();
    let (mut sent, mut frames) = (0usize, 0usize);
    while let Some(r) = rows.recv().await {
        for frame in frames_of(transfer, r.first, r.count, &r.layers) {
            if !faults.frame_delay.is_zero() {
                tokio::time::sleep(faults.frame_delay).await;
            }
            digest.frame(&frame);
            let mut frame = frame;
            frames += 1;
            if faults.corrupt && frames == 2 {
                let last = frame.len() - 1;
                frame[last] ^= 0x5a;
            }
            if out.send(Out::Frame(frame)).await.is_err() {
                return None;
            }
        }
        sent += r.count;
    }
    Some((sent, digest.hex()))
}

/// The prefill's one sampled token and its prompt and cached counts.
async fn first_token(raw: &mut engine::RawStream) -> Result<(JobToken, (u32, u32)), String> {
    let mut first = None;
    let mut counts = (0, 0);
    while let Some(ev) = raw.next().await {
        match ev {
            CoreEvent::Accepted => {}
            CoreEvent::Token { id, logprob } => {
                first = Some(JobToken {
                    id,
                    logprob: logprob.as_ref().map(|l| l.logprob),
                    top: logprob.map(|l| l.top).unwrap_or_default(),
                });
            }
            CoreEvent::Finished { usage, .. } => {
                counts = (usage.prompt_tokens as u32, usage.cached_tokens as u32);
                break;
            }
            CoreEvent::Failed(e) => return Err(e.to_string()),
        }
    }
    let first = first.ok_or_else(|| "the prefill produced no token".to_string())?;
    Ok((first, counts))
}
