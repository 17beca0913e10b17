//! One worker's connection, after the gateway checked its token: the
//! worker must `register` within `REGISTER_WITHIN`, is welcomed, then
//! reports `status` at least every `heartbeat x MISSED_BEATS` or is
//! dropped (its own messages are its heartbeat: answering the gateway's
//! pings is not), and is dropped too when it stops reading (no pong for
//! `heartbeat x DEAF_BEATS`). Any message it should not send (malformed, oversized, another
//! version, a second `register`, a binary frame with no transfer open)
//! ends the session with a close code and the reason. Socket-free: the
//! gateway pumps frames through two bounded channels, so a slow or
//! flooding worker is held back by back-pressure, never buffered without
//! bound.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use engine::core::CoreEvent;
use engine::{FinishReason, TokenLogprob, Usage};

use super::assignments::{Delivery, JobEvent};
use super::registry::{Registration, Registry, ToSession};
use super::transfers::{Side, TransferEvent};
use protocol::{Ask, FromWorker, ProtocolError, ServedModel, ToWorker, VERSION};

/// How long a new connection has to register.
pub const REGISTER_WITHIN: Duration = Duration::from_secs(10);
/// Heartbeats a worker may miss before it is dropped.
pub const MISSED_BEATS: u32 = 3;
/// Heartbeats (the gateway pings once each) without a pong after which a
/// worker is taken to have stopped reading and is dropped.
pub const DEAF_BEATS: u32 = 10;
/// Messages queued for a worker (assignments wait when it is full).
const TO_WORKER_QUEUE: usize = 256;

/// A frame from the worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Text(String),
    /// A binary frame (a KV frame of a transfer it sends).
    Binary(Vec<u8>),
    /// The worker answered the gateway's ping after this long.
    Pong(Duration),
}

/// A frame to the worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    Text(String),
    /// A KV frame relayed from another worker.
    Binary(Vec<u8>),
    /// Close with a code (1008 policy, 1009 too big, 1003 unsupported)
    /// and the reason.
    Close(u16, String),
}

/// Who is connecting (the gateway checked the token).
#[derive(Debug, Clone)]
pub struct Peer {
    pub provider_id: String,
    pub token_id: String,
    pub remote: String,
}

/// Runs one session to its end; the worker is in the registry from its
/// registration until then.
pub async fn run(
    registry: Arc<Registry>,
    peer: Peer,
    mut inbound: mpsc::Receiver<Inbound>,
    outbound: mpsc::Sender<Outbound>,
    heartbeat: Duration,
) {
    let close = |code: u16, reason: String| {
        let out = outbound.clone();
        async move {
            let _ = out.send(Outbound::Close(code, reason)).await;
        }
    };
    let first = tokio::time::timeout(REGISTER_WITHIN, inbound.recv()).await;
    let registration = match first {
        Ok(Some(Inbound::Text(t))) => {
            match protocol::decode(&t).and_then(|m| registration(m, &peer)) {
                Ok(r) => r,
                Err(e) => return close(code(&e), e.to_string()).await,
            }
        }
        Ok(Some(Inbound::Binary(_) | Inbound::Pong(_))) => {
            return close(1003, "register first".into()).await;
        }
        Ok(None) => return,
        Err(_) => {
            let why = format!("no register within {} s", REGISTER_WITHIN.as_secs());
            return close(1008, why).await;
        }
    };
    if registry.is_quarantined(&registration.token_id) {
        let why = "this worker token is quarantined: a spot check caught its work".into();
        return close(1008, why).await;
    }
    let (to_session, mut from_registry) = mpsc::channel(TO_WORKER_QUEUE);
    let provider_id = registration.provider_id.clone();
    let id = match registry.register_within_caps(registration, to_session) {
        Ok(id) => id,
        Err(why) => return close(1008, why).await,
    };
    // Out of the registry however the session ends (aborted included).
    let _registered = Registered {
        registry: &registry,
        id: &id,
    };
    tracing::info!(worker = %id, provider = %provider_id, remote = %peer.remote, "worker registered");
    let welcome = ToWorker::Welcome {
        v: VERSION,
        worker_id: id.clone(),
        provider_id,
        heartbeat_ms: heartbeat.as_millis() as u64,
    };
    let mut end: Option<(u16, String)> = None;
    if outbound
        .send(Outbound::Text(protocol::encode(&welcome)))
        .await
        .is_ok()
    {
        end = serve(
            &registry,
            &id,
            &mut inbound,
            &outbound,
            &mut from_registry,
            heartbeat,
        )
        .await;
    }
    tracing::info!(worker = %id, reason = ?end, "worker left");
    if let Some((c, why)) = end {
        close(c, why).await;
    }
}

/// Removes a worker from the registry when its session ends.
struct Registered<'a> {
    registry: &'a Registry,
    id: &'a str,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// The registered part of a session; returns why it must close (`None`
/// when the worker closed or went away).
async fn serve(
    registry: &Registry,
    id: &str,
    inbound: &mut mpsc::Receiver<Inbound>,
    outbound: &mpsc::Sender<Outbound>,
    from_registry: &mut mpsc::Receiver<ToSession>,
    heartbeat: Duration,
) -> Option<(u16, String)> {
    let patience = heartbeat * MISSED_BEATS;
    let deaf = heartbeat * DEAF_BEATS;
    let (mut last_status, mut last_pong) = (Instant::now(), Instant::now());
    loop {
        let (status_due, pong_due) = (last_status + patience, last_pong + deaf);
        tokio::select! {
            _ = tokio::time::sleep_until(status_due.min(pong_due)) => {
                if Instant::now() >= status_due {
                    return Some((1008, format!("no status for {} ms", patience.as_millis())));
                }
                return Some((1008, format!("no pong for {} ms: it stopped reading", deaf.as_millis())));
            }
            frame = inbound.recv() => match frame {
                None => return None,
                Some(Inbound::Pong(rtt)) => {
                    last_pong = Instant::now();
                    registry.set_rtt(id, rtt);
                }
                Some(Inbound::Binary(frame)) => {
                    if let Some(why) = relay_frame(registry, id, frame).await {
                        return Some((1003, why));
                    }
                }
                Some(Inbound::Text(t)) => match protocol::decode(&t) {
                    Ok(FromWorker::Status { load, .. }) => {
                        last_status = Instant::now();
                        registry.status(id, load);
                    }
                    Ok(FromWorker::Drain { .. }) => {
                        registry.drain(id, false);
                    }
                    Ok(FromWorker::Register { .. }) => {
                        return Some((1008, "already registered".into()));
                    }
                    Ok(msg) => {
                        if let Some(why) = route(registry, id, msg) {
                            return Some((1008, why));
                        }
                    }
                    Err(e) => return Some((code(&e), e.to_string())),
                },
            },
            Some(msg) = from_registry.recv() => {
                let out = match msg {
                    ToSession::Msg(m) => Outbound::Text(protocol::encode(&m)),
                    ToSession::Frame(f) => Outbound::Binary(f),
                    ToSession::Close(why) => return Some((protocol::CLOSE_REMOVED, why)),
                    ToSession::Sanction(why) => return Some((protocol::CLOSE_SANCTIONED, why)),
                };
                if outbound.send(out).await.is_err() {
                    return None;
                }
            }
        }
    }
}

/// Relays a KV frame of a transfer this worker sends to its receiver
/// (waiting while the receiver's queue is full: back-pressure reaches
/// the sender); why the session must close otherwise.
async fn relay_frame(registry: &Registry, worker: &str, frame: Vec<u8>) -> Option<String> {
    if protocol::frame_kind(&frame) == Some(protocol::FrameKind::Hidden) {
        return match registry.stage_calls.frame(worker, &frame) {
            Delivery::NotYours => Some("hidden states for a step it was not given".into()),
            Delivery::Delivered | Delivery::Stale => None,
        };
    }
    let transfer = match protocol::frame_transfer(&frame) {
        Ok(t) => t,
        Err(e) => return Some(e.to_string()),
    };
    let payload = frame.len() - protocol::HEADER;
    match registry.transfers.frame(worker, transfer, payload) {
        (Delivery::Delivered, Some(dest)) => {
            // A receiver that left is its job's loss, not this worker's.
            registry.send_frame(&dest, frame).await;
            None
        }
        (Delivery::Stale, _) => None,
        _ => Some(format!(
            "binary frame of {} bytes with no transfer open",
            frame.len()
        )),
    }
}

/// Hands a transfer's message to its relay; the transfer if it never
/// involved this worker.
fn route_transfer(registry: &Registry, worker: &str, msg: FromWorker) -> Option<u64> {
    let (side, transfer, ev) = match msg {
        FromWorker::KvWant { transfer, from, .. } => {
            (Side::Decode, transfer, TransferEvent::Want { from })
        }
        FromWorker::KvResult {
            transfer,
            imported,
            reason,
            ..
        } => (
            Side::Decode,
            transfer,
            TransferEvent::Result { imported, reason },
        ),
        FromWorker::KvEnd {
            transfer,
            tokens,
            digest,
            first,
            cached_tokens,
            ..
        } => {
            let ev = TransferEvent::End {
                tokens,
                digest,
                first,
                cached_tokens,
            };
            (Side::Prefill, transfer, ev)
        }
        FromWorker::KvFailed {
            transfer, message, ..
        } => (Side::Prefill, transfer, TransferEvent::Failed(message)),
        FromWorker::Register { .. }
        | FromWorker::Status { .. }
        | FromWorker::Drain { .. }
        | FromWorker::Accepted { .. }
        | FromWorker::Tokens { .. }
        | FromWorker::Done { .. }
        | FromWorker::Embedded { .. }
        | FromWorker::Failed { .. }
        | FromWorker::PartLoaded { .. }
        | FromWorker::PartFailed { .. }
        | FromWorker::StageDone { .. }
        | FromWorker::StageFailed { .. } => return None,
    };
    (registry.transfers.event(worker, side, transfer, ev) == Delivery::NotYours).then_some(transfer)
}

/// Hands a job message to its relay; why the session must close if it
/// was never this worker's.
fn route(registry: &Registry, worker: &str, msg: FromWorker) -> Option<String> {
    let (job, attempt, events) = match msg {
        FromWorker::Accepted { job, attempt, .. } => {
            (job, attempt, vec![JobEvent::Core(CoreEvent::Accepted)])
        }
        FromWorker::Tokens {
            job,
            attempt,
            tokens,
            ..
        } => (job, attempt, tokens.into_iter().map(token_event).collect()),
        FromWorker::Done {
            job,
            attempt,
            reason,
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            ..
        } => {
            let usage = Usage {
                prompt_tokens: prompt_tokens as usize,
                completion_tokens: completion_tokens as usize,
                cached_tokens: cached_tokens as usize,
            };
            (job, attempt, vec![done_event(&reason, usage)])
        }
        FromWorker::Failed {
            job,
            attempt,
            message,
            ..
        } => (job, attempt, vec![JobEvent::Lost(message)]),
        FromWorker::Embedded {
            job,
            vectors,
            prompt_tokens,
            ..
        } => {
            let out = engine::Embeddings {
                vectors,
                prompt_tokens: prompt_tokens as usize,
            };
            (job, 1, vec![JobEvent::Embedded(out)])
        }
        FromWorker::Register { .. } | FromWorker::Status { .. } | FromWorker::Drain { .. } => {
            return None;
        }
        FromWorker::KvWant { .. }
        | FromWorker::KvResult { .. }
        | FromWorker::KvEnd { .. }
        | FromWorker::KvFailed { .. } => {
            return route_transfer(registry, worker, msg)
                .map(|t| format!("transfer {t} was not given to this worker"));
        }
        FromWorker::PartLoaded { .. }
        | FromWorker::PartFailed { .. }
        | FromWorker::StageDone { .. }
        | FromWorker::StageFailed { .. } => return route_stage(registry, worker, msg),
    };
    for ev in events {
        if registry.jobs.deliver(worker, job, attempt, ev) == Delivery::NotYours {
            return Some(format!("job {job} was not given to this worker"));
        }
    }
    None
}

/// Hands a pipeline stage's message on: a part loaded (or not) goes to the
/// registry, a step's answer to its call; why the session must close if
/// the step, or the model, was never this worker's.
fn route_stage(registry: &Registry, worker: &str, msg: FromWorker) -> Option<String> {
    let delivery = match msg {
        FromWorker::PartLoaded {
            model,
            first,
            end,
            blocks,
            ..
        } => {
            let part = protocol::stage::HeldPart {
                model: model.clone(),
                first,
                end,
                blocks,
            };
            let kept = registry.set_held(worker, &model, Some(part));
            return (!kept).then(|| format!("a part of `{model}`, which it never offered"));
        }
        FromWorker::PartFailed { model, message, .. } => {
            tracing::warn!(%worker, %model, %message, "a worker could not load its part");
            let kept = registry.set_held(worker, &model, None);
            return (!kept).then(|| format!("a part of `{model}`, which it never offered"));
        }
        FromWorker::StageDone { step, tokens, .. } => {
            (step, registry.stage_calls.done(worker, step, tokens))
        }
        FromWorker::StageFailed { step, message, .. } => {
            (step, registry.stage_calls.failed(worker, step, &message))
        }
        FromWorker::Register { .. }
        | FromWorker::Status { .. }
        | FromWorker::Drain { .. }
        | FromWorker::Accepted { .. }
        | FromWorker::Tokens { .. }
        | FromWorker::Done { .. }
        | FromWorker::Failed { .. }
        | FromWorker::Embedded { .. }
        | FromWorker::KvWant { .. }
        | FromWorker::KvEnd { .. }
        | FromWorker::KvFailed { .. }
        | FromWorker::KvResult { .. } => return None,
    };
    let (step, delivery) = delivery;
    (delivery == Delivery::NotYours).then(|| format!("step {step} was not given to this worker"))
}

/// A token a worker sent, as its relay reads it.
fn token_event(t: protocol::JobToken) -> JobEvent {
    let logprob = t.logprob.map(|logprob| TokenLogprob {
        token: t.id,
        logprob,
        top: t.top,
    });
    JobEvent::Core(CoreEvent::Token { id: t.id, logprob })
}

/// A job's end as a worker reported it (an unknown reason loses it).
fn done_event(reason: &str, usage: Usage) -> JobEvent {
    let reason = match reason {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "abort" => FinishReason::Abort,
        _ => return JobEvent::Lost("the worker ended a job with an unknown reason".into()),
    };
    JobEvent::Core(CoreEvent::Finished { reason, usage })
}

fn code(e: &ProtocolError) -> u16 {
    match e {
        ProtocolError::TooLarge(_) => 1009,
        ProtocolError::Malformed(_) | ProtocolError::Version(_) | ProtocolError::Frame(_) => 1008,
    }
}

/// Checks a `register` message's sizes and geometry.
fn registration(m: FromWorker, peer: &Peer) -> Result<Registration, ProtocolError> {
    let FromWorker::Register {
        name,
        build,
        devices,
        models,
        threads,
        region,
        asks,
        encoders,
        parts,
        ..
    } = m
    else {
        return Err(ProtocolError::Malformed(
            "the first message must be `register`".into(),
        ));
    };
    let bad = |m: String| Err(ProtocolError::Malformed(m));
    if name.trim().is_empty() || name.len() > 128 || build.len() > 128 || region.len() > 64 {
        return bad("name (1-128), build (<=128) or region (<=64) out of bounds".into());
    }
    if devices.len() > 64 || models.len() > 16 || encoders.len() > 16 {
        return bad("at most 64 devices, 16 models and 16 encoders".into());
    }
    if encoders.iter().any(|e| e.is_empty() || e.len() > 128) {
        return bad("an encoder name is empty or over 128 bytes".into());
    }
    if let Some(m) = models.iter().find(|m| !sane(m)) {
        return bad(format!("model `{}` has an impossible geometry", m.name));
    }
    check_asks(&asks, &models).map_err(ProtocolError::Malformed)?;
    check_parts(&parts).map_err(ProtocolError::Malformed)?;
    Ok(Registration {
        provider_id: peer.provider_id.clone(),
        token_id: peer.token_id.clone(),
        remote: peer.remote.clone(),
        name,
        build,
        devices,
        models,
        encoders,
        threads,
        region,
        asks,
        parts,
    })
}

/// At most 16 part offers, one per model, each of a sane geometry.
fn check_parts(parts: &[protocol::stage::PartOffer]) -> Result<(), String> {
    if parts.len() > 16 {
        return Err("at most 16 part offers".into());
    }
    for (i, p) in parts.iter().enumerate() {
        if p.model.is_empty() || p.model.len() > 128 {
            return Err("a part offer's model name is empty or over 128 bytes".into());
        }
        if parts[..i].iter().any(|q| q.model == p.model) {
            return Err(format!("two part offers for `{}`", p.model));
        }
        if !(1..=1024).contains(&p.layers) || !(1..=1 << 16).contains(&p.hidden) {
            return Err(format!("part offer for `{}`: impossible geometry", p.model));
        }
    }
    Ok(())
}

/// At most one ask per served model, each priced within the market's
/// bounds (a positive output price, no phase dearer than `MAX_PRICE`),
/// with a bounded capacity and an end in the future.
fn check_asks(asks: &[Ask], models: &[ServedModel]) -> Result<(), String> {
    use money::ledger::amount::MAX_PRICE;
    for (i, a) in asks.iter().enumerate() {
        let name = &a.model;
        if !models.iter().any(|m| &m.name == name) {
            return Err(format!("ask for `{name}`, which it does not serve"));
        }
        if asks[..i].iter().any(|b| &b.model == name) {
            return Err(format!("two asks for `{name}`"));
        }
        let prices = [a.input, a.cached_input, a.output];
        if a.output <= 0 || prices.iter().any(|p| !(0..=MAX_PRICE).contains(p)) {
            return Err(format!(
                "ask for `{name}`: prices are 0-{MAX_PRICE} ticks per million tokens, output positive"
            ));
        }
        if a.capacity > 1_000_000_000 {
            return Err(format!(
                "ask for `{name}`: capacity is at most 1e9 tokens/s"
            ));
        }
        if a.until != 0 && a.until <= money::store::now() {
            return Err(format!("ask for `{name}` already lapsed"));
        }
    }
    Ok(())
}

fn sane(m: &ServedModel) -> bool {
    !m.name.is_empty()
        && m.name.len() <= 128
        && (1..=1024).contains(&m.layers)
        && (1..=1024).contains(&m.kv_heads)
        && (1..=1024).contains(&m.head_dim)
        && (1..=1024).contains(&m.block_size)
        && (1..=1 << 22).contains(&m.context_length)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{Device, Load};

    fn register_json(name: &str, layers: u32) -> String {
        serde_json::to_string(&FromWorker::Register {
            v: VERSION,
            name: name.into(),
            build: "test".into(),
            devices: vec![Device {
                kind: "cpu".into(),
                name: "test cpu".into(),
                cores: 2,
                memory_bytes: 1 << 30,
                features: vec!["avx2".into()],
                usable: true,
            }],
            models: vec![ServedModel {
                name: "m".into(),
                layers,
                kv_heads: 3,
                head_dim: 64,
                block_size: 16,
                context_length: 2048,
            }],
            encoders: vec!["e".into()],
            parts: vec![],
            threads: 1,
            region: "us-east".into(),
            asks: vec![],
        })
        .expect("json")
    }

    struct Session {
        registry: Arc<Registry>,
        tx: mpsc::Sender<Inbound>,
        rx: mpsc::Receiver<Outbound>,
        done: tokio::task::JoinHandle<()>,
    }

    fn start(heartbeat: Duration) -> Session {
        let registry = Arc::new(Registry::default());
        let (tx, inbound) = mpsc::channel(8);
        let (outbound, rx) = mpsc::channel(8);
        let peer = Peer {
            provider_id: "provider:p".into(),
            token_id: "wtok_1".into(),
            remote: "127.0.0.1:1".into(),
        };
        let done = tokio::spawn(run(registry.clone(), peer, inbound, outbound, heartbeat));
        Session {
            registry,
            tx,
            rx,
            done,
        }
    }

    async fn closed_with(s: &mut Session) -> (u16, String) {
        loop {
            match s.rx.recv().await.expect("a close") {
                Outbound::Close(c, why) => return (c, why),
                Outbound::Text(_) | Outbound::Binary(_) => {}
            }
        }
    }

    #[tokio::test]
    async fn a_worker_registers_reports_and_is_dropped_when_silent() {
        let mut s = start(Duration::from_millis(50));
        s.tx.send(Inbound::Text(register_json("w1", 30)))
            .await
            .expect("send");
        let Some(Outbound::Text(welcome)) = s.rx.recv().await else {
            panic!("no welcome")
        };
        assert!(welcome.contains(r#""type":"welcome""#), "{welcome}");
        let load = Load {
            queued: 1,
            running: 2,
            free_kv_blocks: 3,
            step_ms: 4.0,
        };
        let status = serde_json::to_string(&FromWorker::Status { v: 1, load }).expect("json");
        s.tx.send(Inbound::Text(status)).await.expect("send");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let listed = s.registry.list();
        assert_eq!((listed.len(), listed[0].load), (1, load));
        assert_eq!(listed[0].provider_id, "provider:p");
        // An admin drain reaches the worker.
        assert!(s.registry.drain(&listed[0].id, true));
        assert_eq!(
            s.rx.recv().await,
            Some(Outbound::Text(r#"{"type":"drain","v":1}"#.into()))
        );
        // Then silence: dropped after three missed beats.
        let (code, why) = closed_with(&mut s).await;
        assert!(code == 1008 && why.contains("no status"), "{why}");
        s.done.await.expect("session");
        assert!(s.registry.is_empty());
    }

    /// Registers on a fresh session and takes the welcome.
    async fn welcomed(heartbeat: Duration) -> Session {
        let mut s = start(heartbeat);
        s.tx.send(Inbound::Text(register_json("w1", 30)))
            .await
            .expect("send");
        assert!(matches!(s.rx.recv().await, Some(Outbound::Text(_))));
        s
    }

    #[tokio::test]
    async fn pongs_are_not_a_heartbeat_and_a_worker_that_stops_reading_is_dropped() {
        // Answering pings alone keeps nobody registered.
        let mut s = welcomed(Duration::from_millis(50)).await;
        let pongs = {
            let tx = s.tx.clone();
            tokio::spawn(async move {
                while tx
                    .send(Inbound::Pong(Duration::from_millis(1)))
                    .await
                    .is_ok()
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        let (code, why) = tokio::time::timeout(Duration::from_secs(5), closed_with(&mut s))
            .await
            .expect("dropped, pongs or not");
        assert!(code == 1008 && why.contains("no status"), "{why}");
        pongs.abort();
        // Statuses without pongs: it no longer reads what it is sent.
        let mut s = welcomed(Duration::from_millis(50)).await;
        let status = serde_json::to_string(&FromWorker::Status {
            v: 1,
            load: protocol::Load::default(),
        })
        .expect("json");
        let beats = {
            let tx = s.tx.clone();
            tokio::spawn(async move {
                while tx.send(Inbound::Text(status.clone())).await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let started = std::time::Instant::now();
        let (code, why) = tokio::time::timeout(Duration::from_secs(5), closed_with(&mut s))
            .await
            .expect("dropped for not reading");
        assert!(code == 1008 && why.contains("no pong"), "{why}");
        assert!(started.elapsed() >= Duration::from_millis(400));
        beats.abort();
    }

    #[tokio::test]
    async fn hostile_first_and_later_messages_end_the_session_with_a_reason() {
        let ask = |model: &str, output: i64, until: i64| {
            let mut v: serde_json::Value =
                serde_json::from_str(&register_json("w", 30)).expect("json");
            v["asks"] =
                serde_json::json!([{"model": model, "input": 1, "output": output, "until": until}]);
            v.to_string()
        };
        let mut two = serde_json::from_str::<serde_json::Value>(&ask("m", 5, 0)).expect("json");
        let again = two["asks"][0].clone();
        two["asks"].as_array_mut().expect("asks").push(again);
        let cases: Vec<(Vec<Inbound>, u16, &str)> = vec![
            (
                vec![Inbound::Text(ask("other", 5, 0))],
                1008,
                "which it does not serve",
            ),
            (vec![Inbound::Text(ask("m", 0, 0))], 1008, "output positive"),
            (
                vec![Inbound::Text(ask("m", i64::MAX, 0))],
                1008,
                "output positive",
            ),
            (vec![Inbound::Text(ask("m", 5, 1))], 1008, "already lapsed"),
            (vec![Inbound::Text(two.to_string())], 1008, "two asks"),
            (vec![Inbound::Text("{".into())], 1008, "malformed"),
            (vec![Inbound::Binary(vec![0; 9])], 1003, "register first"),
            (
                vec![Inbound::Text(r#"{"type":"drain","v":1}"#.into())],
                1008,
                "must be `register`",
            ),
            (
                vec![Inbound::Text(register_json("w", 0))],
                1008,
                "impossible geometry",
            ),
            (
                vec![Inbound::Text(register_json("", 30))],
                1008,
                "out of bounds",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Text(register_json("w", 30)),
                ],
                1008,
                "already registered",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Binary(protocol::encode_frame(5, 0, 0, 1, &[0; 768])),
                ],
                1003,
                "no transfer open",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Binary(vec![7; 1 << 10]),
                ],
                1003,
                "not a KV frame",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Text(
                        r#"{"type":"kv_failed","v":1,"transfer":99,"message":"x"}"#.into(),
                    ),
                ],
                1008,
                "was not given to this worker",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Text("x".repeat(protocol::MAX_CONTROL + 1)),
                ],
                1009,
                "over the",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Text(
                        r#"{"type":"tokens","v":1,"job":99,"attempt":1,"tokens":[{"id":5}]}"#
                            .into(),
                    ),
                ],
                1008,
                "was not given to this worker",
            ),
            // A pipeline stage's answers for steps it never got, and a
            // part of a model it never offered, end the session.
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Text(r#"{"type":"stage_done","v":1,"step":77}"#.into()),
                ],
                1008,
                "step 77 was not given",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Text(
                        r#"{"type":"part_loaded","v":1,"model":"x","first":0,"end":3,"blocks":4}"#
                            .into(),
                    ),
                ],
                1008,
                "never offered",
            ),
            (
                vec![
                    Inbound::Text(register_json("w", 30)),
                    Inbound::Binary(protocol::stage::hidden_frames(3, 4, &[0.5; 8]).remove(0)),
                ],
                1003,
                "hidden states for a step it was not given",
            ),
        ];
        for (frames, want_code, want) in cases {
            let mut s = start(Duration::from_secs(5));
            for f in frames {
                s.tx.send(f).await.expect("send");
            }
            let (code, why) = closed_with(&mut s).await;
            assert!(
                code == want_code && why.contains(want),
                "{want}: {code} {why}"
            );
            s.done.await.expect("session");
            assert!(s.registry.is_empty(), "{want}");
        }
    }
}
