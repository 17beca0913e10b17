//! Jobs placed on workers: which worker runs each attempt of each job, and
//! where that attempt's events go. A worker's messages reach a job only if
//! the job's current attempt is on that worker; late messages of an
//! earlier attempt are dropped; a message for a job the worker was never
//! given is hostile (its session is closed). When a worker is lost, every
//! job on it hears so at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use engine::core::CoreEvent;
use tokio::sync::mpsc;

/// What a job's relay hears about its current attempt.
#[derive(Debug)]
pub enum JobEvent {
    /// The worker's engine produced this.
    Core(CoreEvent),
    /// The attempt is gone (worker lost, failed, or refused it): replay.
    Lost(String),
    /// An embedding job's vectors.
    Embedded(engine::Embeddings),
}

struct Slot {
    worker: String,
    attempt: u32,
    tx: mpsc::UnboundedSender<JobEvent>,
    /// Every worker this job was ever placed on.
    history: Vec<String>,
}

/// Whether a worker's message was for one of its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Handed to the job's relay.
    Delivered,
    /// An earlier attempt's, or a finished job's: dropped.
    Stale,
    /// A job this worker was never given.
    NotYours,
}

/// The table of jobs running on workers.
pub struct Jobs {
    slots: Mutex<HashMap<u64, Slot>>,
    next: AtomicU64,
    /// Ids of jobs that ended, most recent last, to tell a late message
    /// (stale) from a made-up one (not yours).
    ended: Mutex<std::collections::VecDeque<(u64, Vec<String>)>>,
}

impl Default for Jobs {
    /// Ids start at a random multiple of 2^32 (below 2^52, exact in any
    /// JSON reader): replicas sharing workers never hand out the same id.
    fn default() -> Self {
        let base = (rand::random::<u64>() % (1 << 20)) << 32;
        Self {
            slots: Mutex::default(),
            next: AtomicU64::new(base),
            ended: Mutex::default(),
        }
    }
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").finish_non_exhaustive()
    }
}

/// Ended jobs remembered for telling stale messages apart.
const REMEMBER: usize = 4096;

impl Jobs {
    /// A fresh job id.
    pub fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Places attempt `attempt` of `job` on `worker`; its events go to `tx`.
    pub fn place(&self, job: u64, worker: &str, attempt: u32, tx: mpsc::UnboundedSender<JobEvent>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(job).or_insert_with(|| Slot {
            worker: String::new(),
            attempt: 0,
            tx: tx.clone(),
            history: Vec::new(),
        });
        slot.worker = worker.to_string();
        slot.attempt = attempt;
        slot.tx = tx;
        slot.history.push(worker.to_string());
    }

    /// The job ended (or moved to the house engine): forget it.
    pub fn end(&self, job: u64) {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&job);
        if let Some(s) = slot {
            let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
            ended.push_back((job, s.history));
            if ended.len() > REMEMBER {
                ended.pop_front();
            }
        }
    }

    /// Routes a worker's event for (`job`, `attempt`).
    pub fn deliver(&self, worker: &str, job: u64, attempt: u32, ev: JobEvent) -> Delivery {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots.get(&job) {
            Some(s) if s.worker == worker && s.attempt == attempt => {
                let _ = s.tx.send(ev);
                Delivery::Delivered
            }
            Some(s) if s.history.iter().any(|w| w == worker) => Delivery::Stale,
            Some(_) => Delivery::NotYours,
            None => {
                let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
                if ended
                    .iter()
                    .any(|(j, h)| *j == job && h.iter().any(|w| w == worker))
                {
                    Delivery::Stale
                } else {
                    Delivery::NotYours
                }
            }
        }
    }

    /// Ends `job` if its current attempt is still `attempt` (a relay for
    /// another replica, after the attempt's last event).
    pub fn end_attempt(&self, job: u64, attempt: u32) {
        let current = {
            let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.get(&job).is_some_and(|s| s.attempt == attempt)
        };
        if current {
            self.end(job);
        }
    }

    /// `worker` is gone: every job whose current attempt ran there hears it.
    pub fn lost(&self, worker: &str, why: &str) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for s in slots.values().filter(|s| s.worker == worker) {
            let _ = s.tx.send(JobEvent::Lost(why.to_string()));
        }
    }

    /// Jobs whose current attempt runs on `worker`.
    pub fn on(&self, worker: &str) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.values().filter(|s| s.worker == worker).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_only_the_current_attempt_and_strangers_are_caught() {
        let jobs = Jobs::default();
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let j = jobs.next_id();
        jobs.place(j, "a", 1, tx1);
        let ev = || JobEvent::Core(CoreEvent::Accepted);
        assert_eq!(jobs.deliver("a", j, 1, ev()), Delivery::Delivered);
        assert!(matches!(
            rx1.try_recv(),
            Ok(JobEvent::Core(CoreEvent::Accepted))
        ));
        assert_eq!(jobs.deliver("b", j, 1, ev()), Delivery::NotYours);
        assert_eq!(jobs.deliver("a", j + 1, 1, ev()), Delivery::NotYours);
        // Worker `a` is lost; the job moves to `b` as attempt 2.
        jobs.lost("a", "gone");
        assert!(matches!(rx1.try_recv(), Ok(JobEvent::Lost(_))));
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        jobs.place(j, "b", 2, tx2);
        assert_eq!(jobs.deliver("a", j, 1, ev()), Delivery::Stale);
        assert_eq!(jobs.deliver("b", j, 1, ev()), Delivery::Stale);
        assert_eq!(jobs.deliver("b", j, 2, ev()), Delivery::Delivered);
        assert!(rx2.try_recv().is_ok());
        assert_eq!(jobs.on("b"), 1);
        jobs.end(j);
        assert_eq!(jobs.on("b"), 0);
        assert_eq!(jobs.deliver("b", j, 2, ev()), Delivery::Stale);
        assert_eq!(jobs.deliver("c", j, 2, ev()), Delivery::NotYours);
    }
}
