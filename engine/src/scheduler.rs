//! Continuous-batching scheduler in the vLLM v1 shape: each step,
//! `schedule()` spends one token budget, running sequences first (a decode
//! token each, or the next prefill chunk), then admits waiting ones while
//! the budget, the running limit and the KV blocks allow (under a time
//! target, a step that decodes carries only the prefill tokens that
//! `StepBudget` says fit); `sampling()`
//! says how the executor samples each chunk (with structured output's
//! token masks from `masks()`); `update()` takes the sampled tokens and
//! decides which sequences finished.
//!
//! Prefill is shared fairly between tenants (`SamplingParams::tenant`, an
//! API key): decodes go first, then the step's prefill tokens go, a chunk
//! at a time, to the prompt (running or waiting) of the tenant served the
//! fewest prefill tokens so far (within a priority), so one tenant's
//! near-context prompts cannot make another's short request wait for all
//! of them (deficit round robin over prefill tokens; a tenant that comes
//! back starts just ahead of the least served one present).
//!
//! The scheduler owns the block tables (`KvManager`): a new sequence starts
//! from its longest cached prefix, every chunk is backed by blocks before it
//! runs, and when blocks run out the most recently admitted running
//! sequence is preempted (its blocks freed, to be recomputed later) rather
//! than failing or stalling. Aborts are applied between steps.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::constraint::Constraint;
use crate::kv_cache::transfer::KvRows;
use crate::kv_cache::{HOLE, KvManager};
use crate::model::{ModelBatch, SeqChunk};
use crate::request::{FinishReason, GenerateRequest, RequestId, SamplingParams, TokenLogprob};
use crate::sampling::{PenaltyState, RowSampling, Sampled, SamplingSpec, TokenMask};
use crate::step_budget::StepBudget;

/// The fewest prefill tokens a decoding step carries under a time budget
/// (one KV block), so prompts progress however slow decoding is.
const MIN_PREFILL_CHUNK: usize = 16;

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
    /// Prompt-lookup speculative decoding: draft tokens per step (0 = off).
    pub num_speculative_tokens: usize,
    /// Longest n-gram matched when looking up drafts (down to 1).
    pub spec_ngram_max: usize,
    /// A step that decodes carries only the prefill tokens that keep it
    /// under this time (`StepBudget`); `None`: the token budget alone.
    pub step_target: Option<Duration>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 16,
            max_num_batched_tokens: 256,
            max_waiting: 256,
            max_model_len: 2048,
            num_speculative_tokens: 0,
            spec_ngram_max: 3,
            step_target: None,
        }
    }
}

/// A request inside the scheduler.
#[derive(Debug)]
pub struct Sequence {
    pub id: RequestId,
    pub params: SamplingParams,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose KV is computed (in this sequence's blocks).
    pub num_computed: usize,
    /// Prompt tokens served from the prefix cache at first admission.
    pub num_cached_tokens: Option<usize>,
    /// How its tokens are drawn (the same on every executor).
    pub sampling: SamplingSpec,
    /// The tokens its penalties look at (`None` without penalties).
    pub penalties: Option<PenaltyState>,
    /// Structured output: the matcher and the token that ends the output.
    pub constraint: Option<(Constraint, u32)>,
    /// Tokens of this sequence that end generation (EOS ids and stop ids).
    pub stop_ids: Vec<u32>,
    /// For the 2nd..nth choice of a request: the first choice, whose prompt
    /// blocks this one waits for so it can share them instead of recomputing.
    pub wait_for: Option<RequestId>,
    /// With split stages: its KV has moved to the decode executor (set
    /// when its prefill is done, cleared when it is preempted).
    pub on_decoder: bool,
    /// KV computed elsewhere for some of its prompt (a prefill worker's):
    /// taken at admission when it starts where the prefix cache ends.
    pub imported: Option<KvRows>,
    /// Its prompt's KV rows are exported from this position on (to a
    /// decode worker): its sliding-window blocks from there are kept.
    pub export_from: Option<usize>,
    /// It runs on imported KV: its blocks are never offered to the prefix
    /// cache, so what another worker computed serves only this request
    /// (a failed check on cached blocks is always this engine's own).
    pub foreign: bool,
}

impl Sequence {
    pub fn new(id: RequestId, req: GenerateRequest, eos: &[u32]) -> Self {
        let mut stop_ids = req.params.stop_token_ids.clone();
        if !req.params.ignore_eos {
            stop_ids.extend_from_slice(eos);
        }
        let sampling = SamplingSpec::new(&req.params);
        let penalties = sampling
            .penalized()
            .then(|| PenaltyState::new(&sampling, &req.prompt_tokens));
        let prompt_len = req.prompt_tokens.len();
        Self {
            id,
            params: req.params,
            tokens: req.prompt_tokens,
            prompt_len,
            num_computed: 0,
            num_cached_tokens: None,
            sampling,
            penalties,
            constraint: None,
            stop_ids,
            wait_for: None,
            on_decoder: false,
            imported: None,
            export_from: None,
            foreign: false,
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Scheduling order: priority first, then arrival.
    fn order(&self) -> (i32, RequestId) {
        (self.params.priority, self.id)
    }

    /// Takes `tokens` as already generated (before any step runs): they
    /// count for positions, penalties and `max_tokens` as its own would.
    pub fn resume(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        if let Some(p) = &mut self.penalties {
            tokens.iter().for_each(|&t| p.push(t));
        }
    }

    /// Generated tokens so far.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

/// What one step samples for one sequence, and whether that ended it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepToken {
    pub seq: RequestId,
    pub token: u32,
    pub logprob: Option<TokenLogprob>,
    pub finish: Option<FinishReason>,
}

/// The continuous-batching scheduler.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Sequences preempted so far.
    pub preemptions: u64,
    /// Speculative draft tokens proposed and accepted so far.
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    /// Prefill and decode run on different executors: blocks computed
    /// while decoding live on the decode executor only, so they are not
    /// offered to the prefix cache (a later prefill could not read them).
    split: bool,
    /// Imported KV to write before this step runs (`take_fills`).
    fills: Vec<Fill>,
    /// Why each import admitted this step was not used (`take_refusals`).
    refusals: Vec<(RequestId, &'static str)>,
    /// Sequences admitted on imported KV, and those whose import was
    /// refused (recomputed instead).
    pub imports_used: u64,
    pub imports_refused: u64,
    /// Imports that failed the recomputation check (`import_check`).
    pub imports_forged: u64,
    /// Prefill tokens per decoding step by time (`config.step_target`).
    budget: Option<StepBudget>,
    /// Prefill tokens each present tenant's prompts were given.
    served: HashMap<u64, u64>,
}

/// Imported KV rows to write into a sequence's blocks, from position
/// `from` on.
#[derive(Debug)]
pub struct Fill {
    pub seq: RequestId,
    pub rows: KvRows,
    pub from: usize,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, kv: KvManager) -> Self {
        let budget = config
            .step_target
            .filter(|t| !t.is_zero())
            .map(|t| StepBudget::new(t, MIN_PREFILL_CHUNK));
        Self {
            budget,
            config,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
            spec_proposed: 0,
            spec_accepted: 0,
            split: false,
            fills: Vec::new(),
            refusals: Vec::new(),
            imports_used: 0,
            imports_refused: 0,
            imports_forged: 0,
            served: HashMap::new(),
        }
    }

    /// Imported KV the coming step's sequences start from: the caller
    /// writes each into the sequence's blocks before running the step.
    pub fn take_fills(&mut self) -> Vec<Fill> {
        std::mem::take(&mut self.fills)
    }

    /// The sequences admitted this step whose imported KV was refused
    /// (they recompute it), each with the reason.
    pub fn take_refusals(&mut self) -> Vec<(RequestId, &'static str)> {
        std::mem::take(&mut self.refusals)
    }

    /// The tokens of running sequence `id`.
    pub fn tokens_of(&self, id: RequestId) -> Option<&[u32]> {
        self.running
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.tokens.as_slice())
    }

    /// The import of running sequence `id` failed its check: it computes
    /// its prompt itself from `from` (where its own cached prefix ends),
    /// starting next step.
    pub fn refuse_fill(&mut self, id: RequestId, from: usize) {
        if let Some(seq) = self.running.iter_mut().find(|s| s.id == id) {
            seq.num_computed = from;
            seq.foreign = false;
            self.imports_used = self.imports_used.saturating_sub(1);
            self.imports_forged += 1;
        }
    }

    /// Blocks for `positions` positions of a scratch sequence `id` (one
    /// the engine runs outside the batch: a spot check's scoring; its full
    /// and sliding tables), or
    /// `None` when the pool has no room; free them with `free_scratch`.
    pub fn scratch(&mut self, id: RequestId, positions: usize) -> Option<(Vec<u32>, Vec<u32>)> {
        if self.kv.allocate(id, positions) {
            Some((self.kv.table(id).to_vec(), self.kv.swa_table(id).to_vec()))
        } else {
            self.kv.free(id);
            None
        }
    }

    pub fn free_scratch(&mut self, id: RequestId) {
        self.kv.free(id);
    }

    /// The prompt tokens of `tokens` the prefix cache holds now.
    pub fn cached_prefix(&self, tokens: &[u32]) -> usize {
        self.kv.cached_prefix(tokens)
    }

    /// Prefill on one executor, decode on another (see `split`).
    pub fn with_split_stages(mut self) -> Self {
        self.split = true;
        self
    }

    /// Whether `id`'s KV is on the decode executor.
    pub fn on_decoder(&self, id: RequestId) -> bool {
        self.running.iter().any(|s| s.id == id && s.on_decoder)
    }

    /// Running sequences whose prefill is done but whose KV is still on the
    /// prefill executor, with the blocks that hold their computed
    /// positions (both groups' where sliding layers keep their own); each
    /// is marked as moved (the caller moves the blocks).
    pub fn take_prefilled(&mut self) -> Vec<(RequestId, Vec<u32>)> {
        let bs = self.kv.block_size();
        let mut out = Vec::new();
        for s in self.running.iter_mut().filter(|s| !s.on_decoder) {
            if s.output().is_empty() || s.num_computed + 1 < s.len() {
                continue;
            }
            s.on_decoder = true;
            let (full, swa) = (self.kv.table(s.id), self.kv.swa_table(s.id));
            let n = s.num_computed.div_ceil(bs).min(full.len());
            let live = swa.iter().take(n).filter(|&&b| b != HOLE);
            out.push((s.id, full[..n].iter().chain(live).copied().collect()));
        }
        out
    }

    pub fn kv(&self) -> &KvManager {
        &self.kv
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
        self.enqueue(seq);
        Ok(())
    }

    /// Inserts into the waiting queue in (priority, arrival) order.
    fn enqueue(&mut self, seq: Sequence) {
        let key = seq.order();
        let at = self.waiting.partition_point(|w| w.order() <= key);
        self.waiting.insert(at, seq);
    }

    /// Removes a sequence wherever it is (freeing its blocks).
    pub fn abort(&mut self, id: RequestId) -> Option<Sequence> {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i)?
        };
        self.kv.free(id);
        Some(seq)
    }

    /// Plans the next step: decodes of running sequences first, then the
    /// prefill tokens, shared between tenants (`prefill_fairly`).
    pub fn schedule(&mut self) -> ModelBatch {
        self.settle_tenants();
        let mut budget = self.config.max_num_batched_tokens;
        let prefill = self.prefill_allowance();
        let mut batch = ModelBatch::default();
        let mut preempted = false;
        let mut prompts = Vec::new();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            if seq.len() - seq.num_computed > 1 {
                prompts.push(seq.id);
                i += 1;
                continue;
            }
            let draft = self.draft_for(seq, budget - 1);
            let (id, end) = (seq.id, seq.num_computed + 1 + draft.len());
            self.kv.slide(id, seq.num_computed);
            if self.kv.allocate(id, end) {
                budget -= 1 + draft.len();
                self.spec_proposed += draft.len() as u64;
                batch.chunks.push(self.chunk(i, 1, draft));
                i += 1;
                continue;
            }
            // Out of blocks: preempt the least urgent sequence not yet
            // scheduled this step (lowest priority, then newest).
            preempted = true;
            let victim = (i..self.running.len())
                .max_by_key(|&j| self.running[j].order())
                .unwrap_or(i);
            self.preempt(victim);
            // If that was this very sequence, it waits with the rest.
        }
        let mut room = budget.min(prefill);
        self.prefill_fairly(&prompts, &mut room, !preempted, &mut batch);
        batch
    }

    /// Forgets tenants with nothing here; a tenant new here starts just
    /// ahead of the least served one present (a tie would go to the
    /// earlier arrival: the tenant already here).
    fn settle_tenants(&mut self) {
        let present: std::collections::HashSet<u64> = self
            .running
            .iter()
            .chain(&self.waiting)
            .map(|s| s.params.tenant)
            .collect();
        self.served.retain(|t, _| present.contains(t));
        let floor = self.served.values().copied().min().unwrap_or(1);
        let floor = floor.saturating_sub(1);
        for t in present {
            self.served.entry(t).or_insert(floor);
        }
    }

    /// Where a prompt stands for the next prefill chunk: its priority, its
    /// tenant's prefill tokens so far, its arrival.
    fn rank(&self, seq: &Sequence) -> (i32, u64, RequestId) {
        let served = self.served.get(&seq.params.tenant).copied().unwrap_or(0);
        (seq.params.priority, served, seq.id)
    }

    /// Gives `room` prefill tokens, a chunk at a time, to the best ranked
    /// prompt: a running one still prefilling (`prompts`), or a waiting one
    /// admitted (only if `admit`: no preemption this step, a free slot and
    /// blocks). A running prompt that finds no blocks preempts the least
    /// urgent sequence not yet in the step.
    fn prefill_fairly(
        &mut self,
        prompts: &[RequestId],
        room: &mut usize,
        mut admit: bool,
        batch: &mut ModelBatch,
    ) {
        let mut prompts: Vec<RequestId> = prompts.to_vec();
        while *room > 0 {
            let running = prompts
                .iter()
                .filter_map(|id| self.running.iter().position(|s| s.id == *id))
                .min_by_key(|&i| self.rank(&self.running[i]));
            let waiting = (admit && self.running.len() < self.config.max_num_seqs)
                .then(|| self.next_waiting())
                .flatten();
            let take_waiting = match (running, waiting) {
                (Some(r), Some(w)) => self.rank(&self.waiting[w]) < self.rank(&self.running[r]),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (None, None) => break,
            };
            if take_waiting {
                let Some(w) = waiting else { break };
                if !self.admit_one(w, room, batch) {
                    admit = false;
                }
                continue;
            }
            let Some(i) = running else { break };
            let seq = &self.running[i];
            let (id, tenant) = (seq.id, seq.params.tenant);
            let n = (seq.len() - seq.num_computed).min(*room);
            prompts.retain(|p| *p != id);
            self.kv.slide(id, seq.num_computed);
            if self.kv.allocate(id, seq.num_computed + n) {
                *room -= n;
                *self.served.entry(tenant).or_default() += n as u64;
                batch.chunks.push(self.chunk(i, n, Vec::new()));
                continue;
            }
            admit = false;
            let in_step = |s: &Sequence| batch.chunks.iter().any(|c| c.seq == s.id);
            let victim = (0..self.running.len())
                .filter(|&j| !in_step(&self.running[j]))
                .max_by_key(|&j| self.running[j].order());
            if let Some(v) = victim {
                self.preempt(v);
                if self.running.iter().any(|s| s.id == id) {
                    prompts.push(id);
                }
            }
        }
    }

    /// The waiting sequence to admit next: the best ranked one that is not
    /// waiting for a sibling's prompt.
    fn next_waiting(&self) -> Option<usize> {
        (0..self.waiting.len())
            .filter(|&i| self.waiting[i].wait_for.is_none_or(|p| !self.prefilling(p)))
            .min_by_key(|&i| self.rank(&self.waiting[i]))
    }

    /// Prefill tokens the coming step may carry: all of the token budget,
    /// or under a time budget, what fits beside the sequences decoding.
    fn prefill_allowance(&self) -> usize {
        let max = self.config.max_num_batched_tokens;
        let Some(b) = &self.budget else {
            return max;
        };
        let decoding = self
            .running
            .iter()
            .filter(|s| s.len() - s.num_computed == 1)
            .count();
        b.prefill_tokens(decoding, max)
    }

    /// Records how long `batch` took, for the time budget, and logs the
    /// step's shape and time at debug level (`RUST_LOG=engine::scheduler=debug`:
    /// one line per step, to see how a load is batched).
    pub fn observe_step(&mut self, batch: &ModelBatch, took: Duration) {
        let (mut decodes, mut prefill) = (0, 0);
        for c in &batch.chunks {
            match c.tokens.len() - c.draft.len() {
                1 => decodes += c.tokens.len(),
                n => prefill += n,
            }
        }
        tracing::debug!(
            decodes,
            prefill,
            waiting = self.waiting.len(),
            ms = took.as_secs_f64() * 1e3,
            "step"
        );
        let Some(b) = &mut self.budget else {
            return;
        };
        b.observe(decodes, prefill, took);
    }

    /// Prompt-lookup drafts for a decoding sequence: the tokens that followed
    /// the latest earlier occurrence of its last n-gram (longest first),
    /// capped so they never pass `max_tokens` or the context.
    fn draft_for(&self, seq: &Sequence, budget: usize) -> Vec<u32> {
        let c = &self.config;
        let room_out = seq.params.max_tokens.saturating_sub(seq.output().len() + 1);
        let room_ctx = c.max_model_len.saturating_sub(seq.len() + 1);
        let k = c
            .num_speculative_tokens
            .min(budget)
            .min(room_out)
            .min(room_ctx);
        // Constrained sequences never draft: their mask covers one row.
        if k == 0 || seq.constraint.is_some() {
            return Vec::new();
        }
        prompt_lookup(&seq.tokens, k, c.spec_ngram_max)
    }

    /// Admits waiting sequence `idx` with the first chunk of its prompt
    /// (`budget` tokens at most), from its longest cached prefix or its
    /// imported KV; false (nothing changed) when the blocks are not there.
    /// Sibling choices start from their first choice's cached blocks.
    fn admit_one(&mut self, idx: usize, budget: &mut usize, batch: &mut ModelBatch) -> bool {
        let seq = &mut self.waiting[idx];
        let keep = seq.export_from.unwrap_or(usize::MAX);
        let hit = self.kv.start_keeping(seq.id, &seq.tokens, keep);
        let imported = seq.imported.take();
        // Imported KV counts as computed when it covers the prompt from
        // where the cache ends (never the last token: it is sampled), and
        // the sliding layers could hold all of it until it is checked.
        let refusal = imported.as_ref().and_then(|r| {
            if r.first > hit {
                Some("the KV does not start where this cache ends")
            } else if r.end() <= hit {
                Some("this cache already holds every row of the KV")
            } else if r.end() >= seq.len() {
                Some("the KV covers the prompt's last token, which is computed to sample")
            } else if !self.kv.could_hold(seq.id, seq.len()) {
                Some("the sliding-window layers cannot hold this much KV at once")
            } else {
                None
            }
        });
        let usable = imported.is_some() && refusal.is_none();
        seq.num_computed = match &imported {
            Some(r) if usable => r.end(),
            _ => hit,
        };
        let n = (seq.len() - seq.num_computed).min(*budget);
        if !self.kv.allocate(seq.id, seq.num_computed + n) {
            let id = seq.id;
            seq.num_computed = 0;
            seq.imported = imported;
            self.kv.free(id);
            return false;
        }
        match imported {
            Some(rows) if usable => {
                self.imports_used += 1;
                seq.foreign = true;
                let seq = seq.id;
                self.fills.push(Fill {
                    seq,
                    rows,
                    from: hit,
                });
            }
            Some(_) => {
                self.imports_refused += 1;
                let why = refusal.unwrap_or("the KV was not usable");
                self.refusals.push((seq.id, why));
            }
            None => {}
        }
        let seq = &mut self.waiting[idx];
        seq.num_cached_tokens.get_or_insert(hit.min(seq.prompt_len));
        let Some(seq) = self.waiting.remove(idx) else {
            return false;
        };
        *self.served.entry(seq.params.tenant).or_default() += n as u64;
        self.running.push(seq);
        batch
            .chunks
            .push(self.chunk(self.running.len() - 1, n, Vec::new()));
        *budget -= n;
        true
    }

    /// Whether `id` is known and has not finished computing its prompt.
    fn prefilling(&self, id: RequestId) -> bool {
        let pending = |s: &Sequence| s.id == id && s.num_computed + 1 < s.prompt_len;
        self.waiting.iter().any(pending) || self.running.iter().any(pending)
    }

    /// The executor lost every sequence's KV: each running sequence is
    /// requeued to be computed again from its tokens (what it generated
    /// stays generated), and no cached prefix is trusted any more.
    pub fn recompute_all(&mut self) {
        for i in (0..self.running.len()).rev() {
            self.preempt(i);
        }
        self.kv.reset_cache();
    }

    /// Frees a running sequence's blocks and requeues it for recompute.
    fn preempt(&mut self, index: usize) {
        let mut seq = self.running.remove(index);
        self.kv.free(seq.id);
        seq.num_computed = 0;
        seq.on_decoder = false;
        seq.foreign = false;
        self.preemptions += 1;
        tracing::debug!(seq = %seq.id, "preempted (out of KV blocks)");
        self.enqueue(seq);
    }

    /// The next `n` tokens of running sequence `index` as a chunk.
    fn chunk(&self, index: usize, n: usize, draft: Vec<u32>) -> SeqChunk {
        let seq = &self.running[index];
        let start = seq.num_computed;
        let mut tokens = seq.tokens[start..start + n].to_vec();
        tokens.extend_from_slice(&draft);
        SeqChunk {
            seq: seq.id,
            tokens,
            start_pos: start,
            want_logits: start + n == seq.len(),
            block_table: self.kv.table(seq.id).to_vec(),
            swa_table: self.kv.swa_table(seq.id).to_vec(),
            draft,
        }
    }

    /// Structured output's allowed tokens for each chunk of `batch` that
    /// samples a constrained sequence (over a vocabulary of `vocab`).
    pub fn masks(&mut self, batch: &ModelBatch, vocab: usize) -> Vec<Option<TokenMask>> {
        batch
            .chunks
            .iter()
            .map(|chunk| {
                let seq = self.running.iter_mut().find(|s| s.id == chunk.seq)?;
                let (c, eos) = seq.constraint.as_mut().filter(|_| chunk.want_logits)?;
                Some(c.allowed(vocab, *eos))
            })
            .collect()
    }

    /// How the executor samples each chunk of `batch` (`None` for chunks
    /// without logits); `masks` from `masks()`.
    pub fn sampling<'a>(
        &'a self,
        batch: &ModelBatch,
        masks: &'a [Option<TokenMask>],
    ) -> Vec<Option<RowSampling<'a>>> {
        batch
            .chunks
            .iter()
            .enumerate()
            .map(|(i, chunk)| {
                let seq = self.running.iter().find(|s| s.id == chunk.seq)?;
                chunk.want_logits.then(|| RowSampling {
                    spec: &seq.sampling,
                    position: seq.output().len() as u64,
                    penalties: seq.penalties.as_ref(),
                    allowed: masks.get(i).and_then(Option::as_ref),
                })
            })
            .collect()
    }

    /// Applies a step's results: advances computed counts, registers full
    /// blocks in the prefix cache, appends each chunk's sampled tokens (one
    /// list per chunk of the batch), and removes finished sequences
    /// (returned, blocks freed).
    ///
    /// A chunk with drafts yields up to one token per draft plus one: the
    /// accepted drafts, then the executor's correction; a token that ends
    /// the sequence ends it there.
    pub fn update(
        &mut self,
        batch: &ModelBatch,
        sampled: &[Vec<Sampled>],
    ) -> (Vec<StepToken>, Vec<Sequence>) {
        let mut tokens = Vec::new();
        let max_len = self.config.max_model_len;
        for (chunk, chunk_tokens) in batch.chunks.iter().zip(sampled) {
            let Some(seq) = self.running.iter_mut().find(|s| s.id == chunk.seq) else {
                continue;
            };
            let computed = chunk.start_pos + chunk.tokens.len() - chunk.draft.len();
            let mut accepted = 0;
            for (j, (token, logprob)) in chunk_tokens.iter().take(chunk.num_logits()).enumerate() {
                let token = *token;
                seq.tokens.push(token);
                if let Some(p) = &mut seq.penalties {
                    p.push(token);
                }
                if let Some((c, _)) = &mut seq.constraint {
                    c.consume(token);
                }
                let finish = finish_reason(seq, token, max_len);
                tokens.push(StepToken {
                    seq: seq.id,
                    token,
                    logprob: logprob.clone(),
                    finish,
                });
                if finish.is_some() || chunk.draft.get(j) != Some(&token) {
                    break;
                }
                accepted += 1;
            }
            self.spec_accepted += accepted as u64;
            seq.num_computed = computed + accepted;
            let elsewhere = self.split && seq.on_decoder;
            if !(elsewhere || seq.foreign) {
                self.kv
                    .cache_computed(seq.id, &seq.tokens, seq.num_computed);
            }
        }
        let mut finished = Vec::new();
        for t in tokens.iter().filter(|t| t.finish.is_some()) {
            if let Some(i) = self.running.iter().position(|s| s.id == t.seq) {
                let seq = self.running.remove(i);
                self.kv.free(seq.id);
                finished.push(seq);
            }
        }
        (tokens, finished)
    }

    /// Removes every sequence (engine failure or shutdown).
    pub fn drain(&mut self) -> Vec<Sequence> {
        let mut all: Vec<Sequence> = self.running.drain(..).collect();
        all.extend(self.waiting.drain(..));
        for s in &all {
            self.kv.free(s.id);
        }
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

/// Prompt lookup: finds the latest earlier occurrence of the last `n`
/// tokens (`n` from `ngram_max` down to 1) and proposes up to `k` of the
/// tokens that followed it.
pub fn prompt_lookup(tokens: &[u32], k: usize, ngram_max: usize) -> Vec<u32> {
    let len = tokens.len();
    for n in (1..=ngram_max.min(len.saturating_sub(1))).rev() {
        let pattern = &tokens[len - n..];
        if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == pattern) {
            let from = i + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// Whether `token`, just appended to `seq`, ends it.
fn finish_reason(seq: &Sequence, token: u32, max_model_len: usize) -> Option<FinishReason> {
    if seq.stop_ids.contains(&token) {
        Some(FinishReason::Stop)
    } else if seq.output().len() >= seq.params.max_tokens || seq.len() >= max_model_len {
        Some(FinishReason::Length)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const VOCAB: usize = 50;
    const EOS: u32 = 0;

    fn seq(id: u64, prompt_len: usize, max_tokens: usize) -> Sequence {
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(id),
            max_tokens,
            ..Default::default()
        };
        // Prompts share prefixes (few distinct patterns), so the prefix cache hits.
        let prompt_tokens = (0..prompt_len as u32)
            .map(|i| 1 + (i + (id as u32 % 3) * 7) % 40)
            .collect();
        Sequence::new(
            RequestId(id),
            GenerateRequest {
                prompt_tokens,
                params,
            },
            &[EOS],
        )
    }

    /// Checks one planned step against the limits, the block tables and the
    /// sequences' computed counts.
    fn check_step(s: &Scheduler, batch: &ModelBatch) {
        assert!(
            batch.num_tokens() <= s.config.max_num_batched_tokens,
            "token budget exceeded"
        );
        assert!(s.running.len() <= s.config.max_num_seqs, "too many running");
        // New requests stop at max_waiting; preempted ones may add up to a batch.
        assert!(
            s.waiting.len() <= s.config.max_waiting + s.config.max_num_seqs,
            "waiting queue overflow"
        );
        s.kv.check()
            .unwrap_or_else(|e| panic!("KV invariants: {e}"));
        let bs = s.kv.block_size();
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
                c.start_pos, seq.num_computed,
                "chunk does not continue the KV"
            );
            let real = c.tokens.len() - c.draft.len();
            assert_eq!(
                &c.tokens[..real],
                &seq.tokens[c.start_pos..c.start_pos + real]
            );
            assert_eq!(&c.tokens[real..], c.draft.as_slice());
            assert_eq!(c.want_logits, c.start_pos + real == seq.len());
            assert!(
                c.draft.is_empty()
                    || (real == 1 && c.draft.len() <= s.config.num_speculative_tokens)
            );
            assert!(
                c.block_table.len() * bs >= c.start_pos + c.tokens.len(),
                "chunk not backed by blocks"
            );
            assert_eq!(c.block_table.as_slice(), s.kv.table(c.seq));
            assert_eq!(c.swa_table.as_slice(), s.kv.swa_table(c.seq));
            if let Some(w) = s.kv.window() {
                // The window of the chunk's first position is held; the
                // blocks wholly behind it were released.
                let first = (c.start_pos + 1).saturating_sub(w) / bs;
                let end = (c.start_pos + c.tokens.len()).div_ceil(bs);
                assert_eq!(c.swa_table.len(), c.block_table.len());
                assert!(c.swa_table[first..end].iter().all(|&b| b != HOLE));
                assert!(c.swa_table[..first].iter().all(|&b| b == HOLE));
            }
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
                max_model_len: 120,
                num_speculative_tokens: rng.random_range(0..4),
                spec_ngram_max: 3,
                // Half the runs under a time budget, fed random timings.
                step_target: rng
                    .random_bool(0.5)
                    .then(|| Duration::from_millis(rng.random_range(1..50))),
            };
            // Small pools force preemption; every request still fits alone.
            let block_size = rng.random_range(1..9);
            let num_blocks = 120usize.div_ceil(block_size) + rng.random_range(0..40);
            let mut kv = KvManager::new(num_blocks, block_size);
            // Half the runs keep the sliding layers' blocks apart: as few
            // as one sequence's window and step need.
            let sliding = seed % 2 == 1;
            if sliding {
                let window = rng.random_range(1..40usize);
                let one = window.div_ceil(block_size)
                    + config.max_num_batched_tokens.div_ceil(block_size)
                    + 2;
                kv = kv.with_sliding(window, one + rng.random_range(0..20));
            }
            let mut s = Scheduler::new(config, kv);
            let mut live: HashSet<RequestId> = HashSet::new();
            let mut next_id = 0u64;
            for _ in 0..400 {
                match rng.random_range(0..10) {
                    0..=2 => {
                        next_id += 1;
                        let mut sq = seq(next_id, rng.random_range(1..80), rng.random_range(1..40));
                        sq.params.tenant = rng.random_range(0..3);
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
                    }
                    _ => step(&mut s, &mut rng, &mut live),
                }
            }
            // With no new work, everything drains within a bounded number of steps.
            for _ in 0..20_000 {
                if !s.has_work() {
                    break;
                }
                step(&mut s, &mut rng, &mut live);
            }
            assert!(
                !s.has_work() && live.is_empty(),
                "seed {seed}: requests never finished"
            );
            assert_eq!(
                s.kv.pool().num_free(),
                num_blocks,
                "seed {seed}: blocks leaked"
            );
            if let Some(p) = s.kv.sliding_pool() {
                assert_eq!(p.num_free(), p.num_blocks(), "seed {seed}: sliding leaked");
            }
            assert_eq!(s.kv.num_tables(), 0);
        }
    }

    /// Steps (sampling a token wherever a chunk wants one) until request
    /// `id` has its first token; how many steps that took.
    fn steps_to_first_token(s: &mut Scheduler, id: u64) -> usize {
        for n in 1..=1_000 {
            let batch = s.schedule();
            check_step(s, &batch);
            let sampled: Vec<Vec<Sampled>> = batch
                .chunks
                .iter()
                .map(|c| vec![(7, None); c.num_logits()])
                .collect();
            let (tokens, _) = s.update(&batch, &sampled);
            if tokens.iter().any(|t| t.seq == RequestId(id)) {
                return n;
            }
        }
        panic!("request {id} never got a token");
    }

    #[test]
    fn one_tenants_long_prompts_do_not_hold_back_anothers_short_one() {
        let flood_then_small = |small_tenant: u64| {
            let config = SchedulerConfig {
                max_num_seqs: 16,
                max_num_batched_tokens: 256,
                max_waiting: 64,
                max_model_len: 2048,
                ..SchedulerConfig::default()
            };
            let mut s = Scheduler::new(config, KvManager::new(4096, 16));
            // Tenant 1: eight near-context prompts, running (two steps in).
            for id in 1..=8 {
                let mut q = seq(id, 1_800, 8);
                q.params.tenant = 1;
                // Distinct prompts: nothing comes from the prefix cache.
                q.tokens[0] = 100 + id as u32;
                s.add(q).expect("room");
            }
            steps_to_first_token_or(&mut s, 2);
            let mut small = seq(100, 20, 8);
            small.params.tenant = small_tenant;
            s.add(small).expect("room");
            steps_to_first_token(&mut s, 100)
        };
        // Another tenant's short prompt is served in the next step ...
        assert_eq!(flood_then_small(2), 1);
        // ... where the same tenant's waits behind its own long prompts
        // (about 8 x 1,800 / 256 steps).
        assert!(flood_then_small(1) > 40, "{}", flood_then_small(1));
    }

    /// Runs `n` steps.
    fn steps_to_first_token_or(s: &mut Scheduler, n: usize) {
        for _ in 0..n {
            let batch = s.schedule();
            let sampled: Vec<Vec<Sampled>> = batch
                .chunks
                .iter()
                .map(|c| vec![(7, None); c.num_logits()])
                .collect();
            s.update(&batch, &sampled);
        }
    }

    /// Samples `logits` the way an executor would, then updates.
    fn update_from_logits(
        s: &mut Scheduler,
        batch: &ModelBatch,
        logits: &[Vec<f32>],
    ) -> (Vec<StepToken>, Vec<Sequence>) {
        let masks = s.masks(batch, VOCAB);
        let step = crate::executor::Step {
            batch,
            sampling: s.sampling(batch, &masks),
        };
        let sampled = crate::executor::sample_step(&step, logits);
        s.update(batch, &sampled)
    }

    fn step(s: &mut Scheduler, rng: &mut StdRng, live: &mut HashSet<RequestId>) {
        let batch = s.schedule();
        check_step(s, &batch);
        s.observe_step(&batch, Duration::from_micros(rng.random_range(0..100_000)));
        let logits: Vec<Vec<f32>> = batch
            .chunks
            .iter()
            .flat_map(|c| 0..c.num_logits())
            .map(|_| (0..VOCAB).map(|_| rng.random_range(-1.0..1.0)).collect())
            .collect();
        let (tokens, finished) = update_from_logits(s, &batch, &logits);
        assert!(tokens.len() <= logits.len(), "more tokens than logits rows");
        assert!(tokens.len() >= batch.chunks.iter().filter(|c| c.want_logits).count());
        for f in &finished {
            assert!(f.output().len() <= f.params.max_tokens);
            let last = *f
                .output()
                .last()
                .expect("finished sequences sampled a token");
            assert!(last == EOS || f.output().len() == f.params.max_tokens || f.len() >= 120);
            assert!(
                live.remove(&f.id),
                "{} finished twice or was never added",
                f.id
            );
        }
    }

    /// A prefill chunk of `n` tokens of an unknown sequence (for timings).
    fn chunk_of(seq: u64, n: usize) -> SeqChunk {
        SeqChunk {
            seq: RequestId(seq),
            tokens: vec![1; n],
            start_pos: 0,
            want_logits: true,
            block_table: Vec::new(),
            swa_table: Vec::new(),
            draft: Vec::new(),
        }
    }

    fn config(max_num_batched_tokens: usize) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens,
            max_waiting: 8,
            max_model_len: 100,
            ..Default::default()
        }
    }

    #[test]
    fn prompt_lookup_proposes_what_followed_the_latest_match() {
        // "... 5 6 7 8 ... 5 6" -> the last 2-gram (5 6) was followed by 7 8 9.
        let t = [1, 5, 6, 7, 8, 9, 2, 5, 6];
        assert_eq!(prompt_lookup(&t, 3, 3), [7, 8, 9]);
        assert_eq!(prompt_lookup(&t, 1, 3), [7]);
        // Longest n-gram wins: "3 4" occurs twice, "2 3 4" once (followed by 9).
        let t = [2, 3, 4, 9, 0, 3, 4, 7, 2, 3, 4];
        assert_eq!(prompt_lookup(&t, 2, 3), [9, 0]);
        assert!(prompt_lookup(&[1, 2, 3], 4, 3).is_empty());
        assert!(prompt_lookup(&[], 4, 3).is_empty());
    }

    #[test]
    fn under_a_time_budget_a_decoding_step_carries_what_fits() {
        let config = SchedulerConfig {
            max_num_batched_tokens: 64,
            step_target: Some(Duration::from_millis(40)),
            ..config(64)
        };
        let mut s = Scheduler::new(config, KvManager::new(64, 4));
        // A machine: 10 ms a step, 10 ms a decode row, 1 ms a prefill token.
        let cost = |b: &ModelBatch| {
            let (mut d, mut p) = (0u64, 0u64);
            for c in &b.chunks {
                if c.tokens.len() == 1 {
                    d += 1
                } else {
                    p += c.tokens.len() as u64
                }
            }
            Duration::from_millis(10 + 10 * d + p)
        };
        s.add(seq(1, 40, 50)).expect("room");
        let mut b = s.schedule();
        assert_eq!(b.num_tokens(), 40, "nobody decodes: the whole prompt");
        s.observe_step(&b, cost(&b));
        update_from_logits(&mut s, &b, &[vec![-100.0, 100.0]]);
        for _ in 0..6 {
            b = s.schedule();
            s.observe_step(&b, cost(&b));
            update_from_logits(&mut s, &b, &[vec![-100.0, 100.0]]);
        }
        s.add(seq(2, 60, 5)).expect("room");
        s.observe_step(
            &ModelBatch {
                chunks: vec![chunk_of(9, 30)],
            },
            Duration::from_millis(40),
        );
        let b = s.schedule();
        let prefill: usize = b
            .chunks
            .iter()
            .filter(|c| c.seq == RequestId(2))
            .map(|c| c.tokens.len())
            .sum();
        // 40 ms - 10 - 10 for the decode row leaves about 20 tokens.
        assert!((16..=24).contains(&prefill), "{prefill} prefill tokens");
        assert_eq!(b.chunks[0].tokens.len(), 1, "the decode row still runs");
    }

    #[test]
    fn running_sequences_are_scheduled_before_waiting_ones() {
        let mut s = Scheduler::new(config(10), KvManager::new(64, 4));
        s.add(seq(1, 8, 5)).expect("room");
        let first = s.schedule();
        assert_eq!(first.chunks.len(), 1);
        update_from_logits(&mut s, &first, &[vec![-100.0, 100.0]]);
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

    /// Runs requests to completion, every sampled token 7; the blocks `id`
    /// held in each group (full, sliding) for its last step, and the most
    /// sliding blocks it held at once.
    fn run_holding(s: &mut Scheduler, id: RequestId) -> ((usize, usize), usize) {
        let (mut last, mut most) = ((0, 0), 0);
        while s.has_work() {
            let batch = s.schedule();
            check_step(s, &batch);
            last = s.kv.held(id);
            most = most.max(last.1);
            let rows = batch.chunks.iter().map(SeqChunk::num_logits).sum();
            let mut hot = vec![0.0f32; VOCAB];
            hot[7] = 100.0;
            update_from_logits(s, &batch, &vec![hot; rows]);
        }
        (last, most)
    }

    #[test]
    fn a_32k_gemma3_4b_sequence_holds_a_sixth_of_its_kv_with_sliding_blocks() {
        // Gemma 3 4B: 34 layers, 29 sliding over 1024 positions; 4 KV
        // heads of 256 at f16: 64 KiB per layer per block of 16.
        let layer_block = 16 * 2 * 4 * 256 * 2;
        let config = SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: 2048,
            max_model_len: 32768,
            ..SchedulerConfig::default()
        };
        let memory = 8usize << 30;
        let plan =
            crate::kv_cache::plan::plan(memory, layer_block, 34, Some((1024, 29)), &config, 16)
                .expect("plan");
        let (window, swa) = plan.sliding.expect("a sliding group");
        let kv = KvManager::new(plan.full_blocks, 16).with_sliding(window, swa);
        let mut s = Scheduler::new(config, kv);
        s.add(seq(1, 32000, 768)).expect("queued");
        let ((full, sliding), most) = run_holding(&mut s, RequestId(1));
        assert_eq!(full, 32768 / 16, "every position in the global layers");
        // Decoding: the window's 64 blocks and the partial ones at its ends.
        assert!(sliding <= 64 + 2, "{sliding} sliding blocks");
        // Prefill: besides, a chunk's 2048 positions (128 blocks).
        assert!(most <= 64 + 2 + 128, "{most} sliding blocks");
        let bytes = (full * 5 + sliding * 29) * layer_block;
        let all = full * 34 * layer_block;
        assert!(all >= 5 * bytes, "{all} vs {bytes}");
        let gib = |b: usize| b as f64 / f64::from(1 << 30);
        eprintln!(
            "Gemma-3-4B KV of one 32768-position sequence: {:.2} GiB with full tables, {:.2} GiB \
             with sliding blocks ({:.1}x; {:.2} GiB at most while prefilling); the 8 GiB budget \
             holds {} positions of global layers, {} with full tables",
            gib(all),
            gib(bytes),
            all as f64 / bytes as f64,
            gib((full * 5 + most * 29) * layer_block),
            plan.full_blocks * 16,
            memory / (34 * layer_block) * 16,
        );
        assert_eq!(s.kv.pool().num_free(), plan.full_blocks);
    }

    #[test]
    fn a_shared_prefix_is_not_recomputed() {
        let mut s = Scheduler::new(config(512), KvManager::new(64, 4));
        s.add(seq(3, 30, 1)).expect("room");
        let b = s.schedule();
        update_from_logits(&mut s, &b, &[vec![0.0; VOCAB]]);
        // Same prompt pattern (id % 3 equal): 28 of 30 tokens come from cache.
        s.add(seq(6, 30, 1)).expect("room");
        let b = s.schedule();
        assert_eq!(b.chunks[0].start_pos, 28);
        assert_eq!(b.chunks[0].tokens.len(), 2);
        assert_eq!(s.kv.prefix_hits, 28);
    }

    #[test]
    fn higher_priority_requests_are_admitted_first_and_preempted_last() {
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 1,
                ..config(512)
            },
            KvManager::new(64, 4),
        );
        let mut low = seq(1, 4, 2);
        low.params.priority = 5;
        let mut high = seq(2, 4, 2);
        high.params.priority = -1;
        s.add(low).expect("room");
        s.add(high).expect("room");
        s.add(seq(3, 4, 2)).expect("room");
        let order: Vec<u64> = s.waiting.iter().map(|q| q.id.0).collect();
        assert_eq!(order, [2, 3, 1]);
        let b = s.schedule();
        assert_eq!(b.chunks[0].seq, RequestId(2));
    }

    #[test]
    fn running_out_of_blocks_preempts_the_newest_sequence() {
        // 6 blocks of 4 = 24 positions; two 10-token prompts fit, growth does not.
        let mut s = Scheduler::new(config(64), KvManager::new(6, 4));
        s.add(seq(1, 10, 20)).expect("room");
        s.add(seq(2, 11, 20)).expect("room");
        let mut preempted_at = None;
        for step in 0..40 {
            let b = s.schedule();
            check_step(&s, &b);
            if s.preemptions > 0 && preempted_at.is_none() {
                preempted_at = Some(step);
                assert_eq!(s.running.len(), 1);
                assert_eq!(
                    s.running[0].id,
                    RequestId(1),
                    "the older sequence keeps running"
                );
            }
            let n = b.chunks.iter().filter(|c| c.want_logits).count();
            update_from_logits(&mut s, &b, &vec![vec![-100.0, 100.0]; n]);
        }
        assert!(preempted_at.is_some(), "no preemption happened");
    }
}
