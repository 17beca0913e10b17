//! The workers connected to this server: what each registered (devices,
//! models, region), its last reported load and when it was last heard, and
//! a bounded channel to its session for the server's own messages (drain).
//! Sessions add and remove themselves; admins list and drain.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::sync::mpsc;

use super::protocol::{Ask, Device, Load, ServedModel, ToWorker};
use super::standing::Standing;

/// What the server measured of a worker on its own challenge (never what
/// the worker claims): prefill throughput and the decode step time at one
/// and at four sequences.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Profile {
    pub prefill_tokens_per_s: f64,
    pub decode_step_ms_1: f64,
    pub decode_step_ms_4: f64,
    /// Unix seconds.
    pub measured_at: i64,
}

impl Profile {
    /// The expected decode step with `batch` sequences (linear between the
    /// measured points, extended past them).
    pub fn step_ms(&self, batch: u32) -> f64 {
        let slope = ((self.decode_step_ms_4 - self.decode_step_ms_1) / 3.0).max(0.0);
        self.decode_step_ms_1 + slope * f64::from(batch.max(1) - 1)
    }
}

/// A worker as admins see it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct WorkerInfo {
    pub id: String,
    /// The provider account it earns for.
    pub provider_id: String,
    /// The token it connected with.
    pub token_id: String,
    pub name: String,
    pub build: String,
    /// The peer address of its connection.
    pub remote: String,
    /// What it detected (self-reported: shown, never trusted).
    pub devices: Vec<Device>,
    pub models: Vec<ServedModel>,
    pub threads: u32,
    pub region: String,
    /// Its prices per model (none: it takes the house's).
    pub asks: Vec<Ask>,
    /// Its provider's measured standing (basis points): reputation
    /// 0.5-2.0x and uptime.
    pub reputation_bps: i64,
    pub uptime_bps: i64,
    /// `calibrating` (measured before it gets work), `active`, or
    /// `draining` (no new work).
    pub state: String,
    /// What the server measured of it (`None` until calibrated).
    pub profile: Option<Profile>,
    /// Its last `status` (self-reported).
    pub load: Load,
    /// Choices of this server running on it now.
    pub jobs_running: u64,
    /// Tokens it delivered for this server, and attempts it lost.
    pub tokens_delivered: u64,
    pub jobs_lost: u64,
    /// Unix seconds.
    pub connected_at: i64,
    pub last_seen: i64,
}

/// What a session registers.
#[derive(Debug, Clone)]
pub struct Registration {
    pub provider_id: String,
    pub token_id: String,
    pub remote: String,
    pub name: String,
    pub build: String,
    pub devices: Vec<Device>,
    pub models: Vec<ServedModel>,
    pub threads: u32,
    pub region: String,
    pub asks: Vec<Ask>,
}

struct Entry {
    info: WorkerInfo,
    /// To the worker's session (bounded: a full queue drops the message
    /// and the session's own checks catch the worker up).
    to_session: mpsc::Sender<ToWorker>,
}

/// The registry of connected workers and of the jobs placed on them.
#[derive(Default)]
pub struct Registry {
    workers: RwLock<HashMap<String, Entry>>,
    /// Jobs running on workers (sessions route their messages here).
    pub jobs: super::jobs::Jobs,
    next: AtomicU64,
    /// Connections the fleet has seen end (for `/metrics`).
    pub disconnects: AtomicU64,
    /// Attempts lost on a worker and replayed elsewhere (for `/metrics`).
    pub replays: AtomicU64,
    /// Each provider's reputation and uptime, from what its workers do.
    pub standing: Standing,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("workers", &self.len())
            .finish_non_exhaustive()
    }
}

fn now() -> i64 {
    crate::store::now()
}

impl Registry {
    /// Adds a worker; returns its id (unique in this process).
    pub fn register(&self, r: Registration, to_session: mpsc::Sender<ToWorker>) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "worker-{}-{n}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let t = now();
        let info = WorkerInfo {
            id: id.clone(),
            provider_id: r.provider_id,
            token_id: r.token_id,
            name: r.name,
            build: r.build,
            remote: r.remote,
            devices: r.devices,
            models: r.models,
            threads: r.threads,
            region: r.region,
            asks: r.asks,
            reputation_bps: 0,
            uptime_bps: 0,
            state: "calibrating".into(),
            profile: None,
            load: Load::default(),
            jobs_running: 0,
            tokens_delivered: 0,
            jobs_lost: 0,
            connected_at: t,
            last_seen: t,
        };
        self.standing.connected(&info.provider_id, t);
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        w.insert(id.clone(), Entry { info, to_session });
        id
    }

    /// Records a worker's `status`.
    pub fn status(&self, id: &str, load: Load) {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = w.get_mut(id) {
            e.info.load = load;
            e.info.last_seen = now();
        }
    }

    /// Marks a worker draining (it said so, or an admin asked); with
    /// `tell`, its session is told to drain. False for an unknown id.
    pub fn drain(&self, id: &str, tell: bool) -> bool {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        let Some(e) = w.get_mut(id) else { return false };
        e.info.state = "draining".into();
        if tell {
            let _ = e.to_session.try_send(ToWorker::Drain {
                v: super::protocol::VERSION,
            });
        }
        true
    }

    /// Records a worker's measured profile; a calibrating worker becomes
    /// active (eligible for work).
    pub fn set_profile(&self, id: &str, p: Profile) {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = w.get_mut(id) {
            e.info.profile = Some(p);
            if e.info.state == "calibrating" {
                e.info.state = "active".into();
            }
        }
    }

    /// Drops a worker's ask for `model` (the market refused it).
    pub fn drop_ask(&self, id: &str, model: &str) {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = w.get_mut(id) {
            e.info.asks.retain(|a| a.model != model);
        }
    }

    /// Removes a worker whose session ended; its jobs hear it is lost.
    pub fn remove(&self, id: &str) {
        let removed = {
            let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
            w.remove(id)
        };
        if let Some(e) = removed {
            self.disconnects.fetch_add(1, Ordering::Relaxed);
            self.standing.disconnected(&e.info.provider_id, now());
        }
        self.jobs.lost(id, "the worker disconnected");
    }

    /// Sends `msg` to a worker's session (waiting while its queue is
    /// full); false if the worker is gone.
    pub async fn send(&self, id: &str, msg: ToWorker) -> bool {
        let tx = {
            let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
            w.get(id).map(|e| e.to_session.clone())
        };
        match tx {
            Some(tx) => tx.send(msg).await.is_ok(),
            None => false,
        }
    }

    /// Active workers that serve `model`.
    pub fn serving(&self, model: &str) -> Vec<WorkerInfo> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<WorkerInfo> = w
            .values()
            .filter(|e| e.info.state == "active" && e.info.models.iter().any(|m| m.name == model))
            .map(|e| e.info.clone())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Counts an attempt that ran on worker `id` of `provider`: the tokens
    /// it delivered and whether it was lost (on the provider's standing
    /// even when the worker is gone: a killed worker's loss is counted).
    pub fn record(&self, id: &str, provider: &str, tokens: usize, lost: bool) {
        self.standing.attempt(provider, lost);
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = w.get_mut(id) {
            e.info.tokens_delivered += tokens as u64;
            e.info.jobs_lost += u64::from(lost);
        }
    }

    /// Every connected worker, by id.
    pub fn list(&self) -> Vec<WorkerInfo> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<WorkerInfo> = w
            .values()
            .map(|e| {
                let r = self.standing.get(&e.info.provider_id);
                WorkerInfo {
                    jobs_running: self.jobs.on(&e.info.id) as u64,
                    reputation_bps: r.reputation_bps(),
                    uptime_bps: r.uptime_bps(now()),
                    ..e.info.clone()
                }
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    pub fn len(&self) -> usize {
        self.workers.read().map_or(0, |w| w.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
