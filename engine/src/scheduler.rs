//! Continuous-batching scheduler in the vLLM v1 shape: each step,
//! `schedule()` spends one token budget, running sequences first (a decode
//! token each, or the next prefill chunk), then admits waiting ones while
//! the budget and the running limit allow; `update()` takes the step's
//! logits, samples, and decides which sequences finished. Aborts are
//! applied between steps. This scheduler owns no model state: the executor
//! holds KV, the core drives both.

use std::collections::VecDeque;

use crate::model::{ModelBatch, SeqChunk};
use crate::request::{FinishReason, GenerateRequest, RequestId};
use crate::sampling::Sampler;

/// Limits that shape each step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences in the running batch.
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks plus decode tokens).
    pub max_num_batched_tokens: usize,
    /// Most requests waiting for admission; more are refused as overload.
    pub max_waiting: usize,
    /// Longest sequence (prompt plus output) the model may hold.
    pub max_model_len: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            max_waiting: 256,
            max_model_len: 2048,
        }
    }
}

/// A request inside the scheduler.
#[derive(Debug)]
pub struct Sequence {
    pub id: RequestId,
    pub req: GenerateRequest,
    pub output: Vec<u32>,
    /// Tokens whose KV the executor holds.
    pub num_computed: usize,
    pub sampler: Sampler,
    /// Tokens of this sequence that end generation (EOS ids and stop ids).
    pub stop_ids: Vec<u32>,
}

impl Sequence {
    pub fn new(id: RequestId, req: GenerateRequest, eos: &[u32]) -> Self {
        let mut stop_ids = req.params.stop_token_ids.clone();
        if !req.params.ignore_eos {
            stop_ids.extend_from_slice(eos);
        }
        let sampler = Sampler::new(&req.params);
        Self {
            id,
            req,
            output: Vec::new(),
            num_computed: 0,
            sampler,
            stop_ids,
        }
    }

    pub fn len(&self) -> usize {
        self.req.prompt_tokens.len() + self.output.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn token(&self, i: usize) -> u32 {
        let p = self.req.prompt_tokens.len();
        if i < p {
            self.req.prompt_tokens[i]
        } else {
            self.output[i - p]
        }
    }
}

/// What one step samples for one sequence, and whether that ended it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepToken {
    pub seq: RequestId,
    pub token: u32,
    pub finish: Option<FinishReason>,
}

/// The continuous-batching scheduler.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Queues a sequence, or gives it back when the waiting queue is full.
    pub fn add(&mut self, seq: Sequence) -> Result<(), Box<Sequence>> {
        if self.waiting.len() >= self.config.max_waiting {
            return Err(Box::new(seq));
        }
        self.waiting.push_back(seq);
        Ok(())
    }

    /// Removes a sequence wherever it is; returns it if it was known.
    pub fn abort(&mut self, id: RequestId) -> Option<Sequence> {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            return Some(self.running.remove(i));
        }
        let i = self.waiting.iter().position(|s| s.id == id)?;
        self.waiting.remove(i)
    }

    /// Plans the next step: running sequences first, then admissions.
    pub fn schedule(&mut self) -> ModelBatch {
        let mut budget = self.config.max_num_batched_tokens;
        let mut batch = ModelBatch::default();
        for seq in &self.running {
            if budget == 0 {
                break;
            }
            if let Some(chunk) = next_chunk(seq, budget) {
                budget -= chunk.tokens.len();
                batch.chunks.push(chunk);
            }
        }
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            if let Some(chunk) = next_chunk(&seq, budget) {
                budget -= chunk.tokens.len();
                batch.chunks.push(chunk);
            }
            self.running.push(seq);
        }
        batch
    }

    /// Applies a step's results: advances computed counts, samples from each
    /// logits row, and removes finished sequences (returned with the tokens).
    pub fn update(
        &mut self,
        batch: &ModelBatch,
        logits: &[Vec<f32>],
    ) -> (Vec<StepToken>, Vec<Sequence>) {
        let mut rows = logits.iter();
        let mut tokens = Vec::new();
        for chunk in &batch.chunks {
            let Some(seq) = self.running.iter_mut().find(|s| s.id == chunk.seq) else {
                continue;
            };
            seq.num_computed = chunk.start_pos + chunk.tokens.len();
            if !chunk.want_logits {
                continue;
            }
            let Some(row) = rows.next() else { break };
            let token = seq.sampler.sample(row);
            seq.output.push(token);
            let finish = finish_reason(seq, token, self.config.max_model_len);
            tokens.push(StepToken {
                seq: seq.id,
                token,
                finish,
            });
        }
        let mut finished = Vec::new();
        for t in tokens.iter().filter(|t| t.finish.is_some()) {
            if let Some(i) = self.running.iter().position(|s| s.id == t.seq) {
                finished.push(self.running.remove(i));
            }
        }
        (tokens, finished)
    }

    /// Removes every sequence (engine failure or shutdown).
    pub fn drain(&mut self) -> Vec<Sequence> {
        let mut all: Vec<Sequence> = self.running.drain(..).collect();
        all.extend(self.waiting.drain(..));
        all
    }

    /// Removes the sequences of a failed step.
    pub fn fail(&mut self, batch: &ModelBatch) -> Vec<Sequence> {
        batch
            .chunks
            .iter()
            .filter_map(|c| self.abort(c.seq))
            .collect()
    }
}

/// Whether `token`, just appended to `seq`, ends it.
fn finish_reason(seq: &Sequence, token: u32, max_model_len: usize) -> Option<FinishReason> {
    if seq.stop_ids.contains(&token) {
        Some(FinishReason::Stop)
    } else if seq.output.len() >= seq.req.params.max_tokens || seq.len() >= max_model_len {
        Some(FinishReason::Length)
    } else {
        None
    }
}

/// The next chunk a sequence computes within `budget` tokens, if any.
fn next_chunk(seq: &Sequence, budget: usize) -> Option<SeqChunk> {
    let len = seq.len();
    let start = seq.num_computed;
    if start >= len || budget == 0 {
        return None;
    }
    let end = len.min(start + budget);
    Some(SeqChunk {
        seq: seq.id,
        tokens: (start..end).map(|i| seq.token(i)).collect(),
        start_pos: start,
        want_logits: end == len,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::request::SamplingParams;

    const VOCAB: usize = 50;
    const EOS: u32 = 0;

    fn seq(id: u64, prompt_len: usize, max_tokens: usize) -> Sequence {
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(id),
            max_tokens,
            ..Default::default()
        };
        let req = GenerateRequest {
            prompt_tokens: (0..prompt_len as u32).map(|i| 1 + i % 40).collect(),
            params,
        };
        Sequence::new(RequestId(id), req, &[EOS])
    }

    /// Checks one planned step against the scheduler's limits and the
    /// sequences' computed counts.
    fn check_step(s: &Scheduler, batch: &ModelBatch, computed: &HashMap<RequestId, usize>) {
        assert!(
            batch.num_tokens() <= s.config.max_num_batched_tokens,
            "token budget exceeded"
        );
        assert!(s.running.len() <= s.config.max_num_seqs, "too many running");
        assert!(
            s.waiting.len() <= s.config.max_waiting,
            "waiting queue overflow"
        );
        let mut seen = HashSet::new();
        for c in &batch.chunks {
            assert!(seen.insert(c.seq), "{} scheduled twice in one step", c.seq);
            assert!(!c.tokens.is_empty());
            let seq = s
                .running
                .iter()
                .find(|q| q.id == c.seq)
                .expect("scheduled sequences are running");
            assert_eq!(
                c.start_pos,
                computed.get(&c.seq).copied().unwrap_or(0),
                "chunk does not continue the KV"
            );
            assert_eq!(c.want_logits, c.start_pos + c.tokens.len() == seq.len());
        }
    }

    #[test]
    fn random_workloads_keep_the_invariants_and_finish_every_request() {
        for seed in 0..40u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let config = SchedulerConfig {
                max_num_seqs: rng.random_range(1..6),
                max_num_batched_tokens: rng.random_range(1..64),
                max_waiting: rng.random_range(1..8),
                max_model_len: 200,
            };
            let mut s = Scheduler::new(config);
            let mut computed: HashMap<RequestId, usize> = HashMap::new();
            let mut live: HashSet<RequestId> = HashSet::new();
            let mut next_id = 0u64;
            for _ in 0..400 {
                match rng.random_range(0..10) {
                    0..=2 => {
                        next_id += 1;
                        let sq = seq(next_id, rng.random_range(1..80), rng.random_range(1..40));
                        if s.add(sq).is_ok() {
                            live.insert(RequestId(next_id));
                        }
                    }
                    3 if !live.is_empty() => {
                        let id = *live
                            .iter()
                            .nth(rng.random_range(0..live.len()))
                            .expect("non-empty");
                        assert!(
                            s.abort(id).is_some(),
                            "live request unknown to the scheduler"
                        );
                        live.remove(&id);
                        computed.remove(&id);
                    }
                    _ => step(&mut s, &mut rng, &mut computed, &mut live),
                }
            }
            // With no new work, everything drains within a bounded number of steps.
            for _ in 0..10_000 {
                if !s.has_work() {
                    break;
                }
                step(&mut s, &mut rng, &mut computed, &mut live);
            }
            assert!(
                !s.has_work() && live.is_empty(),
                "seed {seed}: requests never finished"
            );
        }
    }

    fn step(
        s: &mut Scheduler,
        rng: &mut StdRng,
        computed: &mut HashMap<RequestId, usize>,
        live: &mut HashSet<RequestId>,
    ) {
        let batch = s.schedule();
        check_step(s, &batch, computed);
        let logits: Vec<Vec<f32>> = batch
            .chunks
            .iter()
            .filter(|c| c.want_logits)
            .map(|_| (0..VOCAB).map(|_| rng.random_range(-1.0..1.0)).collect())
            .collect();
        let (tokens, finished) = s.update(&batch, &logits);
        assert_eq!(
            tokens.len(),
            logits.len(),
            "one sampled token per logits row"
        );
        for c in &batch.chunks {
            computed.insert(c.seq, c.start_pos + c.tokens.len());
        }
        for f in &finished {
            assert!(f.output.len() <= f.req.params.max_tokens);
            let last = *f.output.last().expect("finished sequences sampled a token");
            assert!(last == EOS || f.output.len() == f.req.params.max_tokens || f.len() >= 200);
            assert!(
                live.remove(&f.id),
                "{} finished twice or was never added",
                f.id
            );
            computed.remove(&f.id);
        }
    }

    #[test]
    fn running_sequences_are_scheduled_before_waiting_ones() {
        let mut s = Scheduler::new(SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 10,
            max_waiting: 8,
            max_model_len: 100,
        });
        s.add(seq(1, 8, 5)).expect("room");
        let first = s.schedule();
        assert_eq!(first.chunks.len(), 1);
        s.update(&first, &[vec![-100.0, 100.0]]);
        s.add(seq(2, 30, 5)).expect("room");
        let second = s.schedule();
        assert_eq!(
            second.chunks[0].seq,
            RequestId(1),
            "the running decode goes first"
        );
        assert_eq!(second.chunks[0].tokens.len(), 1);
        assert_eq!(
            second.chunks[1].tokens.len(),
            9,
            "the new prompt gets the rest of the budget"
        );
        assert!(!second.chunks[1].want_logits);
    }
}
