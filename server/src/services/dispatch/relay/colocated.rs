//! An attempt on one executor: the house engine (its events forwarded
//! until the end, an abort passed on), or one worker, watched by this
//! server's clock: progress is measured from the attempt's last token,
//! the whole attempt has an allowance from the worker's calibrated step,
//! a worker that sent the answer's last token has `END_WITHIN` to send
//! its end, a cancelled one `CANCEL_WAIT` to confirm, and a choice a
//! worker has not started after `--fleet-steal-after-ms` goes to an idle
//! worker.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use engine::core::CoreEvent;
use engine::{EngineError, FinishReason};
use tokio::sync::mpsc;
use tokio::time::error::Elapsed;

use super::{Attempt, Relay, cancel, job_params};
use crate::fleet::assignments::JobEvent;
use crate::services::dispatch::{CANCEL_WAIT, HOUSE, MAX_ATTEMPTS};

/// The longest any attempt may take (a bound on a slow profile's
/// allowance).
const MAX_ATTEMPT: Duration = Duration::from_secs(86_400);

/// The least time an attempt is allowed per token it may produce.
const MIN_TOKEN_ALLOWANCE: Duration = Duration::from_millis(250);

/// How long a worker has to send its `done` after the last token of the
/// answer (an honest one sends both in the same breath).
const END_WITHIN: Duration = Duration::from_secs(2);

/// How often a queued attempt looks for an idle worker to take it.
const STEAL_LOOK: Duration = Duration::from_millis(100);

/// The clocks of one attempt on a worker.
struct Watch {
    started: Instant,
    /// Tokens delivered before it started.
    before: usize,
    /// Its whole allowance ends here.
    hard_end: Instant,
    /// Its last token (only tokens count: `accepted` does not).
    last_token: Instant,
    /// When this server cancelled it.
    cancelled: Option<Instant>,
    arrivals: VecDeque<Instant>,
}

impl Relay {
    pub(super) async fn on_house(&mut self) -> Attempt {
        let req = self.choice.request.clone();
        let mut raw = match self.house.submit_raw(req, self.client.delivered.clone()) {
            Ok(r) => r,
            Err(e) => {
                self.client.send(CoreEvent::Failed(e));
                return Attempt::Over;
            }
        };
        let mut arrivals = VecDeque::new();
        let mut aborted = false;
        loop {
            tokio::select! {
                ev = raw.next() => match ev {
                    Some(ev) => {
                        if let Some(done) = self.forward(ev, HOUSE, &mut arrivals) {
                            return done;
                        }
                    }
                    None => {
                        self.client.send(CoreEvent::Failed(EngineError::Shutdown));
                        return Attempt::Over;
                    }
                },
                r = self.client.abort.changed(), if !aborted => {
                    aborted = true;
                    if r.is_err() || *self.client.abort.borrow() {
                        raw.abort();
                    }
                }
            }
        }
    }

    pub(super) async fn on_worker(&mut self, worker: &str, attempt: u32) -> Attempt {
        let fleet = self.dispatch.fleet.clone();
        let (jtx, mut jrx) = mpsc::unbounded_channel();
        fleet.jobs.place(self.choice.job, worker, attempt, jtx);
        let params = job_params(&self.choice.request.params, worker);
        if !fleet
            .send(worker, self.assignment(attempt, params, None))
            .await
        {
            return Attempt::Lost("the worker is gone".into());
        }
        let now = Instant::now();
        let mut w = Watch {
            started: now,
            before: self.client.delivered.len(),
            hard_end: now + self.allowance(worker),
            last_token: now,
            cancelled: None,
            arrivals: VecDeque::new(),
        };
        let mut look = tokio::time::interval(STEAL_LOOK);
        loop {
            let patience = self.patience(&w);
            let may_steal = w.cancelled.is_none()
                && self.client.delivered.len() == w.before
                && attempt < MAX_ATTEMPTS;
            tokio::select! {
                _ = look.tick(), if may_steal => {
                    if w.started.elapsed() >= self.dispatch.config.steal_after
                        && self.dispatch.idle_worker(&self.choice.model, worker)
                    {
                        cancel(&fleet, worker, self.choice.job).await;
                        return Attempt::Stolen;
                    }
                }
                ev = tokio::time::timeout(patience, jrx.recv()) => {
                    if let Some(end) = self.on_job_event(ev, &mut w, worker).await {
                        return end;
                    }
                }
                r = self.client.abort.changed(), if w.cancelled.is_none() => {
                    if r.is_err() || *self.client.abort.borrow() {
                        cancel(&fleet, worker, self.choice.job).await;
                        w.cancelled = Some(Instant::now());
                    }
                }
            }
        }
    }

    /// How long the attempt may stay silent now.
    fn patience(&self, w: &Watch) -> Duration {
        match w.cancelled {
            Some(at) => CANCEL_WAIT.saturating_sub(at.elapsed()),
            None if self.already_over().is_some() => {
                END_WITHIN.saturating_sub(w.last_token.elapsed())
            }
            None => self
                .dispatch
                .config
                .progress
                .saturating_sub(w.last_token.elapsed())
                .min(w.hard_end.saturating_duration_since(Instant::now())),
        }
    }

    /// One event of the job (or the silence's end); `Some` ends the
    /// attempt.
    async fn on_job_event(
        &mut self,
        ev: Result<Option<JobEvent>, Elapsed>,
        w: &mut Watch,
        worker: &str,
    ) -> Option<Attempt> {
        let live = w.cancelled.is_none();
        match ev {
            Ok(Some(JobEvent::Core(ev))) => {
                if matches!(ev, CoreEvent::Token { .. }) {
                    w.last_token = Instant::now();
                }
                match self.vet(ev, !live) {
                    Ok(ev) => self.forward(ev, worker, &mut w.arrivals),
                    Err(end) => {
                        cancel(&self.dispatch.fleet, worker, self.choice.job).await;
                        Some(end)
                    }
                }
            }
            Ok(Some(JobEvent::Lost(why))) if live => Some(Attempt::Lost(why)),
            Ok(Some(JobEvent::Embedded(_))) if live => Some(Attempt::Lost(
                "the worker answered a generation with vectors".into(),
            )),
            Ok(None) if live => Some(Attempt::Lost("the worker is gone".into())),
            Err(_) if live => Some(self.silent(w, worker).await),
            // Cancelled and the worker went quiet or away: end here.
            Ok(Some(JobEvent::Lost(_) | JobEvent::Embedded(_)) | None) | Err(_) => {
                self.finish(FinishReason::Abort, 0);
                Some(Attempt::Over)
            }
        }
    }

    /// The worker stayed silent past its patience: the answer ends where
    /// this server counted it, or the attempt is lost.
    async fn silent(&mut self, w: &Watch, worker: &str) -> Attempt {
        cancel(&self.dispatch.fleet, worker, self.choice.job).await;
        if let Some(reason) = self.already_over() {
            self.violated("no end after the answer's last token");
            self.finish(reason, 0);
            return Attempt::Over;
        }
        if Instant::now() >= w.hard_end {
            let s = w.hard_end.duration_since(w.started).as_secs_f64();
            return Attempt::Lost(format!("past the attempt's deadline of {s:.1} s"));
        }
        let s = self.dispatch.config.progress.as_secs_f64();
        Attempt::Lost(format!("no progress for {s} s"))
    }

    /// How long an attempt on `worker` may take in all: the progress
    /// timeout, then for each token it may still produce twenty of its
    /// calibrated decode steps (at four sequences) or `MIN_TOKEN_ALLOWANCE`,
    /// whichever is longer (a tenth of the progress timeout before it is
    /// calibrated). A worker that trickles one token per progress timeout
    /// cannot hold a client for minutes.
    pub(super) fn allowance(&self, worker: &str) -> Duration {
        let progress = self.dispatch.config.progress;
        let mut step_ms = None;
        self.dispatch
            .measure(worker, |m| step_ms = m.profile.map(|p| p.decode_step_ms_4));
        let per_token = step_ms.map_or(progress / 10, |ms| {
            Duration::from_secs_f64(20.0 * ms.max(0.0) / 1e3).max(MIN_TOKEN_ALLOWANCE)
        });
        let max_tokens = self.choice.request.params.max_tokens;
        let left = max_tokens.saturating_sub(self.client.delivered.len());
        let tokens = per_token.saturating_mul(u32::try_from(left).unwrap_or(u32::MAX));
        progress.saturating_add(tokens).min(MAX_ATTEMPT)
    }
}
