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
