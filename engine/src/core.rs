//! `EngineCore`: the busy loop that owns the scheduler and the executor on
//! its own thread. Each turn: apply queued commands (new requests, aborts),
//! then `schedule -> execute -> update`, then send each request its new
//! tokens. It blocks only when there is no work.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};
use web_time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::constraint::Constraint;
use crate::error::EngineError;
use crate::executor::{Executor, Step, Tables};
use crate::import_check;
use crate::kv_cache::transfer::KvRows;
use crate::model::ModelBatch;
use crate::request::{FinishReason, GenerateRequest, RequestId, TokenLogprob, Usage};
use crate::sampling::Sampled;
use crate::scheduler::{Fill, Scheduler, Sequence, StepToken};
use crate::stats::StatsCell;

/// What the core sends back to a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum CoreEvent {
    /// The scheduler took the request (sent first, before any token).
    Accepted,
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(EngineError),
}

/// Messages from handles to the core.
#[derive(Debug)]
pub enum Command {
    Add {
        id: RequestId,
        req: Box<GenerateRequest>,
        /// For choices 2..n: the first choice, whose prompt blocks it shares.
        wait_for: Option<RequestId>,
        events: UnboundedSender<CoreEvent>,
        /// When the handle submitted it (latencies count from here).
        arrived: Instant,
        /// Structured output: the matcher and its end-of-output token.
        constraint: Option<(Box<Constraint>, u32)>,
        /// Tokens already generated elsewhere (an executor that was lost
        /// mid-stream): the sequence continues after them as if it had
        /// generated them itself (positions, penalties, `max_tokens`).
        resume: Vec<u32>,
        /// KV that moves with it: rows to start from, or a stream of its
        /// prompt's rows for another executor.
        handoff: Handoff,
    },
    Abort(RequestId),
    /// Scores `tokens[prompt_len..]` as the continuation of the tokens
    /// before them (one prefill over all of them): each token's
    /// log-probability and rank under this engine's model.
    Score {
        tokens: Vec<u32>,
        prompt_len: usize,
        reply: tokio::sync::oneshot::Sender<Result<Vec<TokenScore>, EngineError>>,
    },
    /// How many leading tokens of `tokens` the prefix cache holds now.
    CachedPrefix {
        tokens: Vec<u32>,
        reply: tokio::sync::oneshot::Sender<usize>,
    },
    Shutdown,
}

/// KV that moves with a request between executors (prefill/decode
/// disaggregation across workers).
#[derive(Debug, Default)]
pub struct Handoff {
    /// Rows computed elsewhere for its prompt (verified by the caller):
    /// used when they start where this engine's prefix cache ends,
    /// recomputed otherwise.
    pub import: Option<KvRows>,
    /// Stream the prompt's rows from this position on, as they are
    /// computed (cached ones included), to this channel; it closes when
    /// the last prompt position was sent, or early on a failure.
    pub export: Option<(usize, UnboundedSender<KvRows>)>,
    /// Told whether `import` was used (it passed `import_check`) or why
    /// not (the prompt is then computed here); dropped unanswered when
    /// the request ends before its admission.
    pub verdict: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

/// How this engine's model rates one token of a scored continuation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenScore {
    pub token: u32,
    /// Log-probability under the raw distribution.
    pub logprob: f32,
    /// Tokens more likely than it (0: the most likely).
    pub rank: u32,
}

/// A request whose prompt rows are streamed out as they are computed.
#[derive(Debug)]
struct Export {
    next: usize,
    until: usize,
    tx: UnboundedSender<KvRows>,
}

/// The engine loop's state.
pub struct EngineCore {
    scheduler: Scheduler,
    /// Runs every step, or with `decoder` the prefill chunks only.
    executor: Box<dyn Executor>,
    /// Split stages: runs the decode chunks; a sequence's KV blocks move
    /// here when its prefill is done.
    decoder: Option<Box<dyn Executor>>,
    commands: Receiver<Command>,
    senders: std::collections::HashMap<RequestId, UnboundedSender<CoreEvent>>,
    /// Latency bookkeeping of each live request.
    timing: std::collections::HashMap<RequestId, Timing>,
    eos: Vec<u32>,
    /// Tokens in the vocabulary (the width of structured output's masks).
    vocab: usize,
    stats: Arc<StatsCell>,
    exports: std::collections::HashMap<RequestId, Export>,
    /// Requests that imported KV, until it is used or refused.
    verdicts: std::collections::HashMap<RequestId, Verdict>,
}

/// Where an import's verdict goes.
type Verdict = tokio::sync::oneshot::Sender<Result<(), String>>;

/// When a request arrived, whether it has been scheduled, and when it last
/// produced tokens.
#[derive(Debug, Clone, Copy)]
struct Timing {
    arrived: Instant,
    scheduled: bool,
    last_token: Option<Instant>,
}

impl EngineCore {
    pub fn new(
        scheduler: Scheduler,
        executor: Box<dyn Executor>,
        commands: Receiver<Command>,
        eos: Vec<u32>,
        vocab: usize,
        stats: Arc<StatsCell>,
    ) -> Self {
        Self {
            scheduler,
            executor,
            decoder: None,
            commands,
            senders: Default::default(),
            timing: Default::default(),
            eos,
            vocab,
            stats,
            exports: Default::default(),
            verdicts: Default::default(),
        }
    }

    /// Splits the stages: `decoder` runs the decode chunks (the scheduler
    /// must have been built `with_split_stages`).
    pub fn with_decoder(mut self, decoder: Box<dyn Executor>) -> Self {
        self.decoder = Some(decoder);
        self
    }

    /// Runs until `Shutdown` or until every handle is dropped.
    pub fn run(mut self) {
        let mut idle = true;
        loop {
            if !self.apply_commands(idle) {
                break;
            }
            idle = !self.scheduler.has_work() || !self.step();
        }
        for seq in self.scheduler.drain() {
            self.finish(seq, Err(EngineError::Shutdown));
        }
    }

    /// One turn for a caller that drives the core itself (no thread of
    /// its own): applies the commands queued since the last turn, then
    /// runs one step when there is work. Returns whether work remains
    /// (call again), false once idle or shut down.
    pub fn turn(&mut self) -> bool {
        if !self.apply_commands(false) {
            for seq in self.scheduler.drain() {
                self.finish(seq, Err(EngineError::Shutdown));
            }
            return false;
        }
        self.scheduler.has_work() && self.step()
    }

    /// Applies pending commands, blocking for one when idle (no work, or a
    /// step that could schedule nothing). Returns false when the engine
    /// should stop.
    fn apply_commands(&mut self, idle: bool) -> bool {
        if idle {
            match self.commands.recv() {
                Ok(cmd) => {
                    if !self.apply(cmd) {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(cmd) => {
                    if !self.apply(cmd) {
                        return false;
                    }
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return self.scheduler.has_work(),
            }
        }
    }

    fn apply(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add {
                id,
                req,
                wait_for,
                events,
                arrived,
                constraint,
                resume,
                handoff,
            } => {
                let mut seq = Sequence::new(id, *req, &self.eos);
                seq.resume(&resume);
                if let Some(rows) = handoff.import {
                    match rows.check(&self.executor.kv_layout()) {
                        Ok(()) => {
                            seq.imported = Some(rows);
                            if let Some(v) = handoff.verdict {
                                self.verdicts.insert(id, v);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(seq = %id, error = %e, "imported KV refused: recomputing");
                            self.scheduler.imports_refused += 1;
                            if let Some(v) = handoff.verdict {
                                let _ = v.send(Err(e.to_string()));
                            }
                        }
                    }
                }
                if let Some((next, tx)) = handoff.export {
                    let until = seq.prompt_len;
                    seq.export_from = Some(next);
                    self.exports.insert(id, Export { next, until, tx });
                }
                if let Some((c, eos)) = constraint {
                    // A finished structured output ends the sequence, even
                    // with `ignore_eos`.
                    if !seq.stop_ids.contains(&eos) {
                        seq.stop_ids.push(eos);
                    }
                    seq.constraint = Some((*c, eos));
                }
                seq.wait_for = wait_for;
                match self.scheduler.add(seq) {
                    Ok(()) => {
                        let _ = events.send(CoreEvent::Accepted);
                        self.senders.insert(id, events);
                        let t = Timing {
                            arrived,
                            scheduled: false,
                            last_token: None,
                        };
                        self.timing.insert(id, t);
                    }
                    Err(_) => {
                        let waiting = self.scheduler.num_waiting();
                        let _ = events.send(CoreEvent::Failed(EngineError::Overloaded { waiting }));
                    }
                }
            }
            Command::Abort(id) => {
                if let Some(seq) = self.scheduler.abort(id) {
                    self.finish(seq, Ok(FinishReason::Abort));
                }
            }
            Command::Score {
                tokens,
                prompt_len,
                reply,
            } => {
                let _ = reply.send(self.score(&tokens, prompt_len));
            }
            Command::CachedPrefix { tokens, reply } => {
                let _ = reply.send(self.scheduler.cached_prefix(&tokens));
            }
            Command::Shutdown => return false,
        }
        self.publish_stats();
        true
    }

    /// One `schedule -> execute -> update` iteration; false if nothing ran.
    fn step(&mut self) -> bool {
        let mut batch = self.scheduler.schedule();
        if batch.is_empty() {
            return false;
        }
        let started = Instant::now();
        self.fill_imported(&mut batch);
        if batch.is_empty() {
            return true;
        }
        self.record_scheduled(&batch);
        let sampled = match self.execute(&batch) {
            Ok(s) => s,
            Err(EngineError::Recompute(why)) => {
                tracing::warn!(%why, "the executor lost its KV: recomputing every sequence");
                self.scheduler.recompute_all();
                self.publish_stats();
                return true;
            }
            Err(e) => {
                tracing::error!(error = %e, "engine step failed");
                for seq in self.scheduler.fail(&batch) {
                    self.finish(seq, Err(e.clone()));
                }
                // The failed sequences are gone: a drain waiting for the
                // engine to be idle must see it.
                self.publish_stats();
                return true;
            }
        };
        self.scheduler.observe_step(&batch, started.elapsed());
        self.export_rows(&batch);
        let (tokens, finished) = self.scheduler.update(&batch, &sampled);
        self.move_prefilled();
        // Counters first, so a client that sees this step's tokens also sees
        // this step in the statistics.
        self.stats
            .record_step(batch.num_tokens(), tokens.len(), started.elapsed());
        self.publish_stats();
        self.record_tokens(&tokens);
        let mut dead = Vec::new();
        for t in &tokens {
            let alive = self.senders.get(&t.seq).is_some_and(|tx| {
                tx.send(CoreEvent::Token {
                    id: t.token,
                    logprob: t.logprob.clone(),
                })
                .is_ok()
            });
            if !alive && t.finish.is_none() {
                dead.push(t.seq);
            }
        }
        for seq in finished {
            let reason = tokens
                .iter()
                .find(|t| t.seq == seq.id && t.finish.is_some())
                .and_then(|t| t.finish);
            self.finish(seq, Ok(reason.unwrap_or(FinishReason::Stop)));
        }
        // A receiver that is gone is a client that left: abort its sequence.
        for id in dead {
            if let Some(seq) = self.scheduler.abort(id) {
                self.finish(seq, Ok(FinishReason::Abort));
            }
        }
        self.publish_stats();
        true
    }

    /// One prefill over `tokens` in scratch blocks (freed after): the
    /// score of every token from `prompt_len` on.
    fn score(&mut self, tokens: &[u32], prompt_len: usize) -> Result<Vec<TokenScore>, EngineError> {
        let n = tokens.len().saturating_sub(prompt_len);
        if prompt_len == 0 || n == 0 {
            return Err(EngineError::validation("tokens", "nothing to score"));
        }
        let id = RequestId(u64::MAX - 1);
        let computed = tokens.len() - 1;
        let (table, swa) = self
            .scheduler
            .scratch(id, computed)
            .ok_or_else(|| EngineError::Execution("no free KV blocks to score now".into()))?;
        let chunk = crate::model::SeqChunk {
            seq: id,
            tokens: tokens[..computed].to_vec(),
            start_pos: 0,
            want_logits: true,
            block_table: table,
            swa_table: swa,
            draft: tokens[prompt_len..computed].to_vec(),
        };
        let batch = ModelBatch {
            chunks: vec![chunk],
        };
        let started = Instant::now();
        let rows = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.executor.logits(&batch)
        }))
        .unwrap_or_else(|_| Err(EngineError::Execution("scoring panicked".into())));
        self.stats.record_score(started.elapsed());
        self.scheduler.free_scratch(id);
        let rows = rows?;
        Ok(rows
            .iter()
            .zip(&tokens[prompt_len..])
            .map(|(row, &token)| {
                let lp = crate::sampling::logprobs(row, token, 0).logprob;
                let mine = row
                    .get(token as usize)
                    .copied()
                    .unwrap_or(f32::NEG_INFINITY);
                let rank = row.iter().filter(|&&v| v > mine).count() as u32;
                TokenScore {
                    token,
                    logprob: lp,
                    rank,
                }
            })
            .collect())
    }

    /// Writes the KV rows that sequences admitted this step imported into
    /// their blocks; a sequence whose rows cannot be written fails and
    /// leaves the batch.
    fn fill_imported(&mut self, batch: &mut ModelBatch) {
        let mut failed = Vec::new();
        let mut forged = Vec::new();
        for fill in self.scheduler.take_fills() {
            let Some(chunk) = batch.chunks.iter().find(|c| c.seq == fill.seq) else {
                continue;
            };
            let (full, swa) = (chunk.block_table.clone(), chunk.swa_table.clone());
            let tables = Tables {
                full: &full,
                swa: &swa,
            };
            if let Err(e) = self.executor.write_rows(tables, &fill.rows, fill.from) {
                failed.push((fill.seq, e));
                continue;
            }
            let verdict = self.check_import(tables, &fill);
            if verdict.is_err() {
                forged.push((fill.seq, fill.from));
            }
            if let Some(v) = self.verdicts.remove(&fill.seq) {
                let _ = v.send(verdict);
            }
        }
        // Admitted with an import the scheduler could not use.
        for (id, why) in self.scheduler.take_refusals() {
            if let Some(v) = self.verdicts.remove(&id) {
                let _ = v.send(Err(why.into()));
            }
        }
        for c in &batch.chunks {
            if let Some(v) = self.verdicts.remove(&c.seq) {
                let _ = v.send(Err("the KV was not used".into()));
            }
        }
        for (id, from) in forged {
            batch.chunks.retain(|c| c.seq != id);
            self.scheduler.refuse_fill(id, from);
        }
        for (id, e) in failed {
            batch.chunks.retain(|c| c.seq != id);
            if let Some(seq) = self.scheduler.abort(id) {
                let err = EngineError::Execution(format!("writing imported KV: {e}"));
                self.finish(seq, Err(err));
            }
        }
    }

    /// Recomputes a few positions of `fill` at random over the imported
    /// rows (`import_check`); the reason it was refused, if it was.
    fn check_import(&mut self, tables: Tables<'_>, fill: &Fill) -> Result<(), String> {
        let tokens = self
            .scheduler
            .tokens_of(fill.seq)
            .unwrap_or_default()
            .to_vec();
        let picks = import_check::pick(fill.from, fill.rows.end(), import_check::POSITIONS);
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            import_check::verify(&mut *self.executor, tables, &tokens, &fill.rows, &picks)
        }));
        match checked {
            Ok(Ok(worst)) => {
                tracing::debug!(seq = %fill.seq, worst, ?picks, "imported KV checked");
                Ok(())
            }
            Ok(Err(e)) => {
                tracing::warn!(seq = %fill.seq, error = %e, "imported KV failed its check: recomputing");
                Err(e.to_string())
            }
            Err(_) => Err("checking imported KV panicked".into()),
        }
    }

    /// Streams the prompt rows the step just computed (and cached ones
    /// before them) of every exporting sequence in the batch.
    fn export_rows(&mut self, batch: &ModelBatch) {
        if self.exports.is_empty() {
            return;
        }
        for c in &batch.chunks {
            let Some(x) = self.exports.get_mut(&c.seq) else {
                continue;
            };
            let end = (c.start_pos + c.tokens.len() - c.draft.len()).min(x.until);
            if end <= x.next {
                continue;
            }
            let sent = self
                .executor
                .read_rows(Tables::of(c), x.next, end - x.next)
                .map_err(|e| e.to_string())
                .and_then(|rows| x.tx.send(rows).map_err(|_| "nobody listens".into()));
            x.next = end;
            if let Err(e) = &sent {
                tracing::warn!(seq = %c.seq, error = %e, "KV export stopped");
            }
            if sent.is_err() || end == x.until {
                self.exports.remove(&c.seq);
            }
        }
    }

    /// Queue time of the batch's requests scheduled for the first time.
    fn record_scheduled(&mut self, batch: &ModelBatch) {
        for c in &batch.chunks {
            if let Some(t) = self.timing.get_mut(&c.seq)
                && !t.scheduled
            {
                t.scheduled = true;
                self.stats.latency.queue.observe(t.arrived.elapsed());
            }
        }
    }

    /// Time to first token, or the gap since the request's previous
    /// token-emitting step (several tokens of one step count once).
    fn record_tokens(&mut self, tokens: &[StepToken]) {
        let now = Instant::now();
        for tok in tokens {
            let Some(t) = self.timing.get_mut(&tok.seq) else {
                continue;
            };
            match t.last_token {
                Some(prev) if prev == now => continue,
                Some(prev) => self.stats.latency.itl.observe(now - prev),
                None => self.stats.latency.ttft.observe(now - t.arrived),
            }
            t.last_token = Some(now);
        }
    }

    /// Runs the step (with each chunk's sampling and structured output's
    /// masks): on the executor, or with split stages the prefill chunks on
    /// it and the decode chunks on the decoder, results in batch order.
    fn execute(&mut self, batch: &ModelBatch) -> Result<Vec<Vec<Sampled>>, EngineError> {
        let masks = self.scheduler.masks(batch, self.vocab);
        let sampling = self.scheduler.sampling(batch, &masks);
        let Some(decoder) = &mut self.decoder else {
            let step = Step { batch, sampling };
            return guarded(self.executor.as_mut(), &step);
        };
        let on_decoder: Vec<bool> = batch
            .chunks
            .iter()
            .map(|c| self.scheduler.on_decoder(c.seq))
            .collect();
        let mut out = vec![Vec::new(); batch.chunks.len()];
        for (stage, executor) in [(false, self.executor.as_mut()), (true, decoder.as_mut())] {
            let picked: Vec<usize> = (0..batch.chunks.len())
                .filter(|&i| on_decoder[i] == stage)
                .collect();
            if picked.is_empty() {
                continue;
            }
            let part = ModelBatch {
                chunks: picked.iter().map(|&i| batch.chunks[i].clone()).collect(),
            };
            let step = Step {
                batch: &part,
                sampling: picked.iter().map(|&i| sampling[i]).collect(),
            };
            for (i, tokens) in picked.into_iter().zip(guarded(executor, &step)?) {
                out[i] = tokens;
            }
        }
        Ok(out)
    }

    /// With split stages: moves the KV blocks of every sequence whose
    /// prefill just finished from the executor to the decoder (checksummed
    /// bytes); a sequence whose blocks cannot move fails.
    fn move_prefilled(&mut self) {
        let Some(decoder) = &mut self.decoder else {
            return;
        };
        let mut failed = Vec::new();
        for (id, blocks) in self.scheduler.take_prefilled() {
            let moved = self
                .executor
                .export_kv(&blocks)
                .and_then(|bytes| decoder.import_kv(&blocks, &bytes));
            if let Err(e) = moved {
                tracing::error!(seq = %id, error = %e, "KV move to the decoder failed");
                failed.push((id, e));
            }
        }
        for (id, e) in failed {
            if let Some(seq) = self.scheduler.abort(id) {
                let err = EngineError::Execution(format!("moving the KV cache: {e}"));
                self.finish(seq, Err(err));
            }
        }
    }

    /// Frees a sequence and tells its stream how it ended.
    fn finish(&mut self, seq: Sequence, outcome: Result<FinishReason, EngineError>) {
        self.exports.remove(&seq.id);
        self.verdicts.remove(&seq.id);
        self.executor.release(seq.id);
        if let Some(d) = &mut self.decoder {
            d.release(seq.id);
        }
        if let (Some(t), Ok(reason)) = (self.timing.remove(&seq.id), &outcome) {
            let latency = &self.stats.latency;
            latency.e2e.observe(t.arrived.elapsed());
            latency.record_finish(*reason, seq.prompt_len, seq.output().len());
        }
        let Some(tx) = self.senders.remove(&seq.id) else {
            return;
        };
        let event = match outcome {
            Ok(reason) => CoreEvent::Finished {
                reason,
                usage: Usage {
                    prompt_tokens: seq.prompt_len,
                    completion_tokens: seq.output().len(),
                    cached_tokens: seq.num_cached_tokens.unwrap_or(0),
                },
            },
            Err(e) => CoreEvent::Failed(e),
        };
        let _ = tx.send(event);
    }

    fn publish_stats(&self) {
        let kv = self.scheduler.kv();
        self.stats
            .set_queue(self.scheduler.num_running(), self.scheduler.num_waiting());
        self.stats.set_cache(
            kv.usage(),
            kv.prefix_queries,
            kv.prefix_hits,
            self.scheduler.preemptions,
        );
        self.stats
            .set_spec(self.scheduler.spec_proposed, self.scheduler.spec_accepted);
        let decoder = self.decoder.as_ref().map_or(0, |d| d.kv_bytes());
        self.stats.set_kv_bytes(self.executor.kv_bytes() + decoder);
    }
}

/// Runs one step; a panic inside the executor (a bug) becomes an error
/// that fails this step's sequences instead of killing the engine thread.
fn guarded(executor: &mut dyn Executor, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>, EngineError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| executor.execute(step)))
        .unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(EngineError::Execution(format!("executor panicked: {msg}")))
        })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::kv_cache::KvManager;
    use crate::request::SamplingParams;
    use crate::scheduler::SchedulerConfig;

    /// Panics on any step that includes request 1; otherwise always
    /// predicts token 3.
    struct Flaky;

    impl Executor for Flaky {
        fn name(&self) -> String {
            "flaky".into()
        }

        fn kv_layout(&self) -> crate::kv_cache::KvLayout {
            crate::kv_cache::KvLayout {
                n_layer: 1,
                n_kv_head: 1,
                head_dim: 1,
                block_size: 4,
                num_blocks: 16,
                dtype: Default::default(),
                sliding: None,
            }
        }

        fn execute(&mut self, step: &Step<'_>) -> crate::error::Result<Vec<Vec<Sampled>>> {
            let batch = step.batch;
            assert!(
                batch.chunks.iter().all(|c| c.seq != RequestId(1)),
                "kernel bug on request 1"
            );
            let logits: Vec<Vec<f32>> = batch
                .chunks
                .iter()
                .flat_map(|c| 0..c.num_logits())
                .map(|_| vec![0.0, 0.0, 0.0, 9.0])
                .collect();
            Ok(crate::executor::sample_step(step, &logits))
        }

        fn release(&mut self, _seq: RequestId) {}

        fn export_kv(
            &self,
            _blocks: &[u32],
        ) -> std::result::Result<Vec<u8>, crate::kv_cache::transfer::KvTransferError> {
            Err(crate::kv_cache::transfer::KvTransferError::NotKv)
        }

        fn import_kv(
            &mut self,
            _blocks: &[u32],
            _bytes: &[u8],
        ) -> std::result::Result<(), crate::kv_cache::transfer::KvTransferError> {
            Err(crate::kv_cache::transfer::KvTransferError::NotKv)
        }
    }

    fn add(tx: &mpsc::Sender<Command>, id: u64) -> tokio::sync::mpsc::UnboundedReceiver<CoreEvent> {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let params = SamplingParams {
            temperature: 0.0,
            max_tokens: 2,
            ..Default::default()
        };
        let req = Box::new(GenerateRequest {
            prompt_tokens: vec![1, 2],
            params,
        });
        tx.send(Command::Add {
            id: RequestId(id),
            req,
            wait_for: None,
            events,
            arrived: Instant::now(),
            constraint: None,
            resume: Vec::new(),
            handoff: Handoff::default(),
        })
        .expect("core alive");
        rx
    }

    #[test]
    fn a_panicking_executor_fails_its_requests_and_the_engine_keeps_serving() {
        let (tx, rx) = mpsc::channel();
        let sched = Scheduler::new(SchedulerConfig::default(), KvManager::new(16, 4));
        let core = EngineCore::new(
            sched,
            Box::new(Flaky),
            rx,
            vec![0],
            4,
            Arc::new(StatsCell::default()),
        );
        let stats = Arc::new(StatsCell::default());
        let core = EngineCore {
            stats: stats.clone(),
            ..core
        };
        let thread = std::thread::spawn(move || core.run());
        let mut bad = add(&tx, 1);
        assert_eq!(bad.blocking_recv(), Some(CoreEvent::Accepted));
        match bad.blocking_recv() {
            Some(CoreEvent::Failed(EngineError::Execution(msg))) => {
                assert!(msg.contains("kernel bug"), "{msg}")
            }
            other => panic!("expected an execution failure, got {other:?}"),
        }
        // The statistics say so at once (a drain waits on them).
        let busy = || {
            let s = stats.snapshot();
            s.num_running + s.num_waiting
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while busy() > 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(busy(), 0, "the failed request still counts");
        let mut good = add(&tx, 2);
        assert_eq!(good.blocking_recv(), Some(CoreEvent::Accepted));
        let first = good.blocking_recv();
        assert_eq!(
            first,
            Some(CoreEvent::Token {
                id: 3,
                logprob: None
            })
        );
        tx.send(Command::Shutdown).expect("core alive");
        thread.join().expect("engine thread survived");
    }
}
