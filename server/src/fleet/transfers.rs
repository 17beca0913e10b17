//! KV transfers between workers, relayed by this server (prefill on one
//! worker, decode on another): which worker sends each transfer's frames
//! and which receives them, and where the control messages of both sides
//! go (the relay of the choice). A worker's frame or message reaches a
//! transfer only from the side it was given; a transfer that ended drops
//! late ones; one that never involved the worker is hostile (its session
//! is closed). When a prefill worker is lost, its transfers hear so.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::mpsc;

use super::assignments::Delivery;
use crate::telemetry::{IntCounter, int_counter};
use protocol::JobToken;

/// What a transfer's relay hears.
#[derive(Debug, Clone, PartialEq)]
pub enum TransferEvent {
    /// The decode side wants the KV from this position on.
    Want { from: u32 },
    /// The prefill side sent every frame.
    End {
        tokens: u32,
        digest: String,
        first: JobToken,
        /// What the prefill worker's prefix cache held (its own prompt
        /// count is not used: the server counts the prompt).
        cached_tokens: u32,
    },
    /// The prefill side failed.
    Failed(String),
    /// The decode side used the KV (`true`) or recomputed, and why.
    Result { imported: bool, reason: String },
    /// The prefill worker is gone.
    Lost(String),
}

/// Which side of a transfer a worker is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Prefill,
    Decode,
}

struct Route {
    source: String,
    dest: String,
    tx: mpsc::UnboundedSender<TransferEvent>,
    bytes: u64,
    first_frame: Option<Instant>,
    last_frame: Option<Instant>,
}

/// What a transfer moved, when it is closed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moved {
    /// Payload bytes relayed.
    pub bytes: u64,
    /// From the first frame to the last (none with fewer than two).
    pub span: Option<std::time::Duration>,
}

/// Transfers open now, and the totals for `/metrics`.
pub struct Transfers {
    routes: Mutex<HashMap<u64, Route>>,
    /// Recently closed transfers with their two workers (late frames
    /// are stale, not hostile).
    closed: Mutex<VecDeque<(u64, String, String)>>,
    /// KV payload bytes and frames relayed.
    pub bytes: IntCounter,
    pub frames: IntCounter,
}

impl Default for Transfers {
    fn default() -> Self {
        Self {
            routes: Mutex::default(),
            closed: Mutex::default(),
            bytes: int_counter(
                "synor:kv_transfer_bytes_total",
                "KV payload bytes relayed between workers.",
            ),
            frames: int_counter(
                "synor:kv_transfer_frames_total",
                "KV frames relayed between workers.",
            ),
        }
    }
}

impl std::fmt::Debug for Transfers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfers").finish_non_exhaustive()
    }
}

const REMEMBER: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Transfers {
    /// Opens transfer `id` from `source` to `dest`; events go to `tx`.
    pub fn open(
        &self,
        id: u64,
        source: &str,
        dest: &str,
        tx: mpsc::UnboundedSender<TransferEvent>,
    ) {
        let route = Route {
            source: source.to_string(),
            dest: dest.to_string(),
            tx,
            bytes: 0,
            first_frame: None,
            last_frame: None,
        };
        lock(&self.routes).insert(id, route);
    }

    /// Closes transfer `id`: what it moved.
    pub fn close(&self, id: u64) -> Option<Moved> {
        let r = lock(&self.routes).remove(&id)?;
        let mut closed = lock(&self.closed);
        closed.push_back((id, r.source, r.dest));
        if closed.len() > REMEMBER {
            closed.pop_front();
        }
        let span = r.first_frame.zip(r.last_frame).map(|(a, b)| b - a);
        Some(Moved {
            bytes: r.bytes,
            span,
        })
    }

    fn was(&self, id: u64, worker: &str) -> bool {
        lock(&self.closed)
            .iter()
            .any(|(t, s, d)| *t == id && (s == worker || d == worker))
    }

    /// A frame of `payload` bytes from `worker` for transfer `id`: the
    /// worker it goes to when delivered.
    pub fn frame(&self, worker: &str, id: u64, payload: usize) -> (Delivery, Option<String>) {
        let mut routes = lock(&self.routes);
        match routes.get_mut(&id) {
            Some(r) if r.source == worker => {
                let now = Instant::now();
                r.first_frame.get_or_insert(now);
                r.last_frame = Some(now);
                r.bytes += payload as u64;
                self.bytes.inc_by(payload as u64);
                self.frames.inc();
                (Delivery::Delivered, Some(r.dest.clone()))
            }
            Some(_) => (Delivery::NotYours, None),
            None if self.was(id, worker) => (Delivery::Stale, None),
            None => (Delivery::NotYours, None),
        }
    }

    /// Hands a control message of `worker`, on `side`, to transfer `id`.
    pub fn event(&self, worker: &str, side: Side, id: u64, ev: TransferEvent) -> Delivery {
        let routes = lock(&self.routes);
        match routes.get(&id) {
            Some(r) => {
                let mine = match side {
                    Side::Prefill => r.source == worker,
                    Side::Decode => r.dest == worker,
                };
                if !mine {
                    return Delivery::NotYours;
                }
                let _ = r.tx.send(ev);
                Delivery::Delivered
            }
            None if self.was(id, worker) => Delivery::Stale,
            None => Delivery::NotYours,
        }
    }

    /// `worker` is gone: the transfers it sends hear so.
    pub fn lost(&self, worker: &str) {
        for r in lock(&self.routes).values().filter(|r| r.source == worker) {
            let _ =
                r.tx.send(TransferEvent::Lost("the prefill worker is gone".into()));
        }
    }

    /// Transfers open now.
    pub fn open_count(&self) -> usize {
        lock(&self.routes).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_messages_reach_a_transfer_only_from_its_own_side() {
        let t = Transfers::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        t.open(7, "p", "d", tx);
        assert_eq!(
            t.frame("p", 7, 100),
            (Delivery::Delivered, Some("d".into()))
        );
        assert_eq!(
            t.frame("d", 7, 100).0,
            Delivery::NotYours,
            "the receiver sends no frames"
        );
        assert_eq!(t.frame("x", 7, 100).0, Delivery::NotYours);
        assert_eq!(t.frame("p", 8, 100).0, Delivery::NotYours, "never opened");
        let want = TransferEvent::Want { from: 16 };
        assert_eq!(
            t.event("d", Side::Decode, 7, want.clone()),
            Delivery::Delivered
        );
        assert_eq!(
            t.event("p", Side::Decode, 7, want.clone()),
            Delivery::NotYours
        );
        assert_eq!(rx.try_recv(), Ok(want));
        t.lost("d");
        assert!(rx.try_recv().is_err(), "the receiver's loss is the job's");
        t.lost("p");
        assert!(matches!(rx.try_recv(), Ok(TransferEvent::Lost(_))));
        t.frame("p", 7, 50);
        let moved = t.close(7).expect("open");
        assert_eq!(moved.bytes, 150);
        assert!(moved.span.is_some());
        assert_eq!(t.frame("p", 7, 1).0, Delivery::Stale, "late, not hostile");
        assert_eq!(
            t.event("d", Side::Decode, 7, TransferEvent::Failed("x".into())),
            Delivery::Stale
        );
        assert_eq!(t.frame("q", 7, 1).0, Delivery::NotYours);
        assert_eq!(t.bytes.get(), 150);
        assert_eq!(t.open_count(), 0);
    }
}
