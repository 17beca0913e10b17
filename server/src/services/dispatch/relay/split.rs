//! A split attempt: prefill on worker P, decode on worker D. D is
//! assigned the choice with a transfer; it answers which prompt positions
//! it lacks (`kv_want`); P is told to prefill and stream them. The first
//! token comes from P with `kv_end`, which goes on to D with the digest.
//! A prefill that fails, is lost, or does not end within
//! `--fleet-kv-timeout` ends the transfer (`kv_abort`): D then recomputes
//! the prompt, so the client sees the same tokens either way. P is paid
//! for the prompt only when D used its KV (`books`). The cost model that
//! chose the split is `services::placement::disagg`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::core::CoreEvent;
use engine::{FinishReason, TokenLogprob};
use tokio::sync::mpsc;
use tokio::time::Instant as Deadline;

use super::{Attempt, Relay, cancel, job_params};
use crate::fleet::assignments::JobEvent;
use crate::fleet::transfers::TransferEvent;
use crate::services::dispatch::stages::Timing;
use crate::services::dispatch::stats::TransferEnd;
use crate::services::dispatch::{Dispatch, SplitPlan, Target};
use crate::services::placement::Measure;
use protocol::{JobToken, KvIncoming, ToWorker, VERSION};

/// Counts a transfer as open on both its executors until dropped.
struct KvClock {
    dispatch: Arc<Dispatch>,
    keys: [String; 2],
}

impl KvClock {
    fn open(dispatch: &Arc<Dispatch>, p: &str, d: &str) -> Self {
        let keys = [p.to_string(), d.to_string()];
        for k in &keys {
            dispatch.kv_transfers(k, 1);
        }
        Self {
            dispatch: dispatch.clone(),
            keys,
        }
    }
}

impl Drop for KvClock {
    fn drop(&mut self) {
        for k in &self.keys {
            self.dispatch.kv_transfers(k, -1);
        }
    }
}

/// How a split attempt's prefill went, for pay and standing.
#[derive(Debug, Clone, Default)]
pub(super) struct Prefilled {
    /// Prompt tokens P computed and had cached, once it ended.
    pub(super) counts: Option<(usize, usize)>,
    /// Whether D used P's KV (`None`: not known yet).
    pub(super) imported: Option<bool>,
    /// P failed, was lost or timed out.
    pub(super) failed: bool,
    /// When P was told to prefill, and when its first token came.
    pub(super) timing: Option<Timing>,
}

/// One transfer's state while the attempt runs.
struct Transfer {
    /// The decode and prefill workers, and the transfer's id.
    d: String,
    p: String,
    id: u64,
    /// P was told to prefill (D said what it lacks).
    asked: bool,
    /// The prefill's outcome is known (ended, failed or given up).
    decided: bool,
    /// The next silence that ends something: the transfer's, then the
    /// decode's progress.
    deadline: Deadline,
    started: Deadline,
    /// The decode's allowance, counted from the transfer's end.
    allowance: Duration,
    hard_end: Deadline,
    /// The KV moves from the prefill's start to its end (or failure).
    clock: Option<KvClock>,
    arrivals: VecDeque<Instant>,
}

impl Relay {
    /// Runs attempt `attempt` split: prefill on `plan.prefill`, decode on
    /// worker `d`; the prefill's outcome is left in `now.prefilled`.
    pub(super) async fn on_split(&mut self, d: &str, plan: &SplitPlan, attempt: u32) -> Attempt {
        let fleet = self.dispatch.fleet.clone();
        let Target::Worker { worker: p, .. } = &plan.prefill else {
            return self.on_worker(d, attempt).await;
        };
        let transfer = fleet.jobs.next_id();
        let (ttx, mut trx) = mpsc::unbounded_channel();
        fleet.transfers.open(transfer, p, d, ttx);
        let (jtx, mut jrx) = mpsc::unbounded_channel();
        fleet.jobs.place(self.choice.job, d, attempt, jtx);
        self.now.prefilled = Some(Prefilled::default());
        let kv = Some(KvIncoming { transfer });
        let assign = self.assignment(attempt, job_params(&self.choice.request.params, d), kv);
        let outcome = if fleet.send(d, assign).await {
            let started = Deadline::now();
            let allowance = self.allowance(d);
            let mut t = Transfer {
                d: d.to_string(),
                p: p.clone(),
                id: transfer,
                asked: false,
                decided: false,
                deadline: started + self.dispatch.config.progress,
                started,
                allowance,
                // The whole attempt: the transfer, then the decode's allowance.
                hard_end: started + self.dispatch.config.kv_timeout + allowance,
                clock: None,
                arrivals: VecDeque::new(),
            };
            self.split_loop(&mut t, &mut trx, &mut jrx).await
        } else {
            Attempt::Lost("the worker is gone".into())
        };
        if let Some(moved) = fleet.transfers.close(transfer)
            && let Some(span) = moved.span
        {
            let split = &self.dispatch.stats.split;
            split.measured_link(p, moved.bytes, span);
        }
        outcome
    }

    async fn split_loop(
        &mut self,
        t: &mut Transfer,
        trx: &mut mpsc::UnboundedReceiver<TransferEvent>,
        jrx: &mut mpsc::UnboundedReceiver<JobEvent>,
    ) -> Attempt {
        loop {
            if t.decided && t.clock.is_some() {
                t.clock = None;
                t.hard_end = t.hard_end.min(Deadline::now() + t.allowance);
            }
            tokio::select! {
                ev = trx.recv() => {
                    if let Some(end) = self.on_transfer(ev, t).await {
                        return end;
                    }
                }
                ev = jrx.recv() => {
                    if let Some(end) = self.on_decode(ev, t).await {
                        return end;
                    }
                }
                _ = tokio::time::sleep_until(t.deadline.min(t.hard_end)) => {
                    if let Some(end) = self.on_silence(t).await {
                        return end;
                    }
                }
                r = self.client.abort.changed() => {
                    if r.is_err() || *self.client.abort.borrow() {
                        self.stop_both(t).await;
                        self.finish(FinishReason::Abort, 0);
                        return Attempt::Over;
                    }
                }
            }
        }
    }

    /// One event of the transfer; `Some` ends the attempt.
    async fn on_transfer(
        &mut self,
        ev: Option<TransferEvent>,
        t: &mut Transfer,
    ) -> Option<Attempt> {
        match ev {
            Some(TransferEvent::Want { from }) if !t.asked && !t.decided => {
                self.kv_wanted(t, from).await;
                None
            }
            Some(TransferEvent::End {
                tokens,
                digest,
                first,
                cached_tokens,
            }) if t.asked && !t.decided => {
                let end = ToWorker::KvEnd {
                    v: VERSION,
                    transfer: t.id,
                    tokens,
                    digest,
                    first: first.clone(),
                };
                self.kv_ended(t, end, first, cached_tokens).await
            }
            Some(TransferEvent::Failed(why) | TransferEvent::Lost(why)) if !t.decided => {
                t.decided = true;
                let asked = t.asked;
                self.end_prefill(t, &why, asked).await;
                None
            }
            Some(TransferEvent::Result { imported, reason }) => {
                self.dispatch.stats.split.transferred(if imported {
                    TransferEnd::Imported
                } else {
                    TransferEnd::Recomputed
                });
                if !imported {
                    tracing::warn!(job = self.choice.job, transfer = t.id, reason = %reason, "the decode worker recomputed the prompt");
                }
                self.set_prefill(|s| s.imported = Some(imported));
                None
            }
            _ => None,
        }
    }

    /// D said which positions it lacks: P is told to prefill them.
    async fn kv_wanted(&mut self, t: &mut Transfer, from: u32) {
        if from as usize >= self.choice.request.prompt_tokens.len() {
            // Nothing to send past the prompt: a broken answer.
            t.decided = true;
            let why = "the decode worker asked past the prompt";
            self.end_prefill(t, why, false).await;
            return;
        }
        t.asked = true;
        t.deadline = Deadline::now() + self.dispatch.config.kv_timeout;
        self.set_prefill(|s| s.timing = Some(Timing::start()));
        self.dispatch.started(&t.p, true);
        t.clock = Some(KvClock::open(&self.dispatch, &t.p, &t.d));
        let prefill = ToWorker::Prefill {
            v: VERSION,
            transfer: t.id,
            model: self.choice.model.clone(),
            prompt: self.choice.request.prompt_tokens.clone(),
            params: job_params(&self.choice.request.params, &t.p),
            from,
        };
        if !self.dispatch.fleet.send(&t.p, prefill).await {
            t.decided = true;
            self.end_prefill(t, "the prefill worker is gone", true)
                .await;
        }
    }

    /// P sent every frame and the first token: `end` goes on to D, the
    /// token to the client.
    async fn kv_ended(
        &mut self,
        t: &mut Transfer,
        end: ToWorker,
        first: JobToken,
        cached_tokens: u32,
    ) -> Option<Attempt> {
        t.decided = true;
        self.dispatch.measure(&t.p, Measure::prefill_done);
        // The prompt is this server's count, never the worker's; its
        // cache can only lower its pay.
        let prompt = self.choice.request.prompt_tokens.len();
        self.set_prefill(|s| {
            s.counts = Some((prompt, (cached_tokens as usize).min(prompt)));
            if let Some(timing) = &mut s.timing {
                timing.token();
            }
        });
        self.dispatch.fleet.send(&t.d, end).await;
        let logprob = first.logprob.map(|logprob| TokenLogprob {
            token: first.id,
            logprob,
            top: first.top,
        });
        let token = CoreEvent::Token {
            id: first.id,
            logprob,
        };
        let p = t.p.clone();
        if let Some(done) = self.forward(token, &p, &mut t.arrivals) {
            return Some(done);
        }
        let reason = self.already_over()?;
        cancel(&self.dispatch.fleet, &t.d, self.choice.job).await;
        self.finish(reason, cached_tokens as usize);
        Some(Attempt::Over)
    }

    /// One event of D's job; `Some` ends the attempt.
    async fn on_decode(&mut self, ev: Option<JobEvent>, t: &mut Transfer) -> Option<Attempt> {
        let ev = match ev {
            Some(JobEvent::Core(ev)) => ev,
            Some(JobEvent::Lost(why)) => {
                self.stop_prefill(t).await;
                return Some(Attempt::Lost(why));
            }
            Some(JobEvent::Embedded(_)) => {
                self.stop_prefill(t).await;
                let why = "the worker answered a generation with vectors";
                return Some(Attempt::Lost(why.into()));
            }
            None => return Some(Attempt::Lost("the worker is gone".into())),
        };
        if matches!(ev, CoreEvent::Token { .. }) {
            let progress = Deadline::now() + self.dispatch.config.progress;
            t.deadline = t.deadline.max(progress);
        }
        match self.vet(ev, false) {
            Err(end) => {
                self.stop_both(t).await;
                Some(end)
            }
            Ok(ev) => {
                let d = t.d.clone();
                let done = self.forward(ev, &d, &mut t.arrivals)?;
                self.stop_prefill(t).await;
                Some(done)
            }
        }
    }

    /// A deadline passed: the attempt's allowance (lost), the transfer's
    /// (D recomputes), or the decode's progress (lost).
    async fn on_silence(&mut self, t: &mut Transfer) -> Option<Attempt> {
        if Deadline::now() >= t.hard_end {
            self.stop_both(t).await;
            let s = t.hard_end.duration_since(t.started).as_secs_f64();
            return Some(Attempt::Lost(format!(
                "past the attempt's deadline of {s:.1} s"
            )));
        }
        if t.asked && !t.decided {
            t.decided = true;
            t.deadline = Deadline::now() + self.dispatch.config.progress;
            self.end_prefill(t, "the KV transfer timed out", true).await;
            return None;
        }
        self.stop_both(t).await;
        let s = self.dispatch.config.progress.as_secs_f64();
        Some(Attempt::Lost(format!("no progress for {s} s")))
    }

    /// Cancels D's job, and P's prefill while it runs.
    async fn stop_both(&self, t: &Transfer) {
        cancel(&self.dispatch.fleet, &t.d, self.choice.job).await;
        self.stop_prefill(t).await;
    }

    /// Cancels P's prefill while it runs.
    async fn stop_prefill(&self, t: &Transfer) {
        if !t.decided {
            cancel(&self.dispatch.fleet, &t.p, t.id).await;
        }
    }

    fn set_prefill(&mut self, f: impl FnOnce(&mut Prefilled)) {
        if let Some(s) = &mut self.now.prefilled {
            f(s);
        }
    }

    /// The prefill failed (or P was lost before it was `asked`): D
    /// recomputes, P is stopped and counted lost.
    async fn end_prefill(&mut self, t: &Transfer, why: &str, asked: bool) {
        tracing::warn!(job = self.choice.job, transfer = t.id, prefill = %t.p, reason = %why, "KV transfer ended; the decode worker recomputes");
        self.dispatch.stats.split.transferred(TransferEnd::Aborted);
        // Only a prefill that was started can have failed on P's side.
        if asked {
            self.dispatch.measure(&t.p, Measure::prefill_done);
            self.set_prefill(|s| s.failed = true);
        }
        let abort = ToWorker::KvAbort {
            v: VERSION,
            transfer: t.id,
            reason: why.to_string(),
        };
        self.dispatch.fleet.send(&t.d, abort).await;
        cancel(&self.dispatch.fleet, &t.p, t.id).await;
    }
}
