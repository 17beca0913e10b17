//! Pipeline stage steps in flight on this replica's workers. A caller (the
//! engine thread of a layer-sharded model) opens a call for one worker's
//! step, sends it, and waits with a deadline; the worker's session hands
//! its hidden-state frames and its `stage_done` (or `stage_failed`) here,
//! and the call answers once it has every row it expects (or the tokens
//! its last stage sampled). A frame or an answer for a step the worker was
//! never given is a protocol violation (`Delivery::NotYours`); one for a
//! step whose caller gave up is dropped (`Stale`). A worker that leaves
//! fails its calls at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use protocol::JobToken;
use protocol::stage::{HiddenAssembly, decode_hidden};

use super::assignments::Delivery;

/// What a stage step gave.
#[derive(Debug, Clone, PartialEq)]
pub enum StageReply {
    /// Every row's hidden state (`[rows, hidden]`).
    Hidden(Vec<f32>),
    /// Each chunk's sampled tokens (the last stage).
    Tokens(Vec<Vec<JobToken>>),
}

/// Where a call's answer goes.
pub type Answer = mpsc::Receiver<Result<StageReply, String>>;

struct Call {
    worker: String,
    hidden: usize,
    /// The rows coming back (none from a last stage).
    assembly: Option<HiddenAssembly>,
    reply: mpsc::Sender<Result<StageReply, String>>,
}

/// The table of stage steps in flight.
#[derive(Default)]
pub struct StageCalls {
    calls: Mutex<HashMap<u64, Call>>,
    next: AtomicU64,
}

impl StageCalls {
    /// Opens a call on `worker` for a step whose output is `rows` hidden
    /// rows of width `hidden` (0 rows: the last stage, which answers with
    /// tokens); its step id and where its answer comes.
    pub fn open(&self, worker: &str, hidden: usize, rows: usize) -> (u64, Answer) {
        let step = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (reply, answer) = mpsc::channel();
        let call = Call {
            worker: worker.to_string(),
            hidden,
            assembly: (rows > 0).then(|| HiddenAssembly::new(rows, hidden)),
            reply,
        };
        self.lock().insert(step, call);
        (step, answer)
    }

    /// The caller stopped waiting for `step`.
    pub fn close(&self, step: u64) {
        self.lock().remove(&step);
    }

    /// A hidden-state frame `worker` sent. A frame it cannot decode, or
    /// one over rows it already sent, fails the call (the caller sees the
    /// worker's fault), and is still the worker's.
    pub fn frame(&self, worker: &str, bytes: &[u8]) -> Delivery {
        let step = match protocol::stage::hidden_step(bytes) {
            Some(s) => s,
            None => return Delivery::NotYours,
        };
        let mut calls = self.lock();
        let Some(call) = calls.get_mut(&step) else {
            drop(calls);
            return self.unknown(step);
        };
        if call.worker != worker {
            return Delivery::NotYours;
        }
        let added = decode_hidden(bytes, call.hidden)
            .map_err(|e| e.to_string())
            .and_then(|rows| match call.assembly.as_mut() {
                Some(a) => a.add(&rows),
                None => Err("hidden states from the last stage".into()),
            });
        if let Err(why) = added
            && let Some(call) = calls.remove(&step)
        {
            let _ = call.reply.send(Err(format!("stage {worker}: {why}")));
        }
        Delivery::Delivered
    }

    /// `worker` finished `step`: the call answers with its rows (all of
    /// them must have come) or, from the last stage, `tokens`.
    pub fn done(&self, worker: &str, step: u64, tokens: Vec<Vec<JobToken>>) -> Delivery {
        let Some(call) = self.take(worker, step) else {
            return self.unknown(step);
        };
        let answer = match call.assembly {
            Some(a) if tokens.is_empty() => a.finish().map(StageReply::Hidden),
            Some(_) => Err("tokens from a stage that is not the last".into()),
            None => Ok(StageReply::Tokens(tokens)),
        };
        let _ = call
            .reply
            .send(answer.map_err(|why| format!("stage {worker}: {why}")));
        Delivery::Delivered
    }

    /// `worker` failed `step`.
    pub fn failed(&self, worker: &str, step: u64, message: &str) -> Delivery {
        let Some(call) = self.take(worker, step) else {
            return self.unknown(step);
        };
        let _ = call.reply.send(Err(format!("stage {worker}: {message}")));
        Delivery::Delivered
    }

    /// `worker` left: its calls fail now.
    pub fn lost(&self, worker: &str) {
        let mut calls = self.lock();
        let steps: Vec<u64> = calls
            .iter()
            .filter(|(_, c)| c.worker == worker)
            .map(|(&s, _)| s)
            .collect();
        for s in steps {
            if let Some(c) = calls.remove(&s) {
                let _ = c
                    .reply
                    .send(Err(format!("stage {worker}: the worker disconnected")));
            }
        }
    }

    /// Calls in flight.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The call `step` if it is `worker`'s.
    fn take(&self, worker: &str, step: u64) -> Option<Call> {
        let mut calls = self.lock();
        match calls.get(&step) {
            Some(c) if c.worker == worker => calls.remove(&step),
            _ => None,
        }
    }

    /// Why an answer matched no call of its worker: a step never opened
    /// (or another worker's) is not its own; one already closed is stale.
    fn unknown(&self, step: u64) -> Delivery {
        let opened = step > 0 && step <= self.next.load(Ordering::Relaxed);
        if opened && !self.lock().contains_key(&step) {
            Delivery::Stale
        } else {
            Delivery::NotYours
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Call>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::stage::hidden_frames;

    #[test]
    fn a_call_answers_with_every_row_once_from_its_own_worker_only() {
        let calls = StageCalls::default();
        let (step, answer) = calls.open("w1", 4, 3);
        let rows: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let frames = hidden_frames(step, 4, &rows);
        assert_eq!(calls.frame("w2", &frames[0]), Delivery::NotYours);
        assert_eq!(calls.frame("w1", &frames[0]), Delivery::Delivered);
        assert_eq!(calls.done("w2", step, vec![]), Delivery::NotYours);
        assert_eq!(calls.done("w1", step, vec![]), Delivery::Delivered);
        assert_eq!(answer.recv().expect("answer"), Ok(StageReply::Hidden(rows)));
        assert!(calls.is_empty());
        // Answers after the call ended are stale; unknown steps are not.
        assert_eq!(calls.done("w1", step, vec![]), Delivery::Stale);
        assert_eq!(calls.done("w1", step + 5, vec![]), Delivery::NotYours);
        assert_eq!(calls.frame("w1", &frames[0]), Delivery::Stale);
        let never = hidden_frames(step + 5, 4, &[0.0; 4]).remove(0);
        assert_eq!(calls.frame("w1", &never), Delivery::NotYours);
    }

    #[test]
    fn missing_rows_bad_frames_and_lost_workers_fail_the_call() {
        let calls = StageCalls::default();
        let (a, answer_a) = calls.open("w1", 4, 3);
        let half = hidden_frames(a, 4, &[1.0; 8]);
        calls.frame("w1", &half[0]);
        calls.done("w1", a, vec![]);
        assert!(answer_a.recv().expect("answer").is_err(), "a row missing");
        let (b, answer_b) = calls.open("w1", 4, 1);
        let mut bad = hidden_frames(b, 4, &[1.0; 4]).remove(0);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(calls.frame("w1", &bad), Delivery::Delivered);
        assert!(answer_b.recv().expect("answer").is_err(), "checksum");
        let (c, answer_c) = calls.open("w1", 4, 0);
        let tokens = vec![vec![JobToken {
            id: 7,
            logprob: None,
            top: vec![],
        }]];
        let (_, answer_d) = calls.open("w1", 4, 2);
        calls.done("w1", c, tokens.clone());
        assert_eq!(answer_c.recv().expect("c"), Ok(StageReply::Tokens(tokens)));
        calls.lost("w1");
        assert!(answer_d.recv().expect("d").is_err());
        assert!(calls.is_empty());
    }
}
