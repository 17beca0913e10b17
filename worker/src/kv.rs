//! The worker's side of a split (prefill on one worker, decode on
//! another, the KV relayed by the server as binary frames).
//!
//! Prefill side (`prefill`): the prompt runs on this engine with one
//! token to generate; its KV rows stream out as they are computed (from
//! the position the decode side asked for), each layer's rows cut into
//! checksummed frames of at most `MAX_PAYLOAD` bytes, then `kv_end` with
//! the SHA-256 of every payload in order and the first token.
//!
//! Decode side (`Incoming`): frames are checked one by one (checksum,
//! geometry, the next positions of their layer) and gathered; at
//! `kv_end` the digest and the coverage are checked, and only KV that
//! passed everything is used. Any doubt (a bad frame, a wrong digest, a
//! short layer, `kv_abort`) means the prompt is recomputed here.

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use engine::core::{CoreEvent, Handoff};
use engine::kv_cache::transfer::KvRows;
use engine::{EngineHandle, GenerateRequest};

use super::Out;
use protocol::{self, FromWorker, JobParams, JobToken, MAX_PAYLOAD, ServedModel, VERSION};

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

/// Hex of a digest.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    let mut hasher = Sha256::new();
    let (mut sent, mut frames) = (0usize, 0usize);
    while let Some(r) = rows.recv().await {
        for frame in frames_of(transfer, &r) {
            if !faults.frame_delay.is_zero() {
                tokio::time::sleep(faults.frame_delay).await;
            }
            hasher.update(&frame[protocol::HEADER..]);
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
    Some((sent, hex(&hasher.finalize())))
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

/// `rows` as frames: per layer, runs of positions whose keys and values
/// fit one payload.
pub fn frames_of(transfer: u64, rows: &KvRows) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (layer, bytes) in rows.layers.iter().enumerate() {
        let (k, v) = bytes.split_at(bytes.len() / 2);
        let per = k.len() / rows.count.max(1);
        let step = (MAX_PAYLOAD / (2 * per.max(1))).max(1);
        let mut at = 0;
        while at < rows.count {
            let n = step.min(rows.count - at);
            let mut payload = Vec::with_capacity(2 * n * per);
            payload.extend_from_slice(&k[at * per..(at + n) * per]);
            payload.extend_from_slice(&v[at * per..(at + n) * per]);
            let first = (rows.first + at) as u32;
            out.push(protocol::encode_frame(
                transfer,
                layer as u32,
                first,
                n as u32,
                &payload,
            ));
            at += n;
        }
    }
    out
}

/// The KV of a transfer arriving at the decode side.
#[derive(Debug)]
pub struct Incoming {
    transfer: u64,
    model: ServedModel,
    from: usize,
    /// Per layer: keys, values, and the next position expected.
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
    next: Vec<usize>,
    hasher: Sha256,
    /// The first reason not to trust it.
    doubt: Option<String>,
}

impl Incoming {
    pub fn new(transfer: u64, model: ServedModel, from: usize) -> Self {
        let layers = model.layers as usize;
        Self {
            transfer,
            model,
            from,
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            next: vec![from; layers],
            hasher: Sha256::new(),
            doubt: None,
        }
    }

    /// Takes one frame; a bad one puts the whole transfer in doubt.
    pub fn push(&mut self, frame: &[u8]) {
        if self.doubt.is_some() {
            return;
        }
        if let Err(e) = self.take(frame) {
            self.doubt = Some(e);
        }
    }

    fn take(&mut self, frame: &[u8]) -> Result<(), String> {
        let (h, payload) = protocol::decode_frame(frame, &self.model).map_err(|e| e.to_string())?;
        let layer = h.layer as usize;
        if h.transfer != self.transfer || h.first_token as usize != self.next[layer] {
            return Err(format!(
                "frame of transfer {} at position {} of layer {layer}, expected {} at {}",
                h.transfer, h.first_token, self.transfer, self.next[layer]
            ));
        }
        let (k, v) = payload.split_at(payload.len() / 2);
        self.keys[layer].extend_from_slice(k);
        self.values[layer].extend_from_slice(v);
        self.next[layer] += h.tokens as usize;
        self.hasher.update(payload);
        Ok(())
    }

    /// The verified rows, given the prefill side's end for a prompt of
    /// `prompt_len` tokens; why not otherwise.
    pub fn finish(self, tokens: u32, digest: &str, prompt_len: usize) -> Result<KvRows, String> {
        if let Some(d) = self.doubt {
            return Err(d);
        }
        let end = self.from + tokens as usize;
        if end != prompt_len {
            return Err(format!(
                "{tokens} positions from {} do not reach the prompt's end {prompt_len}",
                self.from
            ));
        }
        if let Some(l) = self.next.iter().position(|&n| n != end) {
            return Err(format!("layer {l} stopped at {} of {end}", self.next[l]));
        }
        if hex(&self.hasher.finalize()) != digest {
            return Err("the KV digest does not match".into());
        }
        let layers = self
            .keys
            .into_iter()
            .zip(self.values)
            .map(|(mut k, v)| {
                k.extend_from_slice(&v);
                k
            })
            .collect();
        Ok(KvRows {
            first: self.from,
            count: tokens as usize,
            layers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ServedModel {
        ServedModel {
            name: "m".into(),
            layers: 2,
            kv_heads: 2,
            head_dim: 4,
            block_size: 16,
            context_length: 4096,
        }
    }

    /// Rows of positions `first..first + count` with recognisable bytes.
    fn rows(first: usize, count: usize) -> KvRows {
        let per = 2 * 2 * 4 * 2;
        KvRows {
            first,
            count,
            layers: (0..2)
                .map(|l| (0..count * per).map(|i| (i * 7 + l * 3) as u8).collect())
                .collect(),
        }
    }

    fn digest_of(frames: &[Vec<u8>]) -> String {
        let mut h = Sha256::new();
        for f in frames {
            h.update(&f[protocol::HEADER..]);
        }
        hex(&h.finalize())
    }

    #[test]
    fn frames_stream_in_chunks_and_reassemble_to_the_rows() {
        let parts = [rows(32, 10), rows(42, 20), rows(62, 5)];
        let frames: Vec<Vec<u8>> = parts.iter().flat_map(|r| frames_of(9, r)).collect();
        assert_eq!(frames.len(), 6, "one frame per layer per chunk");
        let payload: usize = frames.iter().map(|f| f.len() - protocol::HEADER).sum();
        assert_eq!(
            payload,
            2 * 35 * 2 * 2 * 4 * 2,
            "layers x tokens x K,V x heads x dims x f16"
        );
        let mut inc = Incoming::new(9, model(), 32);
        frames.iter().for_each(|f| inc.push(f));
        let got = inc.finish(35, &digest_of(&frames), 67).expect("verified");
        assert_eq!(Some(got), KvRows::concat(&parts));
    }

    #[test]
    fn any_doubt_refuses_the_whole_transfer() {
        let frames = frames_of(9, &rows(0, 40));
        let digest = digest_of(&frames);
        let verify = |fs: &[Vec<u8>], tokens: u32, digest: &str, from: usize| {
            let mut inc = Incoming::new(9, model(), from);
            fs.iter().for_each(|f| inc.push(f));
            inc.finish(tokens, digest, 40)
        };
        assert!(verify(&frames, 40, &digest, 0).is_ok());
        let mut bad = frames.clone();
        let last = bad[1].len() - 1;
        bad[1][last] ^= 1;
        assert!(matches!(verify(&bad, 40, &digest, 0), Err(e) if e.contains("checksum")));
        assert!(
            verify(&frames[..1], 40, &digest, 0).is_err(),
            "a layer missing"
        );
        let zeros = "0".repeat(64);
        assert!(matches!(verify(&frames, 40, &zeros, 0), Err(e) if e.contains("digest")));
        assert!(
            verify(&frames, 39, &digest, 0).is_err(),
            "short of the prompt"
        );
        assert!(
            verify(&frames, 40, &digest, 8).is_err(),
            "not where it was asked"
        );
        let mut swapped = frames.clone();
        swapped.swap(0, 1);
        assert!(
            verify(&swapped, 40, &digest, 0).is_err(),
            "digest is over the order"
        );
        let other = frames_of(10, &rows(0, 40));
        assert!(
            verify(&other, 40, &digest_of(&other), 0).is_err(),
            "another transfer"
        );
    }

    /// Random and mutated frames never panic the decode side, and never
    /// pass for the real transfer.
    #[test]
    fn mangled_frames_never_panic_and_never_verify() {
        let frames = frames_of(9, &rows(0, 40));
        let digest = digest_of(&frames);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..2_000 {
            let mut fs = frames.clone();
            let i = (next() as usize) % fs.len();
            let f = &mut fs[i];
            for _ in 0..1 + next() % 3 {
                let at = (next() as usize) % f.len();
                f[at] = next() as u8;
            }
            let cut = (next() as usize) % (f.len() + 1);
            if next() % 2 == 0 {
                f.truncate(cut);
            }
            let mut inc = Incoming::new(9, model(), 0);
            fs.iter().for_each(|f| inc.push(f));
            if fs != frames {
                assert!(inc.finish(40, &digest, 40).is_err());
            }
        }
    }

    #[test]
    fn big_layers_are_cut_into_payloads_under_the_limit() {
        let m = ServedModel {
            layers: 1,
            kv_heads: 8,
            head_dim: 128,
            ..model()
        };
        let per = 2 * 8 * 128 * 2;
        let r = KvRows {
            first: 0,
            count: 600,
            layers: vec![(0..600 * per).map(|i| i as u8).collect()],
        };
        let frames = frames_of(1, &r);
        assert!(frames.len() > 1);
        assert!(
            frames
                .iter()
                .all(|f| f.len() - protocol::HEADER <= MAX_PAYLOAD)
        );
        let mut inc = Incoming::new(1, m, 0);
        frames.iter().for_each(|f| inc.push(f));
        assert_eq!(inc.finish(600, &digest_of(&frames), 600), Ok(r));
    }
}
