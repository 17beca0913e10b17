//! Layer-sharded pipelines on the wire: what a worker offers to hold of a
//! model (`PartOffer`), one step of a stage (`StageChunk`, and on the last
//! stage each chunk's `StageSampling`), and hidden states as binary frames
//! (`FrameKind::Hidden`: f32 rows, checksummed, at most `MAX_PAYLOAD` a
//! frame), in the header layout KV frames use. The decoder takes untrusted
//! bytes: every size is checked against the model's width before the
//! payload is used.

use serde::{Deserialize, Serialize};

use crate::{HEADER, MAGIC, MAX_PAYLOAD, ProtocolError, VERSION};

/// A model a worker can hold a part of: its geometry and what its layers
/// weigh, and the memory the worker gives to it. The server plans which
/// layers it holds (`ToWorker::LoadPart`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PartOffer {
    pub model: String,
    /// The model's layers and hidden width.
    pub layers: u32,
    pub hidden: u32,
    /// Bytes of one layer's weights (the heaviest layer).
    pub layer_bytes: u64,
    /// Bytes of the token embeddings and the output head (held by the
    /// first and the last stage).
    pub ends_bytes: u64,
    /// Bytes of one KV block of one layer.
    pub kv_block_bytes: u64,
    /// Bytes it may use for weights and KV.
    pub memory_bytes: u64,
}

impl PartOffer {
    /// The most layers it can hold next to `blocks` KV blocks a layer
    /// (with the model's ends when `ends`).
    pub fn fits(&self, blocks: u64, ends: bool) -> u32 {
        let per = self
            .layer_bytes
            .saturating_add(blocks.saturating_mul(self.kv_block_bytes));
        let room = self
            .memory_bytes
            .saturating_sub(if ends { self.ends_bytes } else { 0 });
        u32::try_from(room / per.max(1))
            .unwrap_or(u32::MAX)
            .min(self.layers)
    }
}

/// A part of a model a worker holds now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeldPart {
    pub model: String,
    pub first: u32,
    pub end: u32,
    /// KV blocks it holds for each of its layers.
    pub blocks: u32,
}

/// One sequence's share of a stage step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageChunk {
    pub seq: u64,
    /// The tokens at positions `start..start + tokens.len()`.
    pub tokens: Vec<u32>,
    pub start: u32,
    /// Logits rows it wants (the last positions; 0: none).
    pub logits: u32,
    /// Speculative tokens at the end of `tokens`.
    #[serde(default)]
    pub draft: Vec<u32>,
    /// Its KV blocks (the same ids on every stage).
    pub blocks: Vec<u32>,
}

/// A sequence's penalty state: each output token with its count, and the
/// prompt's tokens (both sorted).
pub type PenaltyParts = (Vec<(u32, u32)>, Vec<u32>);

/// How the last stage samples one chunk: the sequence's sampling as the
/// server resolved it, its output position, and where they apply its
/// penalties' state and the tokens structured output allows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSampling {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
    #[serde(default)]
    pub logprobs: Option<u32>,
    pub seed: u64,
    pub position: u64,
    /// Output tokens with their counts, and the prompt's tokens.
    #[serde(default)]
    pub penalties: Option<PenaltyParts>,
    /// The allowed tokens' bitset words.
    #[serde(default)]
    pub allowed: Option<Vec<u64>>,
}

/// f32, the hidden states' dtype on the wire.
const DTYPE_F32: u8 = 2;

/// Rows of `hidden` values per frame.
pub fn rows_per_frame(hidden: usize) -> usize {
    (MAX_PAYLOAD / (4 * hidden.max(1))).max(1)
}

/// `values` (`[rows, hidden]`) of step `step` as binary frames, each at
/// most `MAX_PAYLOAD` bytes of payload.
pub fn hidden_frames(step: u64, hidden: usize, values: &[f32]) -> Vec<Vec<u8>> {
    let per = rows_per_frame(hidden) * hidden.max(1);
    values
        .chunks(per)
        .enumerate()
        .map(|(i, part)| {
            let first = (i * per / hidden.max(1)) as u32;
            let rows = (part.len() / hidden.max(1)) as u32;
            let payload: Vec<u8> = part.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut out = Vec::with_capacity(HEADER + payload.len());
            out.extend_from_slice(&MAGIC);
            out.extend_from_slice(&[VERSION, crate::FrameKind::Hidden as u8, 0, 0]);
            out.extend_from_slice(&step.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&[DTYPE_F32, 0, 0, 0]);
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&rows.to_le_bytes());
            out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            out.extend_from_slice(&payload);
            out
        })
        .collect()
}

/// The step a hidden-state frame says it belongs to (`None`: not one).
pub fn hidden_step(bytes: &[u8]) -> Option<u64> {
    if crate::frame_kind(bytes) != Some(crate::FrameKind::Hidden) {
        return None;
    }
    let mut step = [0u8; 8];
    step.copy_from_slice(&bytes[8..16]);
    Some(u64::from_le_bytes(step))
}

/// One decoded hidden-state frame: its step, its first row and the rows.
#[derive(Debug, Clone, PartialEq)]
pub struct HiddenRows {
    pub step: u64,
    pub first: u32,
    pub values: Vec<f32>,
}

/// Decodes a hidden-state frame of a model `hidden` wide: the header's
/// sizes, the reserved bytes and the checksum are checked first.
pub fn decode_hidden(bytes: &[u8], hidden: usize) -> Result<HiddenRows, ProtocolError> {
    let bad = |m: String| Err(ProtocolError::Frame(m));
    let (h, payload) = crate::split_frame(bytes)?;
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if h[5] != crate::FrameKind::Hidden as u8 || h[20] != DTYPE_F32 {
        return bad(format!("not hidden states: kind {} dtype {}", h[5], h[20]));
    }
    if h[6..8] != [0, 0] || h[21..24] != [0, 0, 0] || u32_at(16) != 0 {
        return bad("reserved header bytes are not zero".into());
    }
    let (rows, len) = (u64::from(u32_at(28)), u64::from(u32_at(32)));
    if len as usize != payload.len() || payload.len() > MAX_PAYLOAD {
        return bad(format!(
            "payload says {len} bytes, carries {} (at most {MAX_PAYLOAD})",
            payload.len()
        ));
    }
    if rows == 0 || rows * 4 * hidden as u64 != len {
        return bad(format!("{rows} rows of width {hidden} are not {len} bytes"));
    }
    if crc32fast::hash(payload) != u32_at(36) {
        return bad("checksum mismatch".into());
    }
    let mut step = [0u8; 8];
    step.copy_from_slice(&h[8..16]);
    let values = payload
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(HiddenRows {
        step: u64::from_le_bytes(step),
        first: u32_at(24),
        values,
    })
}

/// A step's hidden states put together from its frames, which may come in
/// any order; complete when every row of the step is there once.
#[derive(Debug)]
pub struct HiddenAssembly {
    hidden: usize,
    values: Vec<f32>,
    seen: Vec<bool>,
    missing: usize,
}

impl HiddenAssembly {
    /// For `rows` rows of width `hidden`.
    pub fn new(rows: usize, hidden: usize) -> Self {
        Self {
            hidden,
            values: vec![0.0; rows * hidden],
            seen: vec![false; rows],
            missing: rows,
        }
    }

    /// Adds a decoded frame; a frame past the step's rows or over rows
    /// already given is an error.
    pub fn add(&mut self, f: &HiddenRows) -> Result<(), String> {
        let first = f.first as usize;
        let rows = f.values.len() / self.hidden.max(1);
        let end = first + rows;
        if end > self.seen.len() || self.seen[first..end].iter().any(|&s| s) {
            return Err(format!(
                "rows {first}..{end} of a {}-row step came twice or past its end",
                self.seen.len()
            ));
        }
        self.values[first * self.hidden..end * self.hidden].copy_from_slice(&f.values);
        self.seen[first..end].iter_mut().for_each(|s| *s = true);
        self.missing -= rows;
        Ok(())
    }

    pub fn is_complete(&self) -> bool {
        self.missing == 0
    }

    /// The rows, once complete.
    pub fn finish(self) -> Result<Vec<f32>, String> {
        if self.missing > 0 {
            return Err(format!(
                "{} of {} rows never came",
                self.missing,
                self.seen.len()
            ));
        }
        Ok(self.values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_states_round_trip_through_frames_in_any_order() {
        let hidden = 576;
        let rows = 1000;
        let values: Vec<f32> = (0..rows * hidden).map(|i| i as f32 * 0.25 - 7.0).collect();
        let mut frames = hidden_frames(9, hidden, &values);
        assert!(frames.len() > 1, "a long prefill spans frames");
        assert!(frames.iter().all(|f| f.len() <= HEADER + MAX_PAYLOAD));
        frames.reverse();
        let mut a = HiddenAssembly::new(rows, hidden);
        for f in &frames {
            let d = decode_hidden(f, hidden).expect("decode");
            assert_eq!(d.step, 9);
            a.add(&d).expect("add");
        }
        assert!(a.is_complete());
        assert_eq!(a.finish().expect("rows"), values);
    }

    #[test]
    fn bad_hidden_frames_are_refused_and_rows_count_once() {
        let f = hidden_frames(1, 4, &[1.0; 8]).remove(0);
        assert!(decode_hidden(&f, 4).is_ok());
        assert!(decode_hidden(&f, 3).is_err(), "another width");
        assert!(decode_hidden(&f[..HEADER - 1], 4).is_err());
        for at in [0, 4, 5, 6, 16, 20, 21, 28, 32, 36, HEADER + 1] {
            let mut g = f.clone();
            g[at] ^= 0x40;
            assert!(decode_hidden(&g, 4).is_err(), "byte {at} flipped");
        }
        let d = decode_hidden(&f, 4).expect("decode");
        let mut a = HiddenAssembly::new(3, 4);
        a.add(&d).expect("rows 0..2");
        assert!(a.add(&d).is_err(), "the same rows twice");
        assert!(!a.is_complete());
        assert!(a.finish().is_err());
        let mut short = HiddenAssembly::new(1, 4);
        assert!(short.add(&d).is_err(), "past the end");
    }

    #[test]
    fn an_offer_fits_layers_next_to_their_kv() {
        let o = PartOffer {
            model: "m".into(),
            layers: 30,
            hidden: 576,
            layer_bytes: 1000,
            ends_bytes: 5000,
            kv_block_bytes: 10,
            memory_bytes: 20_000,
        };
        assert_eq!(o.fits(100, false), 10);
        assert_eq!(o.fits(100, true), 7);
        assert_eq!(o.fits(0, false), 20);
        assert_eq!(
            PartOffer {
                memory_bytes: u64::MAX,
                ..o.clone()
            }
            .fits(0, true),
            30
        );
    }
}
