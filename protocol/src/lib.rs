//! The worker protocol, version 1 (documented in `docs/fleet-protocol.md`):
//! control messages as tagged JSON text frames (`{"v":1,"type":...}`) and
//! bulk data as binary frames with a fixed 40-byte header. Both decoders
//! take untrusted bytes from the network: they bound every size before
//! allocating, check the version, the checksum and (for KV) the geometry
//! the worker registered, and answer a typed error, never a panic.

use serde::{Deserialize, Serialize};

pub mod bus;
#[cfg(feature = "engine")]
pub mod engine_side;
pub mod kv_stream;
#[cfg(feature = "engine")]
pub mod pipeline;
#[cfg(feature = "engine")]
pub mod sampling;
pub mod stage;

/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// The WebSocket close code of a worker an admin removed: it leaves and
/// does not reconnect.
pub const CLOSE_REMOVED: u16 = 4001;
/// The WebSocket close code of a worker whose token was quarantined or
/// revoked: it stops, and its token is refused until an admin acts.
pub const CLOSE_SANCTIONED: u16 = 4003;
/// The largest control message accepted (bytes of JSON).
pub const MAX_CONTROL: usize = 64 * 1024;
/// The largest binary frame payload (a KV chunk): 1 MiB.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Bytes of a binary frame's header.
pub const HEADER: usize = 40;
pub(crate) const MAGIC: [u8; 4] = *b"SYKF";

/// A device a worker detected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Device {
    /// `cpu`, `wgpu` or `cuda`.
    pub kind: String,
    /// The device's name (CPU model, adapter or GPU name).
    pub name: String,
    /// Cores (CPU) or compute units, where known.
    #[serde(default)]
    pub cores: u32,
    /// Memory in bytes (host memory for a CPU).
    #[serde(default)]
    pub memory_bytes: u64,
    /// Instruction-set or backend features (`avx512f`, `vulkan`, ...).
    #[serde(default)]
    pub features: Vec<String>,
    /// Whether this build can run models on it.
    #[serde(default)]
    pub usable: bool,
}

/// A model a worker serves, with its KV geometry (bytes of KV per token
/// of one layer follow from it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServedModel {
    pub name: String,
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    pub context_length: u32,
}

impl ServedModel {
    /// Bytes of one token's K and V in one layer, as f16.
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * u64::from(self.kv_heads) * u64::from(self.head_dim) * 2
    }
}

/// A worker's standing offer for one model: what its provider takes per
/// million tokens of each phase (ticks, the protocol fee not included:
/// the market adds it), for how much capacity, until when, and whether
/// the capacity may be preempted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Ask {
    pub model: String,
    /// Per million prompt tokens computed (prefill).
    pub input: i64,
    /// Per million prompt tokens served from its prefix cache.
    #[serde(default)]
    pub cached_input: i64,
    /// Per million generated tokens (decode).
    pub output: i64,
    /// Generated tokens per second it offers (0: what calibration
    /// measured).
    #[serde(default)]
    pub capacity: u64,
    /// Unix seconds after which the ask lapses (0: while connected).
    #[serde(default)]
    pub until: i64,
    #[serde(default)]
    pub preemptible: bool,
}

/// What a worker reports every second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Load {
    /// Requests waiting in its engine.
    pub queued: u32,
    /// Sequences running.
    pub running: u32,
    pub free_kv_blocks: u32,
    /// Its last engine step, in milliseconds.
    pub step_ms: f32,
}

/// A job's sampling as the server resolved it: the seed is always set,
/// so every executor draws the same token at the same position. Stop
/// strings stay on the server (it detokenizes); stop token ids and EOS
/// are the worker's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub seed: u64,
    pub max_tokens: u32,
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Top log-probabilities to return per token (`None`: none at all).
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Whose request it is, as a number of this worker's own (0: no
    /// one's): the worker's scheduler shares prefill fairly between them.
    #[serde(default)]
    pub tenant: u64,
}

/// One generated token, with its log-probability when asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobToken {
    pub id: u32,
    #[serde(default)]
    pub logprob: Option<f32>,
    #[serde(default)]
    pub top: Vec<(u32, f32)>,
}

/// The largest message a worker accepts from the server (an assignment
/// carries a whole prompt).
pub const MAX_ASSIGN: usize = 4 << 20;

/// Messages a worker sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum FromWorker {
    /// First message after the handshake: what the worker is and holds.
    Register {
        v: u8,
        /// A name its provider chose (shown to admins).
        name: String,
        /// The worker's build (`synor` version).
        build: String,
        devices: Vec<Device>,
        models: Vec<ServedModel>,
        threads: u32,
        region: String,
        /// Its prices (none: it takes the house's).
        #[serde(default)]
        asks: Vec<Ask>,
        /// The embedding models it serves.
        #[serde(default)]
        encoders: Vec<String>,
        /// The models it can hold a part of (a layer-sharded pipeline's
        /// stage), loaded when the server asks (`load_part`).
        #[serde(default)]
        parts: Vec<stage::PartOffer>,
    },
    /// Every second.
    Status { v: u8, load: Load },
    /// It is shutting down: place nothing new on it.
    Drain { v: u8 },
    /// Its engine took attempt `attempt` of `job`.
    Accepted { v: u8, job: u64, attempt: u32 },
    /// Tokens of the attempt, in order.
    Tokens {
        v: u8,
        job: u64,
        attempt: u32,
        tokens: Vec<JobToken>,
    },
    /// The attempt ended: `stop` (EOS, a stop token), `length`, or
    /// `abort` (cancelled), with its engine's counts.
    Done {
        v: u8,
        job: u64,
        attempt: u32,
        reason: String,
        prompt_tokens: u32,
        cached_tokens: u32,
        completion_tokens: u32,
    },
    /// The attempt failed or was refused (the server replays it).
    Failed {
        v: u8,
        job: u64,
        attempt: u32,
        message: String,
    },
    /// The vectors of an `embed` job, in order, and the tokens embedded.
    Embedded {
        v: u8,
        job: u64,
        vectors: Vec<Vec<f32>>,
        prompt_tokens: u32,
    },
    /// Decode side of a split: send transfer `transfer`'s KV from prompt
    /// position `from` on (what its prefix cache holds is not sent).
    KvWant {
        v: u8,
        job: u64,
        attempt: u32,
        transfer: u64,
        from: u32,
    },
    /// Prefill side: every frame of `transfer` was sent, `tokens`
    /// positions of every layer, the SHA-256 (hex) of the frames'
    /// payloads in order, the first generated token, and its engine's
    /// counts.
    KvEnd {
        v: u8,
        transfer: u64,
        tokens: u32,
        digest: String,
        first: JobToken,
        prompt_tokens: u32,
        cached_tokens: u32,
    },
    /// Prefill side: the transfer failed (nothing more comes).
    KvFailed {
        v: u8,
        transfer: u64,
        message: String,
    },
    /// Decode side: whether it started from the transfer's KV or
    /// recomputed the prompt, and why.
    KvResult {
        v: u8,
        job: u64,
        attempt: u32,
        transfer: u64,
        imported: bool,
        #[serde(default)]
        reason: String,
    },
    /// It holds layers `first..end` of `model` with `blocks` KV blocks a
    /// layer (after `load_part`).
    PartLoaded {
        v: u8,
        model: String,
        first: u32,
        end: u32,
        blocks: u32,
    },
    /// It could not load the part it was asked for.
    PartFailed {
        v: u8,
        model: String,
        message: String,
    },
    /// A stage step is done: its output hidden states were sent before
    /// this as frames of `step`; the last stage sends the tokens sampled
    /// for each chunk instead.
    StageDone {
        v: u8,
        step: u64,
        #[serde(default)]
        tokens: Vec<Vec<JobToken>>,
    },
    /// A stage step failed.
    StageFailed { v: u8, step: u64, message: String },
}

/// Messages the server sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToWorker {
    /// The registration was accepted.
    Welcome {
        v: u8,
        worker_id: String,
        provider_id: String,
        /// How often to send `status`.
        heartbeat_ms: u64,
    },
    /// The server refuses something; it closes the connection after a
    /// fatal one.
    Error {
        v: u8,
        code: String,
        message: String,
    },
    /// Stop taking work and leave once idle (an admin removed it).
    Drain { v: u8 },
    /// An admin paused it (`paused`: no new work; running work finishes;
    /// it stays connected) or resumed it.
    Pause { v: u8, paused: bool },
    /// Run attempt `attempt` of `job`: `prompt`, then, after `resume`
    /// (tokens an earlier attempt already delivered, taken as generated),
    /// up to `params.max_tokens` generated tokens in all.
    Assign {
        v: u8,
        job: u64,
        attempt: u32,
        model: String,
        prompt: Vec<u32>,
        #[serde(default)]
        resume: Vec<u32>,
        params: JobParams,
        /// Split: the prompt's KV arrives from a prefill worker.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kv: Option<KvIncoming>,
    },
    /// Stop `job` (the client left, or a stop string matched), or a
    /// prefill by its transfer id.
    Cancel { v: u8, job: u64 },
    /// Embed `texts` (or `tokens`, one list per input) with `model`;
    /// `query`: one short text for similarity search (the int8 query
    /// encoder, whose vectors compare only with each other). Answered by
    /// `embedded` or `failed` (attempt 1).
    Embed {
        v: u8,
        job: u64,
        model: String,
        #[serde(default)]
        texts: Vec<String>,
        #[serde(default)]
        tokens: Vec<Vec<u32>>,
        #[serde(default)]
        query: bool,
    },
    /// Prefill side of a split: compute `prompt`, sample its first token,
    /// and stream its KV from position `from` on as binary frames of
    /// `transfer`, as the prefill goes, then `kv_end` (or `kv_failed`).
    Prefill {
        v: u8,
        transfer: u64,
        model: String,
        prompt: Vec<u32>,
        params: JobParams,
        from: u32,
    },
    /// Decode side: every frame of `transfer` was relayed; verify, then
    /// start after `first` (relayed from the prefill side's `kv_end`).
    KvEnd {
        v: u8,
        transfer: u64,
        tokens: u32,
        digest: String,
        first: JobToken,
    },
    /// Decode side: the transfer failed (`reason`); recompute the prompt.
    KvAbort {
        v: u8,
        transfer: u64,
        reason: String,
    },
    /// Hold layers `first..end` of `model` as a pipeline stage, with
    /// `blocks` KV blocks of `block_size` tokens a layer (answered by
    /// `part_loaded` or `part_failed`); a part it held before is dropped.
    LoadPart {
        v: u8,
        model: String,
        first: u32,
        end: u32,
        blocks: u32,
        block_size: u32,
    },
    /// Drop the part of `model` it holds.
    DropPart { v: u8, model: String },
    /// Run its layers of `model` over `chunks`, from the hidden states
    /// sent before this as frames of `step` (`rows` rows; none on the
    /// first stage, which embeds the tokens). The last stage samples each
    /// chunk with its `sampling`.
    StageStep {
        v: u8,
        step: u64,
        model: String,
        chunks: Vec<stage::StageChunk>,
        rows: u32,
        #[serde(default)]
        sampling: Vec<Option<stage::StageSampling>>,
    },
}

/// With an assignment: its prompt's KV comes from another worker as
/// transfer `transfer` (answer `kv_want`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvIncoming {
    pub transfer: u64,
}

/// Why a message or frame was refused (sent as the close reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("control message of {0} bytes is over the {MAX_CONTROL}-byte limit")]
    TooLarge(usize),
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("protocol version {0} is not supported (this server speaks {VERSION})")]
    Version(u8),
    #[error("binary frame: {0}")]
    Frame(String),
}

/// Decodes one control message from a worker.
pub fn decode(text: &str) -> Result<FromWorker, ProtocolError> {
    if text.len() > MAX_CONTROL {
        return Err(ProtocolError::TooLarge(text.len()));
    }
    let msg: FromWorker =
        serde_json::from_str(text).map_err(|e| ProtocolError::Malformed(short(&e.to_string())))?;
    let v = match &msg {
        FromWorker::Register { v, .. }
        | FromWorker::Status { v, .. }
        | FromWorker::Drain { v }
        | FromWorker::Accepted { v, .. }
        | FromWorker::Tokens { v, .. }
        | FromWorker::Done { v, .. }
        | FromWorker::Failed { v, .. }
        | FromWorker::Embedded { v, .. }
        | FromWorker::KvWant { v, .. }
        | FromWorker::KvEnd { v, .. }
        | FromWorker::KvFailed { v, .. }
        | FromWorker::KvResult { v, .. }
        | FromWorker::PartLoaded { v, .. }
        | FromWorker::PartFailed { v, .. }
        | FromWorker::StageDone { v, .. }
        | FromWorker::StageFailed { v, .. } => *v,
    };
    if v != VERSION {
        return Err(ProtocolError::Version(v));
    }
    Ok(msg)
}

/// Decodes one message from the server (on the worker).
pub fn decode_from_server(text: &str) -> Result<ToWorker, ProtocolError> {
    if text.len() > MAX_ASSIGN {
        return Err(ProtocolError::TooLarge(text.len()));
    }
    let msg: ToWorker =
        serde_json::from_str(text).map_err(|e| ProtocolError::Malformed(short(&e.to_string())))?;
    let v = match &msg {
        ToWorker::Welcome { v, .. }
        | ToWorker::Error { v, .. }
        | ToWorker::Drain { v }
        | ToWorker::Pause { v, .. }
        | ToWorker::Assign { v, .. }
        | ToWorker::Cancel { v, .. }
        | ToWorker::Embed { v, .. }
        | ToWorker::Prefill { v, .. }
        | ToWorker::KvEnd { v, .. }
        | ToWorker::KvAbort { v, .. }
        | ToWorker::LoadPart { v, .. }
        | ToWorker::DropPart { v, .. }
        | ToWorker::StageStep { v, .. } => *v,
    };
    if v != VERSION {
        return Err(ProtocolError::Version(v));
    }
    Ok(msg)
}

/// Encodes a message for a worker.
pub fn encode(msg: &ToWorker) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}

/// A close reason fits in a WebSocket close frame (123 bytes).
pub(crate) fn short(s: &str) -> String {
    let mut end = s.len().min(100);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// What a binary frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A chunk of KV cache: `token_count` tokens of one layer.
    Kv = 1,
    /// Rows of a pipeline stage's hidden states (`stage`).
    Hidden = 2,
}

/// What a binary frame says it carries (`None`: not a frame of ours).
pub fn frame_kind(bytes: &[u8]) -> Option<FrameKind> {
    if bytes.len() < HEADER || bytes[..4] != MAGIC {
        return None;
    }
    match bytes[5] {
        1 => Some(FrameKind::Kv),
        2 => Some(FrameKind::Hidden),
        _ => None,
    }
}

/// A binary frame's header (little-endian on the wire):
/// magic `SYKF` (4), version (1), kind (1), reserved (2), transfer id (8),
/// layer (4), dtype (1, 1 = f16), reserved (3), first token (4), token
/// count (4), payload length (4), CRC-32 of the payload (4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub transfer: u64,
    pub layer: u32,
    pub first_token: u32,
    pub tokens: u32,
    pub len: u32,
    pub crc: u32,
}

/// f16, the only KV dtype on the wire.
const DTYPE_F16: u8 = 1;

/// Encodes a KV chunk as one binary frame.
pub fn encode_frame(
    transfer: u64,
    layer: u32,
    first_token: u32,
    tokens: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[VERSION, FrameKind::Kv as u8, 0, 0]);
    out.extend_from_slice(&transfer.to_le_bytes());
    out.extend_from_slice(&layer.to_le_bytes());
    out.extend_from_slice(&[DTYPE_F16, 0, 0, 0]);
    out.extend_from_slice(&first_token.to_le_bytes());
    out.extend_from_slice(&tokens.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The transfer a binary frame belongs to, after the checks a relay
/// makes (magic, version, kind, a payload of the length it says, within
/// the limit); the payload's checksum and geometry are the receiver's to
/// check.
pub fn frame_transfer(bytes: &[u8]) -> Result<u64, ProtocolError> {
    let bad = |m: String| Err(ProtocolError::Frame(m));
    if bytes.len() < HEADER || bytes[..4] != MAGIC {
        return bad("not a KV frame".into());
    }
    if bytes[4] != VERSION {
        return Err(ProtocolError::Version(bytes[4]));
    }
    let len = u32::from_le_bytes([bytes[32], bytes[33], bytes[34], bytes[35]]) as usize;
    if bytes[5] != FrameKind::Kv as u8 || len > MAX_PAYLOAD || len != bytes.len() - HEADER {
        return bad(format!("a frame of {} bytes says {len}", bytes.len()));
    }
    let mut t = [0u8; 8];
    t.copy_from_slice(&bytes[8..16]);
    Ok(u64::from_le_bytes(t))
}

/// A binary frame's header and payload, once its length, magic and
/// version are ours.
pub(crate) fn split_frame(bytes: &[u8]) -> Result<(&[u8], &[u8]), ProtocolError> {
    if bytes.len() < HEADER {
        return Err(ProtocolError::Frame(format!(
            "{} bytes is shorter than the header",
            bytes.len()
        )));
    }
    let (h, payload) = bytes.split_at(HEADER);
    if h[..4] != MAGIC {
        return Err(ProtocolError::Frame("bad magic".into()));
    }
    if h[4] != VERSION {
        return Err(ProtocolError::Version(h[4]));
    }
    Ok((h, payload))
}

/// Decodes a binary frame against the geometry of the model it is for:
/// every size is checked before the payload is used, and the payload must
/// be exactly `tokens` tokens of one layer's f16 KV.
pub fn decode_frame<'a>(
    bytes: &'a [u8],
    model: &ServedModel,
) -> Result<(FrameHeader, &'a [u8]), ProtocolError> {
    let bad = |m: String| Err(ProtocolError::Frame(m));
    let (h, payload) = split_frame(bytes)?;
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if h[5] != FrameKind::Kv as u8 || h[20] != DTYPE_F16 {
        return bad(format!("unknown kind {} or dtype {}", h[5], h[20]));
    }
    if h[6..8] != [0, 0] || h[21..24] != [0, 0, 0] {
        return bad("reserved header bytes are not zero".into());
    }
    let mut transfer = [0u8; 8];
    transfer.copy_from_slice(&h[8..16]);
    let header = FrameHeader {
        kind: FrameKind::Kv,
        transfer: u64::from_le_bytes(transfer),
        layer: u32_at(16),
        first_token: u32_at(24),
        tokens: u32_at(28),
        len: u32_at(32),
        crc: u32_at(36),
    };
    if header.len as usize > MAX_PAYLOAD || header.len as usize != payload.len() {
        return bad(format!(
            "payload says {} bytes, carries {} (at most {MAX_PAYLOAD})",
            header.len,
            payload.len()
        ));
    }
    if header.layer >= model.layers {
        return bad(format!(
            "layer {} of a {}-layer model",
            header.layer, model.layers
        ));
    }
    let end = u64::from(header.first_token) + u64::from(header.tokens);
    let want = u64::from(header.tokens) * model.kv_bytes_per_token();
    if header.tokens == 0 || end > u64::from(model.context_length) || want != u64::from(header.len)
    {
        return bad(format!(
            "{} tokens from {} do not fit the model's geometry ({} bytes, want {want})",
            header.tokens, header.first_token, header.len
        ));
    }
    if crc32fast::hash(payload) != header.crc {
        return bad("checksum mismatch".into());
    }
    Ok((header, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smol() -> ServedModel {
        ServedModel {
            name: "m".into(),
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            block_size: 16,
            context_length: 8192,
        }
    }

    #[test]
    fn messages_round_trip_and_are_versioned() {
        let status = FromWorker::Status {
            v: 1,
            load: Load {
                queued: 2,
                running: 3,
                free_kv_blocks: 100,
                step_ms: 12.5,
            },
        };
        let json = serde_json::to_string(&status).expect("json");
        assert!(json.contains("\"type\":\"status\""), "{json}");
        assert_eq!(decode(&json), Ok(status));
        assert_eq!(
            decode(r#"{"type":"drain","v":2}"#),
            Err(ProtocolError::Version(2))
        );
        for bad in [
            "",
            "{}",
            r#"{"type":"assign","v":1}"#,
            r#"{"type":"drain"}"#,
            r#"{"type":"drain","v":1,"extra":true}"#,
            r#"{"type":"status","v":1,"load":{"queued":-1}}"#,
        ] {
            assert!(
                matches!(decode(bad), Err(ProtocolError::Malformed(_))),
                "{bad}"
            );
        }
        let huge = format!(
            r#"{{"type":"drain","v":1,"pad":"{}"}}"#,
            "x".repeat(MAX_CONTROL)
        );
        assert_eq!(decode(&huge), Err(ProtocolError::TooLarge(huge.len())));
        let welcome = ToWorker::Welcome {
            v: 1,
            worker_id: "w".into(),
            provider_id: "provider:p".into(),
            heartbeat_ms: 1000,
        };
        assert!(encode(&welcome).starts_with(r#"{"type":"welcome","v":1"#));
    }

    #[test]
    fn frames_round_trip_and_lies_are_refused() {
        let m = smol();
        let per = m.kv_bytes_per_token() as usize;
        let payload: Vec<u8> = (0..4 * per).map(|i| i as u8).collect();
        let frame = encode_frame(7, 3, 16, 4, &payload);
        let (h, p) = decode_frame(&frame, &m).expect("frame");
        assert_eq!(
            (h.transfer, h.layer, h.first_token, h.tokens),
            (7, 3, 16, 4)
        );
        assert_eq!(p, payload.as_slice());
        let refused = |f: &[u8]| decode_frame(f, &m).is_err();
        assert!(
            refused(&encode_frame(7, 30, 0, 4, &payload)),
            "layer past the model"
        );
        assert!(
            refused(&encode_frame(7, 0, 0, 5, &payload)),
            "token count lies"
        );
        assert!(
            refused(&encode_frame(7, 0, 8190, 4, &payload)),
            "past the context"
        );
        assert!(refused(&encode_frame(7, 0, 0, 0, &[])), "empty");
        let mut flipped = frame.clone();
        flipped[HEADER + 5] ^= 1;
        assert!(refused(&flipped), "checksum");
        let mut long = frame.clone();
        long.push(0);
        assert!(refused(&long), "trailing byte");
        assert!(refused(&frame[..HEADER - 1]), "short header");
        // The relay's check: routing fields and length, not the checksum.
        assert_eq!(frame_transfer(&frame), Ok(7));
        assert_eq!(frame_transfer(&flipped), Ok(7));
        assert!(frame_transfer(&long).is_err());
        assert!(frame_transfer(&frame[..HEADER - 1]).is_err());
    }

    /// Random and mutated bytes never panic the decoders.
    #[test]
    fn decoders_survive_random_bytes() {
        let m = smol();
        let good = encode_frame(1, 0, 0, 1, &vec![0u8; m.kv_bytes_per_token() as usize]);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..20_000 {
            let mut f = good.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % f.len();
                f[i] = next() as u8;
            }
            f.truncate((next() as usize) % (f.len() + 1));
            let _ = decode_frame(&f, &m);
            let _ = frame_transfer(&f);
            let text = String::from_utf8_lossy(&f);
            let _ = decode(&text);
        }
    }
}
