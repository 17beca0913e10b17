//! A split's KV as a stream of binary frames (`docs/fleet-protocol.md`,
//! "KV transfer"): the prefill side cuts each layer's rows into frames of
//! at most `MAX_PAYLOAD` bytes (`frames_of`) and ends with the SHA-256 of
//! every payload in order (`KvDigest`); the decode side (`KvAssembly`)
//! checks each frame as it comes (checksum and geometry by `decode_frame`,
//! then its transfer and the next position of its layer), gathers them,
//! and at the end checks the coverage and the digest. Frames arrive from
//! the network, relayed from another provider's worker: any doubt (a bad
//! frame, a wrong digest, a short layer) refuses the whole transfer, and
//! the decode side recomputes the prompt.

use sha2::{Digest, Sha256};

use crate::{HEADER, MAX_PAYLOAD, ServedModel, decode_frame, encode_frame};

/// Positions `first..first + count` of every layer: per layer, the keys
/// of every position, then the values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSpan {
    pub first: usize,
    pub count: usize,
    pub layers: Vec<Vec<u8>>,
}

/// `span`'s rows as frames: per layer, runs of positions whose keys and
/// values fit one payload.
pub fn frames_of(transfer: u64, first: usize, count: usize, layers: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (layer, bytes) in layers.iter().enumerate() {
        let (k, v) = bytes.split_at(bytes.len() / 2);
        let per = k.len() / count.max(1);
        let step = (MAX_PAYLOAD / (2 * per.max(1))).max(1);
        let mut at = 0;
        while at < count {
            let n = step.min(count - at);
            let mut payload = Vec::with_capacity(2 * n * per);
            payload.extend_from_slice(&k[at * per..(at + n) * per]);
            payload.extend_from_slice(&v[at * per..(at + n) * per]);
            let pos = (first + at) as u32;
            out.push(encode_frame(
                transfer,
                layer as u32,
                pos,
                n as u32,
                &payload,
            ));
            at += n;
        }
    }
    out
}

/// The digest a transfer ends with: SHA-256 over every frame's payload, in
/// the order sent, as lowercase hex.
#[derive(Debug, Clone, Default)]
pub struct KvDigest(Sha256);

impl KvDigest {
    /// Adds a frame as sent (header and payload).
    pub fn frame(&mut self, frame: &[u8]) {
        self.0.update(frame.get(HEADER..).unwrap_or_default());
    }

    pub fn hex(self) -> String {
        hex(&self.0.finalize())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The KV of a transfer arriving at the decode side.
#[derive(Debug)]
pub struct KvAssembly {
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

impl KvAssembly {
    /// Expects transfer `transfer` of a model of `model`'s geometry, from
    /// position `from`.
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
        let (h, payload) = decode_frame(frame, &self.model).map_err(|e| e.to_string())?;
        let layer = h.layer as usize;
        let next = self.next.get(layer).copied();
        if h.transfer != self.transfer || next != Some(h.first_token as usize) {
            return Err(format!(
                "frame of transfer {} at position {} of layer {layer}, expected {} at {next:?}",
                h.transfer, h.first_token, self.transfer
            ));
        }
        let (k, v) = payload.split_at(payload.len() / 2);
        self.keys[layer].extend_from_slice(k);
        self.values[layer].extend_from_slice(v);
        self.next[layer] += h.tokens as usize;
        self.hasher.update(payload);
        Ok(())
    }

    /// The verified rows, given the prefill side's end (`tokens`
    /// positions, its digest) for a prompt of `prompt_len` tokens; why
    /// not otherwise.
    pub fn finish(self, tokens: u32, digest: &str, prompt_len: usize) -> Result<KvSpan, String> {
        if let Some(d) = self.doubt {
            return Err(d);
        }
        let end = self.from.checked_add(tokens as usize);
        if end != Some(prompt_len) {
            return Err(format!(
                "{tokens} positions from {} do not reach the prompt's end {prompt_len}",
                self.from
            ));
        }
        if let Some(l) = self.next.iter().position(|&n| n != prompt_len) {
            return Err(format!(
                "layer {l} stopped at {} of {prompt_len}",
                self.next[l]
            ));
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
        Ok(KvSpan {
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

    /// Bytes of one position of one layer: K and V, 2 heads of 4 f16.
    const PER: usize = 2 * 2 * 4 * 2;

    /// Rows of positions `first..first + count` with recognisable bytes.
    fn rows(first: usize, count: usize) -> KvSpan {
        KvSpan {
            first,
            count,
            layers: (0..2)
                .map(|l| (0..count * PER).map(|i| (i * 7 + l * 3) as u8).collect())
                .collect(),
        }
    }

    fn frames(transfer: u64, r: &KvSpan) -> Vec<Vec<u8>> {
        frames_of(transfer, r.first, r.count, &r.layers)
    }

    fn digest_of(frames: &[Vec<u8>]) -> String {
        let mut d = KvDigest::default();
        frames.iter().for_each(|f| d.frame(f));
        d.hex()
    }

    /// Consecutive spans as one: per layer, every span's keys, then every
    /// span's values.
    fn concat(parts: &[KvSpan]) -> KvSpan {
        let layers = (0..2)
            .map(|l| {
                let halves = |second: bool| {
                    parts.iter().flat_map(move |p| {
                        let (k, v) = p.layers[l].split_at(p.layers[l].len() / 2);
                        if second { v } else { k }.iter().copied()
                    })
                };
                halves(false).chain(halves(true)).collect()
            })
            .collect();
        KvSpan {
            first: parts[0].first,
            count: parts.iter().map(|p| p.count).sum(),
            layers,
        }
    }

    #[test]
    fn frames_stream_in_chunks_and_reassemble_to_the_rows() {
        let parts = [rows(32, 10), rows(42, 20), rows(62, 5)];
        let frames: Vec<Vec<u8>> = parts.iter().flat_map(|r| frames(9, r)).collect();
        assert_eq!(frames.len(), 6, "one frame per layer per chunk");
        let payload: usize = frames.iter().map(|f| f.len() - HEADER).sum();
        assert_eq!(
            payload,
            2 * 35 * 2 * 2 * 4 * 2,
            "layers x tokens x K,V x heads x dims x f16"
        );
        let mut inc = KvAssembly::new(9, model(), 32);
        frames.iter().for_each(|f| inc.push(f));
        let got = inc.finish(35, &digest_of(&frames), 67).expect("verified");
        assert_eq!(got, concat(&parts));
    }

    #[test]
    fn any_doubt_refuses_the_whole_transfer() {
        let frames_40 = frames(9, &rows(0, 40));
        let digest = digest_of(&frames_40);
        let verify = |fs: &[Vec<u8>], tokens: u32, digest: &str, from: usize| {
            let mut inc = KvAssembly::new(9, model(), from);
            fs.iter().for_each(|f| inc.push(f));
            inc.finish(tokens, digest, 40)
        };
        assert!(verify(&frames_40, 40, &digest, 0).is_ok());
        let mut bad = frames_40.clone();
        let last = bad[1].len() - 1;
        bad[1][last] ^= 1;
        assert!(matches!(verify(&bad, 40, &digest, 0), Err(e) if e.contains("checksum")));
        assert!(
            verify(&frames_40[..1], 40, &digest, 0).is_err(),
            "a layer missing"
        );
        let zeros = "0".repeat(64);
        assert!(matches!(verify(&frames_40, 40, &zeros, 0), Err(e) if e.contains("digest")));
        assert!(
            verify(&frames_40, 39, &digest, 0).is_err(),
            "short of the prompt"
        );
        assert!(
            verify(&frames_40, 40, &digest, 8).is_err(),
            "not where it was asked"
        );
        let mut swapped = frames_40.clone();
        swapped.swap(0, 1);
        assert!(
            verify(&swapped, 40, &digest, 0).is_err(),
            "digest is over the order"
        );
        let other = frames(10, &rows(0, 40));
        assert!(
            verify(&other, 40, &digest_of(&other), 0).is_err(),
            "another transfer"
        );
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
        let r = KvSpan {
            first: 0,
            count: 600,
            layers: vec![(0..600 * per).map(|i| i as u8).collect()],
        };
        let frames = frames(1, &r);
        assert!(frames.len() > 1);
        assert!(frames.iter().all(|f| f.len() - HEADER <= MAX_PAYLOAD));
        let mut inc = KvAssembly::new(1, m, 0);
        frames.iter().for_each(|f| inc.push(f));
        assert_eq!(inc.finish(600, &digest_of(&frames), 600), Ok(r));
    }

    #[test]
    fn an_end_past_every_position_is_refused_not_overflowed() {
        let inc = KvAssembly::new(1, model(), usize::MAX);
        assert!(inc.finish(u32::MAX, "", 0).is_err());
    }
}
