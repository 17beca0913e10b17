//! Admission past saturation: when every executor worth using for a new
//! choice is at its batch cap, the choice waits for room (better than
//! slowing everyone down) in a bounded queue, each for a bounded time; a
//! full queue answers 503 before anything is streamed. A replay never
//! waits: it is already running for its client. A policy blind to load
//! (round-robin) never holds a choice back.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::Dispatch;
use super::decide::{Decision, Want};

/// The queue of choices waiting for an executor with room.
#[derive(Debug)]
pub(super) struct Admission {
    max_queue: usize,
    timeout: Duration,
    queued: AtomicUsize,
    /// Signalled whenever an attempt ends (an executor has room again).
    room: Notify,
}

/// How often a waiting choice looks again without a signal: caps also
/// grow, and profiles arrive, without an attempt ending.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

impl Admission {
    pub(super) fn new(max_queue: usize, timeout: Duration) -> Self {
        Self {
            max_queue,
            timeout,
            queued: AtomicUsize::new(0),
            room: Notify::new(),
        }
    }

    /// Choices waiting now.
    pub(super) fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }

    /// Whether no more choices may wait.
    pub(super) fn queue_full(&self) -> bool {
        self.queued() >= self.max_queue
    }

    /// An executor has room again: the waiting look.
    pub(super) fn room_made(&self) {
        self.room.notify_waiters();
    }

    /// Waits while `saturated()` holds, at most the queue's timeout;
    /// false when it timed out or the client left (`abort`).
    pub(super) async fn wait(
        &self,
        saturated: impl Fn() -> bool,
        abort: &mut watch::Receiver<bool>,
    ) -> bool {
        if !saturated() {
            return true;
        }
        self.queued.fetch_add(1, Relaxed);
        let deadline = tokio::time::Instant::now() + self.timeout;
        let ok = loop {
            if !saturated() {
                break true;
            }
            tokio::select! {
                _ = self.room.notified() => {}
                _ = tokio::time::sleep(LOOK_AGAIN) => {}
                _ = tokio::time::sleep_until(deadline) => break false,
                r = abort.changed() => if r.is_err() || *abort.borrow() { break false },
            }
        };
        self.queued.fetch_sub(1, Relaxed);
        ok
    }
}

impl Dispatch {
    /// Choices waiting for room now.
    pub fn queued(&self) -> usize {
        self.admission.queued()
    }

    /// Whether a new choice decided as `d` must wait for room.
    pub(super) fn must_wait(&self, d: &Decision) -> bool {
        d.full && self.policy.waits_for_room()
    }

    /// Whether the choice would go to an executor at its batch cap now.
    pub(super) fn saturated(&self, w: &Want<'_>) -> bool {
        self.policy.waits_for_room() && self.decide(w, &[], false).full
    }

    /// Waits until some executor for the choice has room; false when the
    /// wait timed out or the client left.
    pub(super) async fn wait_for_room(
        &self,
        w: &Want<'_>,
        abort: &mut watch::Receiver<bool>,
    ) -> bool {
        self.admission.wait(|| self.saturated(w), abort).await
    }
}
