//! A stage step both ways in one place: the engine's batch and sampling
//! as the wire's `StageChunk` and `StageSampling` (the server's side), and
//! back (the worker's side), so a remote last stage draws exactly the
//! token the server's own sampler would. A round trip pins it below.

use engine::model::SeqChunk;
use engine::request::RequestId;
use engine::sampling::{OwnedSampling, PenaltyState, RowSampling, SamplingSpec, TokenMask};

use crate::stage::{StageChunk, StageSampling};

impl StageChunk {
    /// The wire form of one chunk of a batch.
    pub fn of(c: &SeqChunk) -> Self {
        Self {
            seq: c.seq.0,
            tokens: c.tokens.clone(),
            start: u32::try_from(c.start_pos).unwrap_or(u32::MAX),
            logits: u32::try_from(c.num_logits()).unwrap_or(u32::MAX),
            draft: c.draft.clone(),
            blocks: c.block_table.clone(),
        }
    }

    /// The engine's chunk (a chunk wants logits for its last `draft + 1`
    /// positions or none: another count is refused).
    pub fn chunk(&self) -> Result<SeqChunk, String> {
        let want = self.logits > 0;
        if want && self.logits as usize != self.draft.len() + 1 {
            return Err(format!(
                "{} logits rows for a chunk with {} drafts",
                self.logits,
                self.draft.len()
            ));
        }
        if self.draft.len() >= self.tokens.len().max(1) {
            return Err("a chunk's drafts must follow at least one token".into());
        }
        Ok(SeqChunk {
            seq: RequestId(self.seq),
            tokens: self.tokens.clone(),
            start_pos: self.start as usize,
            want_logits: want,
            block_table: self.blocks.clone(),
            swa_table: Vec::new(),
            draft: self.draft.clone(),
        })
    }
}

impl StageSampling {
    /// The wire form of a chunk's sampling.
    pub fn of(s: &RowSampling<'_>) -> Self {
        let spec = s.spec;
        Self {
            temperature: spec.temperature,
            top_p: spec.top_p,
            top_k: u32::try_from(spec.top_k).unwrap_or(u32::MAX),
            min_p: spec.min_p,
            repetition_penalty: spec.repetition_penalty,
            frequency_penalty: spec.frequency_penalty,
            presence_penalty: spec.presence_penalty,
            logit_bias: spec.logit_bias.clone(),
            logprobs: spec.logprobs.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            seed: spec.seed,
            position: s.position,
            penalties: s.penalties.map(PenaltyState::to_parts),
            allowed: s.allowed.map(|m| m.words().to_vec()),
        }
    }

    /// The sampling the server resolved, owned.
    pub fn owned(&self) -> OwnedSampling {
        OwnedSampling {
            spec: SamplingSpec {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k as usize,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                frequency_penalty: self.frequency_penalty,
                presence_penalty: self.presence_penalty,
                logit_bias: self.logit_bias.clone(),
                logprobs: self.logprobs.map(|n| n as usize),
                seed: self.seed,
            },
            position: self.position,
            penalties: self
                .penalties
                .as_ref()
                .map(|(counts, prompt)| PenaltyState::from_parts(counts, prompt)),
            allowed: self.allowed.clone().map(TokenMask::from_words),
        }
    }
}

#[cfg(test)]
mod tests {
    use engine::SamplingParams;

    use super::*;

    #[test]
    fn a_chunk_and_its_sampling_come_back_as_they_went() {
        let spec = SamplingSpec::new(&SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            seed: Some(11),
            repetition_penalty: 1.2,
            frequency_penalty: 0.5,
            logit_bias: vec![(3, -1.5)],
            logprobs: Some(2),
            ..Default::default()
        });
        let mut pen = PenaltyState::new(&spec, &[5, 6, 7]);
        pen.push(9);
        pen.push(9);
        let mask = TokenMask::from_fn(130, |t| t % 3 == 0);
        let row = RowSampling {
            spec: &spec,
            position: 17,
            penalties: Some(&pen),
            allowed: Some(&mask),
        };
        let wire = StageSampling::of(&row);
        let json = serde_json::to_string(&wire).expect("json");
        let back: StageSampling = serde_json::from_str(&json).expect("decode");
        let owned = back.owned();
        assert_eq!(owned.spec, spec);
        assert_eq!(owned.position, 17);
        assert_eq!(owned.penalties.as_ref(), Some(&pen));
        assert_eq!(owned.allowed.as_ref(), Some(&mask));
        let chunk = SeqChunk {
            seq: RequestId(4),
            tokens: vec![1, 2, 3],
            start_pos: 8,
            want_logits: true,
            block_table: vec![0, 5],
            swa_table: Vec::new(),
            draft: vec![3],
        };
        let c = StageChunk::of(&chunk).chunk().expect("chunk");
        assert_eq!(
            (
                c.seq,
                c.tokens,
                c.start_pos,
                c.want_logits,
                c.block_table,
                c.draft
            ),
            (RequestId(4), vec![1, 2, 3], 8, true, vec![0, 5], vec![3])
        );
        let bad = StageChunk {
            logits: 5,
            ..StageChunk::of(&chunk)
        };
        assert!(bad.chunk().is_err());
    }
}
