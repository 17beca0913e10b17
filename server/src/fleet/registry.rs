//! The workers connected to this server: what each registered (devices,
//! models, region), its last reported load and when it was last heard, and
//! a bounded channel to its session for the server's own messages (drain).
//! Sessions add and remove themselves; admins list, pause, resume and
//! drain.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::mpsc;

use super::standing::Standing;
use protocol::stage::{HeldPart, PartOffer};
use protocol::{Ask, Device, Load, ServedModel, ToWorker};

pub use protocol::bus::{PREFILL_LONG, PREFILL_SHORT, Profile, WorkerInfo};

/// What became of an admin's pause or resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paused {
    /// The worker's new state.
    Now(String),
    /// No such worker on this replica.
    Unknown,
    /// Its state (draining, quarantined, already paused or not paused)
    /// does not allow it.
    Refused(String),
}

/// The state a worker moves to when an admin pauses (`paused`) or resumes
/// it; `None` where its state does not allow it.
pub fn pause_step(w: &WorkerInfo, paused: bool) -> Option<&'static str> {
    match (w.state.as_str(), paused) {
        ("active" | "calibrating", true) => Some("paused"),
        ("paused", false) if w.profile.is_some() => Some("active"),
        ("paused", false) => Some("calibrating"),
        _ => None,
    }
}

/// What the server sends a worker's session: a control message, or a KV
/// frame relayed from another worker (one queue: order is kept).
#[derive(Debug)]
pub enum ToSession {
    Msg(ToWorker),
    Frame(Vec<u8>),
    /// An admin removed the worker: close its connection with
    /// `protocol::CLOSE_REMOVED` and this reason.
    Close(String),
    /// Its token was quarantined or revoked: close with
    /// `protocol::CLOSE_SANCTIONED` and this reason.
    Sanction(String),
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
    pub encoders: Vec<String>,
    pub threads: u32,
    pub region: String,
    pub asks: Vec<Ask>,
    /// The models it can hold a part of.
    pub parts: Vec<PartOffer>,
}

#[cfg(test)]
impl Registration {
    /// A worker `name` of `provider:<name>` serving a one-layer model `m`.
    pub fn for_test(name: &str, asks: Vec<Ask>) -> Self {
        Self {
            provider_id: format!("provider:{name}"),
            token_id: "t".into(),
            remote: "r".into(),
            name: name.into(),
            build: "b".into(),
            devices: vec![],
            models: vec![ServedModel {
                name: "m".into(),
                layers: 1,
                kv_heads: 1,
                head_dim: 1,
                block_size: 16,
                context_length: 64,
            }],
            encoders: vec![],
            threads: 1,
            region: "r".into(),
            asks,
            parts: vec![],
        }
    }
}

struct Entry {
    info: WorkerInfo,
    /// To the worker's session (bounded: a full queue drops the message
    /// and the session's own checks catch the worker up).
    to_session: mpsc::Sender<ToSession>,
}

/// A worker connected to another replica, as its last announcement said.
struct Remote {
    info: WorkerInfo,
    seen: std::time::Instant,
}

/// The registry of connected workers and of the jobs placed on them.
#[derive(Default)]
pub struct Registry {
    workers: RwLock<HashMap<String, Entry>>,
    /// Workers of other replicas (with a fleet bus).
    remote: RwLock<HashMap<String, Remote>>,
    /// Where messages for remote workers go (set once, with a bus).
    bus: std::sync::OnceLock<Arc<dyn Forward>>,
    /// This replica's id, as announced.
    replica: std::sync::OnceLock<String>,
    /// Signalled when a worker joins, leaves or changes state (the bus
    /// announces at once).
    pub changed: tokio::sync::Notify,
    /// Jobs running on workers (sessions route their messages here).
    pub jobs: super::assignments::Jobs,
    /// KV transfers between this replica's workers.
    pub transfers: super::transfers::Transfers,
    /// Pipeline stage steps in flight on this replica's workers.
    pub stage_calls: super::stage_calls::StageCalls,
    /// Worker tokens whose workers failed a spot check: refused until an
    /// admin clears them.
    quarantined: std::sync::Mutex<std::collections::HashSet<String>>,
    next: AtomicU64,
    /// Disconnects, replays and protocol violations, for `/metrics`.
    pub counts: super::counts::FleetCounts,
    /// Each provider's reputation and uptime, from what its workers do.
    pub standing: Standing,
    /// The most workers a token, and a provider, may have connected here.
    caps: std::sync::RwLock<Caps>,
}

/// How many workers one token and one provider may have connected to one
/// replica at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub per_token: usize,
    pub per_provider: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            per_token: 16,
            per_provider: 64,
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("workers", &self.len())
            .finish_non_exhaustive()
    }
}

fn now() -> i64 {
    money::store::now()
}

/// Sends a server message to a worker connected to another replica;
/// the future answers false when it could not be sent.
pub trait Forward: Send + Sync {
    fn forward<'a>(
        &'a self,
        replica: &'a str,
        worker: &'a str,
        msg: ToWorker,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;
}

/// How long another replica's workers stay listed without an announcement.
pub const REMOTE_TTL: std::time::Duration = std::time::Duration::from_secs(3);

impl Registry {
    /// Adds a worker; returns its id (unique in this process).
    /// Sets the caps on workers per token and per provider.
    pub fn set_caps(&self, caps: Caps) {
        *self.caps.write().unwrap_or_else(|e| e.into_inner()) = caps;
    }

    /// Registers a worker unless its token or its provider already has
    /// its cap of workers connected here: then why not. The count and
    /// the insertion are one step under the registry's lock.
    pub fn register_within_caps(
        &self,
        r: Registration,
        to_session: mpsc::Sender<ToSession>,
    ) -> Result<String, String> {
        let caps = *self.caps.read().unwrap_or_else(|e| e.into_inner());
        self.admit(r, to_session, caps)
    }

    /// Registers a worker, whatever the caps.
    pub fn register(&self, r: Registration, to_session: mpsc::Sender<ToSession>) -> String {
        let unlimited = Caps {
            per_token: usize::MAX,
            per_provider: usize::MAX,
        };
        self.admit(r, to_session, unlimited).unwrap_or_default()
    }

    fn admit(
        &self,
        r: Registration,
        to_session: mpsc::Sender<ToSession>,
        caps: Caps,
    ) -> Result<String, String> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "worker-{}-{n}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let t = now();
        // A worker that only holds pipeline parts has nothing to calibrate:
        // its steps are measured as they run.
        let state = if r.models.is_empty() && !r.parts.is_empty() {
            "active"
        } else {
            "calibrating"
        };
        let info = WorkerInfo {
            id: id.clone(),
            replica: self.replica().to_string(),
            provider_id: r.provider_id,
            token_id: r.token_id,
            name: r.name,
            build: r.build,
            remote: r.remote,
            devices: r.devices,
            models: r.models,
            encoders: r.encoders,
            threads: r.threads,
            region: r.region,
            asks: r.asks,
            parts: r.parts,
            holds: vec![],
            reputation_bps: 0,
            uptime_bps: 0,
            state: state.into(),
            profile: None,
            load: Load::default(),
            rtt_ms: 0.0,
            jobs_running: 0,
            tokens_delivered: 0,
            jobs_lost: 0,
            connected_at: t,
            last_seen: t,
        };
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        let same_token = |e: &&Entry| e.info.token_id == info.token_id;
        let same_provider = |e: &&Entry| e.info.provider_id == info.provider_id;
        let limits = [
            (
                "this worker token",
                w.values().filter(same_token).count(),
                caps.per_token,
            ),
            (
                "this provider",
                w.values().filter(same_provider).count(),
                caps.per_provider,
            ),
        ];
        if let Some((who, n, cap)) = limits.into_iter().find(|(_, n, cap)| n >= cap) {
            return Err(format!(
                "{who} already has {n} workers connected (at most {cap})"
            ));
        }
        self.standing.connected(&info.provider_id, t);
        w.insert(id.clone(), Entry { info, to_session });
        drop(w);
        self.changed.notify_one();
        Ok(id)
    }

    /// This replica's id (`local` until a bus names it).
    pub fn replica(&self) -> &str {
        self.replica.get().map_or("local", String::as_str)
    }

    /// Connects the fleet bus: this replica is `replica`, and messages for
    /// other replicas' workers go through `bus`.
    pub fn connect_bus(&self, replica: String, bus: Arc<dyn Forward>) {
        let _ = self.replica.set(replica);
        let _ = self.bus.set(bus);
    }

    /// Takes another replica's announcement of its workers: they are
    /// listed (and placeable) until `REMOTE_TTL` passes without another;
    /// its workers missing from it are gone, and their jobs lost.
    pub fn announced(&self, replica: &str, workers: Vec<WorkerInfo>) {
        let at = std::time::Instant::now();
        let gone: Vec<String> = {
            let mut r = self.remote.write().unwrap_or_else(|e| e.into_inner());
            let ids: std::collections::HashSet<&str> =
                workers.iter().map(|w| w.id.as_str()).collect();
            let gone: Vec<String> = r
                .iter()
                .filter(|(id, x)| x.info.replica == replica && !ids.contains(id.as_str()))
                .map(|(id, _)| id.clone())
                .collect();
            for id in &gone {
                r.remove(id);
            }
            for mut info in workers {
                info.replica = replica.to_string();
                r.insert(info.id.clone(), Remote { info, seen: at });
            }
            gone
        };
        for id in gone {
            self.jobs.lost(&id, "the worker left its replica");
        }
    }

    /// Drops other replicas' workers not announced for `REMOTE_TTL`; their
    /// jobs are lost.
    pub fn expire_remote(&self) {
        let gone: Vec<String> = {
            let mut r = self.remote.write().unwrap_or_else(|e| e.into_inner());
            let old: Vec<String> = r
                .iter()
                .filter(|(_, x)| x.seen.elapsed() > REMOTE_TTL)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &old {
                r.remove(id);
            }
            old
        };
        for id in gone {
            self.jobs.lost(&id, "its replica went silent");
        }
    }

    /// This replica's own workers (what it announces).
    pub fn local(&self) -> Vec<WorkerInfo> {
        self.list()
            .into_iter()
            .filter(|w| w.replica == self.replica())
            .collect()
    }

    /// Records a worker's `status`.
    pub fn status(&self, id: &str, load: Load) {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = w.get_mut(id) {
            e.info.load = load;
            e.info.last_seen = now();
        }
    }

    /// Quarantines a worker that failed a check, and every other session
    /// of its token: they get no more work, and the token is refused here
    /// from now on. Answers the token (`None`: no such worker here).
    pub fn quarantine(&self, id: &str) -> Option<String> {
        let token = {
            let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
            w.get(id)?.info.token_id.clone()
        };
        self.mark_quarantined(&token);
        Some(token)
    }

    /// Marks every session of `token` quarantined and refuses the token.
    pub fn mark_quarantined(&self, token: &str) {
        {
            let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
            for e in w.values_mut().filter(|e| e.info.token_id == token) {
                e.info.state = "quarantined".into();
            }
        }
        self.changed.notify_one();
        self.quarantined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.to_string());
    }

    /// Closes every session of `token` on this replica (a sanction); the
    /// workers do not reconnect by themselves. How many it closed.
    pub async fn close_token(&self, token: &str, why: &str) -> usize {
        let sessions: Vec<mpsc::Sender<ToSession>> = {
            let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
            w.values()
                .filter(|e| e.info.token_id == token)
                .map(|e| e.to_session.clone())
                .collect()
        };
        for tx in &sessions {
            let _ = tx.send(ToSession::Sanction(why.to_string())).await;
        }
        sessions.len()
    }

    /// The tokens of this replica's connected workers.
    pub fn local_tokens(&self) -> Vec<String> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        let mut t: Vec<String> = w.values().map(|e| e.info.token_id.clone()).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Whether workers of this token are quarantined.
    pub fn is_quarantined(&self, token_id: &str) -> bool {
        self.quarantined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(token_id)
    }

    /// Lifts a token's quarantine; false if it was not quarantined.
    pub fn clear_quarantine(&self, token_id: &str) -> bool {
        self.quarantined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token_id)
    }

    /// Takes a measured round trip of a worker's link into its smoothed
    /// one (the first sample as is, then 1/8 of each new one).
    pub fn set_rtt(&self, id: &str, rtt: std::time::Duration) {
        let ms = rtt.as_secs_f64() * 1e3;
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = w.get_mut(id) {
            let r = &mut e.info.rtt_ms;
            *r = if *r == 0.0 { ms } else { *r + (ms - *r) / 8.0 };
        }
    }

    /// An admin pauses (`paused`) or resumes a worker of this replica.
    /// Paused, it gets no new work, its running work finishes and it
    /// stays connected; resumed, it is active again (calibrating if it was
    /// never measured). Its session is told. Only an active or
    /// calibrating worker pauses and only a paused one resumes: a
    /// draining or quarantined one keeps its state.
    pub fn pause(&self, id: &str, paused: bool) -> Paused {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        let Some(e) = w.get_mut(id) else {
            return Paused::Unknown;
        };
        let Some(next) = pause_step(&e.info, paused) else {
            return Paused::Refused(e.info.state.clone());
        };
        e.info.state = next.into();
        self.changed.notify_one();
        let _ = e.to_session.try_send(ToSession::Msg(ToWorker::Pause {
            v: protocol::VERSION,
            paused,
        }));
        Paused::Now(next.into())
    }

    /// Marks a worker draining (it said so, or an admin asked); with
    /// `tell`, its session is told to drain. False for an unknown id.
    pub fn drain(&self, id: &str, tell: bool) -> bool {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        let Some(e) = w.get_mut(id) else { return false };
        e.info.state = "draining".into();
        self.changed.notify_one();
        if tell {
            let _ = e.to_session.try_send(ToSession::Msg(ToWorker::Drain {
                v: protocol::VERSION,
            }));
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
            self.changed.notify_one();
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
            self.changed.notify_one();
            self.counts.disconnects.inc();
            self.standing.disconnected(&e.info.provider_id, now());
        }
        self.jobs.lost(id, "the worker disconnected");
        self.transfers.lost(id);
        self.stage_calls.lost(id);
    }

    /// Records the part of `model` a worker holds now (`None`: none).
    /// False when it never offered parts of `model` (a worker's word about
    /// anything else is not kept: it could grow without bound).
    pub fn set_held(&self, id: &str, model: &str, part: Option<HeldPart>) -> bool {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        let Some(e) = w.get_mut(id) else {
            return true;
        };
        if !e.info.parts.iter().any(|p| p.model == model) {
            return false;
        }
        e.info.holds.retain(|h| h.model != model);
        e.info.holds.extend(part);
        self.changed.notify_one();
        true
    }

    /// Relays a KV frame to one of this replica's workers (waiting while
    /// its queue is full); false if it is gone.
    pub async fn send_frame(&self, id: &str, frame: Vec<u8>) -> bool {
        match self.session_of(id) {
            Some(tx) => tx.send(ToSession::Frame(frame)).await.is_ok(),
            None => false,
        }
    }

    /// Whether `id` is connected to this replica (KV moves only between
    /// this replica's workers).
    pub fn is_local(&self, id: &str) -> bool {
        self.session_of(id).is_some()
    }

    /// Sends `msg` to a worker's session (waiting while its queue is
    /// full); false if the worker is gone.
    pub async fn send(&self, id: &str, msg: ToWorker) -> bool {
        let local = self.session_of(id);
        if let Some(tx) = local {
            return tx.send(ToSession::Msg(msg)).await.is_ok();
        }
        let replica = {
            let r = self.remote.read().unwrap_or_else(|e| e.into_inner());
            r.get(id).map(|x| x.info.replica.clone())
        };
        match (replica, self.bus.get()) {
            (Some(replica), Some(bus)) => bus.forward(&replica, id, msg).await,
            _ => false,
        }
    }

    /// Sends `msg` to one of this replica's own workers only (what another
    /// replica forwards: never forwarded again, so two replicas with stale
    /// views of a worker cannot bounce a message between them).
    pub async fn send_local(&self, id: &str, msg: ToWorker) -> bool {
        match self.session_of(id) {
            Some(tx) => tx.send(ToSession::Msg(msg)).await.is_ok(),
            None => false,
        }
    }

    /// Closes a worker's connection at once (an admin removed it): its
    /// running attempts are lost and replayed elsewhere, as when a worker
    /// crashes, and the worker does not reconnect by itself. False if the
    /// worker is not connected to this replica.
    pub async fn close(&self, id: &str, why: &str) -> bool {
        match self.session_of(id) {
            Some(tx) => tx.send(ToSession::Close(why.to_string())).await.is_ok(),
            None => false,
        }
    }

    fn session_of(&self, id: &str) -> Option<mpsc::Sender<ToSession>> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        w.get(id).map(|e| e.to_session.clone())
    }

    /// This replica's active workers that serve the embedding model `model`.
    pub fn encoding(&self, model: &str) -> Vec<WorkerInfo> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<WorkerInfo> = w
            .values()
            .filter(|e| e.info.state == "active" && e.info.encoders.iter().any(|m| m == model))
            .map(|e| e.info.clone())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Active workers that serve `model`, this replica's and the others'.
    pub fn serving(&self, model: &str) -> Vec<WorkerInfo> {
        let ok = |i: &WorkerInfo| i.state == "active" && i.models.iter().any(|m| m.name == model);
        let mut out: Vec<WorkerInfo> = {
            let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
            w.values()
                .filter(|e| ok(&e.info))
                .map(|e| e.info.clone())
                .collect()
        };
        let r = self.remote.read().unwrap_or_else(|e| e.into_inner());
        out.extend(r.values().filter(|x| ok(&x.info)).map(|x| x.info.clone()));
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

    /// Counts tokens one of this replica's workers delivered for another
    /// replica's job.
    pub fn delivered(&self, id: &str, tokens: usize) {
        let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = w.get_mut(id) {
            e.info.tokens_delivered += tokens as u64;
        }
    }

    /// Every connected worker, this replica's and the others', by id.
    pub fn list(&self) -> Vec<WorkerInfo> {
        let mut out: Vec<WorkerInfo> = {
            let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
            w.values()
                .map(|e| {
                    let r = self.standing.get(&e.info.provider_id);
                    WorkerInfo {
                        replica: self.replica().to_string(),
                        jobs_running: self.jobs.on(&e.info.id) as u64,
                        reputation_bps: r.reputation_bps(),
                        uptime_bps: r.uptime_bps(now()),
                        ..e.info.clone()
                    }
                })
                .collect()
        };
        let r = self.remote.read().unwrap_or_else(|e| e.into_inner());
        out.extend(r.values().map(|x| x.info.clone()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_is_timed_along_the_two_measured_lengths() {
        let p = Profile {
            prefill_tokens_per_s: 1000.0,
            prefill_ms_long: 640.0,
            decode_step_ms_1: 5.0,
            decode_step_ms_4: 8.0,
            measured_at: 0,
        };
        // 128 ms for 128 tokens, 640 for 512: 4/3 ms a token past 128.
        assert!((p.prefill_ms(64) - 64.0).abs() < 1e-9);
        assert!((p.prefill_ms(128) - 128.0).abs() < 1e-9);
        assert!((p.prefill_ms(512) - 640.0).abs() < 1e-9);
        assert!((p.prefill_ms(1024) - (640.0 + 512.0 * 4.0 / 3.0)).abs() < 1e-6);
        // Not measured (or not dearer): linear in the short throughput.
        let flat = Profile {
            prefill_ms_long: 0.0,
            ..p
        };
        assert!((flat.prefill_ms(1024) - 1024.0).abs() < 1e-9);
    }

    #[tokio::test]
    async fn a_token_and_a_provider_connect_at_most_their_caps_and_a_sanction_closes_them_all() {
        let r = Registry::default();
        r.set_caps(Caps {
            per_token: 2,
            per_provider: 3,
        });
        let join = |token: &str, name: &str| {
            let mut reg = Registration::for_test(name, vec![]);
            reg.provider_id = "provider:p".into();
            reg.token_id = token.into();
            let (tx, rx) = mpsc::channel(4);
            r.register_within_caps(reg, tx).map(|id| (id, rx))
        };
        let (a1, mut rx1) = join("a", "a1").expect("first");
        let (_, mut rx2) = join("a", "a2").expect("second");
        let err = join("a", "a3").expect_err("past the token's cap");
        assert!(err.contains("at most 2"), "{err}");
        let (_, mut rx3) = join("b", "b1").expect("another token");
        let err = join("b", "b2").expect_err("past the provider's cap");
        assert!(
            err.contains("provider") && err.contains("at most 3"),
            "{err}"
        );
        // A quarantine marks and closes every session of the token, and
        // no other.
        assert_eq!(r.quarantine(&a1).as_deref(), Some("a"));
        assert!(r.is_quarantined("a") && !r.is_quarantined("b"));
        assert_eq!(r.close_token("a", "caught").await, 2);
        for rx in [&mut rx1, &mut rx2] {
            assert!(matches!(rx.try_recv(), Ok(ToSession::Sanction(w)) if w == "caught"));
        }
        assert!(rx3.try_recv().is_err());
        assert_eq!(r.local_tokens(), vec!["a".to_string(), "b".to_string()]);
        assert!(
            r.list()
                .iter()
                .all(|w| (w.token_id == "a") == (w.state == "quarantined"))
        );
    }

    #[tokio::test]
    async fn a_paused_worker_gets_no_work_keeps_its_session_and_resumes_as_it_was() {
        let r = Registry::default();
        let (tx, mut rx) = mpsc::channel(8);
        let id = r.register(Registration::for_test("p", vec![]), tx);
        let model = r.list()[0].models[0].name.clone();
        let state = |r: &Registry| r.list()[0].state.clone();
        // Never measured: it resumes calibrating.
        assert_eq!(r.pause(&id, true), Paused::Now("paused".into()));
        assert_eq!(r.pause(&id, true), Paused::Refused("paused".into()));
        assert_eq!(r.pause(&id, false), Paused::Now("calibrating".into()));
        assert_eq!(r.pause(&id, false), Paused::Refused("calibrating".into()));
        // Measured while paused: it stays paused, then resumes active.
        r.pause(&id, true);
        let measured = Profile {
            prefill_tokens_per_s: 100.0,
            prefill_ms_long: 0.0,
            decode_step_ms_1: 5.0,
            decode_step_ms_4: 6.0,
            measured_at: 1,
        };
        r.set_profile(&id, measured);
        assert_eq!(state(&r), "paused");
        assert!(
            r.serving(&model).is_empty(),
            "a paused worker is placed nowhere"
        );
        assert_eq!(r.pause(&id, false), Paused::Now("active".into()));
        assert_eq!(r.serving(&model).len(), 1);
        // A draining worker is leaving: neither paused nor resumed.
        r.drain(&id, false);
        assert_eq!(r.pause(&id, true), Paused::Refused("draining".into()));
        assert_eq!(r.pause("nobody", true), Paused::Unknown);
        // Its session heard each change, in order, and nothing else.
        let mut told = vec![];
        while let Ok(ToSession::Msg(ToWorker::Pause { paused, .. })) = rx.try_recv() {
            told.push(paused);
        }
        assert_eq!(told, [true, false, true, false]);
        assert!(rx.try_recv().is_err());
    }
}
