//! The fleet bus: several `synor serve` replicas share their workers over
//! Redis pub/sub (the deployment's Redis, already there for the shared
//! response cache; no cluster protocol of our own). Each replica
//! announces its own workers every second on `<ns>:fleet:announce`, and
//! lists the others' until `REMOTE_TTL` passes without an announcement
//! (their jobs are then lost, and replayed). A relay that places an
//! attempt on another replica's worker keeps its job slot at home and
//! sends the assignment (and any cancel) to that replica's channel
//! `<ns>:fleet:to:<replica>`; the worker's replica opens a slot for it
//! and sends every event of the attempt back to the origin's channel,
//! where it reaches the relay as if the worker were local. Job ids are
//! unique across replicas (`Jobs` starts each at a random base).
//!
//! The connection is retried with backoff when Redis goes away; messages
//! queued meanwhile are bounded (`QUEUE`) and dropped past it (relays
//! time out and replay, as for a silent worker).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::assignments::JobEvent;
use super::registry::{Forward, Registry};
use engine::core::CoreEvent;
use engine::{FinishReason, TokenLogprob, Usage};
use protocol::ToWorker;
use protocol::bus::{BusEvent as Wire, BusMessage as Msg, decode_bus, encode_bus};

/// Messages waiting for the connection.
const QUEUE: usize = 4096;
/// How often this replica announces its workers.
const ANNOUNCE: Duration = Duration::from_secs(1);

/// A job event as the bus carries it.
fn wire_of(ev: JobEvent) -> Wire {
    match ev {
        JobEvent::Core(CoreEvent::Accepted) => Wire::Accepted,
        JobEvent::Core(CoreEvent::Token { id, logprob }) => Wire::Token {
            id,
            logprob: logprob.as_ref().map(|l| l.logprob),
            top: logprob.map(|l| l.top).unwrap_or_default(),
        },
        JobEvent::Core(CoreEvent::Finished { reason, usage }) => Wire::Finished {
            reason: reason.as_openai().to_string(),
            prompt: usage.prompt_tokens,
            cached: usage.cached_tokens,
            completion: usage.completion_tokens,
        },
        JobEvent::Core(CoreEvent::Failed(e)) => Wire::Lost { why: e.to_string() },
        JobEvent::Lost(why) => Wire::Lost { why },
        // Embedding jobs go to this replica's own workers only.
        JobEvent::Embedded(_) => Wire::Lost {
            why: "embeddings do not cross replicas".into(),
        },
    }
}

/// A job event off the bus.
fn event_of(w: Wire) -> JobEvent {
    match w {
        Wire::Accepted => JobEvent::Core(CoreEvent::Accepted),
        Wire::Token { id, logprob, top } => JobEvent::Core(CoreEvent::Token {
            id,
            logprob: logprob.map(|logprob| TokenLogprob {
                token: id,
                logprob,
                top,
            }),
        }),
        Wire::Finished {
            reason,
            prompt,
            cached,
            completion,
        } => {
            let reason = match reason.as_str() {
                "stop" => FinishReason::Stop,
                "length" => FinishReason::Length,
                _ => FinishReason::Abort,
            };
            JobEvent::Core(CoreEvent::Finished {
                reason,
                usage: Usage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    cached_tokens: cached,
                },
            })
        }
        Wire::Lost { why } => JobEvent::Lost(why),
    }
}

/// This replica's end of the bus.
pub struct Bus {
    replica: String,
    ns: String,
    out: mpsc::Sender<(String, String)>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Bus {
    fn channel(&self, replica: &str) -> String {
        format!("{}:fleet:to:{replica}", self.ns)
    }

    fn announce_channel(&self) -> String {
        format!("{}:fleet:announce", self.ns)
    }

    /// Queues `msg` for `channel`; false when the queue is full.
    fn publish(&self, channel: String, msg: &Msg) -> bool {
        self.out.try_send((channel, encode_bus(msg))).is_ok()
    }
}

impl Forward for Bus {
    fn forward<'a>(
        &'a self,
        replica: &'a str,
        worker: &'a str,
        msg: ToWorker,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        let m = Msg::ToWorker {
            origin: self.replica.clone(),
            worker: worker.to_string(),
            msg: Box::new(msg),
        };
        let sent = self.publish(self.channel(replica), &m);
        Box::pin(async move { sent })
    }
}

/// Connects `registry` to the bus at `url` (a Redis URL) under the
/// namespace `ns`, and keeps it connected for good.
pub fn start(url: &str, ns: &str, registry: Arc<Registry>) -> Result<Arc<Bus>, String> {
    let client = redis::Client::open(url).map_err(|e| format!("--fleet-bus `{url}`: {e}"))?;
    let (out, queue) = mpsc::channel(QUEUE);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let bus = Arc::new(Bus {
        replica: format!("r-{}", &id[..10]),
        ns: ns.to_string(),
        out,
    });
    registry.connect_bus(bus.replica.clone(), bus.clone());
    tokio::spawn(run(client, bus.clone(), registry, queue));
    Ok(bus)
}

/// Connects, serves until the connection fails, and again after a pause.
async fn run(
    client: redis::Client,
    bus: Arc<Bus>,
    registry: Arc<Registry>,
    mut queue: mpsc::Receiver<(String, String)>,
) {
    let mut pause = Duration::from_millis(200);
    loop {
        match connected(&client, &bus, &registry, &mut queue).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, replica = %bus.replica, "fleet bus down; reconnecting");
                registry.expire_remote();
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// One connection's life: subscribe, then announce, publish and receive.
async fn connected(
    client: &redis::Client,
    bus: &Arc<Bus>,
    registry: &Arc<Registry>,
    queue: &mut mpsc::Receiver<(String, String)>,
) -> Result<(), redis::RedisError> {
    let mut publisher = client.get_multiplexed_async_connection().await?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(bus.announce_channel()).await?;
    pubsub.subscribe(bus.channel(&bus.replica)).await?;
    let mut incoming = pubsub.into_on_message();
    tracing::info!(replica = %bus.replica, "fleet bus connected");
    let mut tick = tokio::time::interval(ANNOUNCE);
    loop {
        tokio::select! {
            m = incoming.next() => match m {
                Some(m) => received(bus, registry, m.get_payload_bytes()),
                None => return Err(redis::RedisError::from(std::io::Error::other("subscription ended"))),
            },
            item = queue.recv() => match item {
                Some((channel, text)) => {
                    redis::cmd("PUBLISH").arg(&channel).arg(&text)
                        .query_async::<i64>(&mut publisher).await?;
                }
                None => return Ok(()),
            },
            // Every second, and at once when a worker comes or goes.
            _ = async { tokio::select! { _ = tick.tick() => {}, _ = registry.changed.notified() => {} } } => {
                registry.expire_remote();
                let m = Msg::Announce { replica: bus.replica.clone(), workers: registry.local() };
                let text = encode_bus(&m);
                redis::cmd("PUBLISH").arg(bus.announce_channel()).arg(&text)
                    .query_async::<i64>(&mut publisher).await?;
            }
        }
    }
}

/// Handles one message from another replica.
fn received(bus: &Arc<Bus>, registry: &Arc<Registry>, payload: &[u8]) {
    let msg = match decode_bus(payload) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable fleet bus message dropped");
            return;
        }
    };
    match msg {
        Msg::Announce { replica, workers } if replica != bus.replica => {
            registry.announced(&replica, workers);
        }
        Msg::Announce { .. } => {}
        Msg::ToWorker {
            origin,
            worker,
            msg,
        } => {
            let (bus, registry) = (bus.clone(), registry.clone());
            tokio::spawn(async move { for_worker(&bus, &registry, origin, worker, *msg).await });
        }
        Msg::Events {
            job,
            attempt,
            worker,
            events,
        } => {
            for ev in events {
                registry.jobs.deliver(&worker, job, attempt, event_of(ev));
            }
        }
    }
}

/// Runs another replica's message for one of this replica's workers: an
/// assignment opens a slot whose events travel back to `origin`; a pause
/// or resume changes its state here.
async fn for_worker(
    bus: &Arc<Bus>,
    registry: &Arc<Registry>,
    origin: String,
    worker: String,
    msg: ToWorker,
) {
    let assigned = match &msg {
        ToWorker::Assign { job, attempt, .. } => Some((*job, *attempt)),
        // An admin of another replica paused or resumed it: the state is
        // kept here, where the worker is, and announced from here.
        ToWorker::Pause { paused, .. } => {
            registry.pause(&worker, *paused);
            return;
        }
        ToWorker::Welcome { .. }
        | ToWorker::Error { .. }
        | ToWorker::Drain { .. }
        | ToWorker::Cancel { .. }
        | ToWorker::Prefill { .. }
        | ToWorker::Embed { .. }
        | ToWorker::KvEnd { .. }
        | ToWorker::KvAbort { .. }
        | ToWorker::LoadPart { .. }
        | ToWorker::DropPart { .. }
        | ToWorker::StageStep { .. } => None,
    };
    if let Some((job, attempt)) = assigned {
        let (tx, rx) = mpsc::unbounded_channel();
        registry.jobs.place(job, &worker, attempt, tx);
        let to = Origin {
            bus: bus.clone(),
            registry: registry.clone(),
            replica: origin.clone(),
        };
        tokio::spawn(pump(to, worker.clone(), job, attempt, rx));
    }
    if !registry.send_local(&worker, msg).await
        && let Some((job, attempt)) = assigned
    {
        registry.jobs.deliver(
            &worker,
            job,
            attempt,
            JobEvent::Lost("the worker is gone".into()),
        );
    }
}

/// Where an attempt's events go back to.
struct Origin {
    bus: Arc<Bus>,
    registry: Arc<Registry>,
    replica: String,
}

/// Sends an attempt's events back to the replica that placed it, a batch
/// at a time, until its last; then closes its slot here.
async fn pump(
    to: Origin,
    worker: String,
    job: u64,
    attempt: u32,
    mut rx: mpsc::UnboundedReceiver<JobEvent>,
) {
    let mut delivered = 0;
    while let Some(first) = rx.recv().await {
        let mut events = vec![wire_of(first)];
        while let Ok(more) = rx.try_recv() {
            events.push(wire_of(more));
        }
        delivered += events
            .iter()
            .filter(|e| matches!(e, Wire::Token { .. }))
            .count();
        let done = events.iter().any(Wire::terminal);
        let m = Msg::Events {
            job,
            attempt,
            worker: worker.clone(),
            events,
        };
        if !to.bus.publish(to.bus.channel(&to.replica), &m) {
            tracing::warn!(job, "fleet bus queue full: events dropped");
        }
        if done {
            break;
        }
    }
    // This replica forgets the attempt (unless it was replaced since) and
    // counts what its worker delivered (the origin keeps the standing).
    to.registry.jobs.end_attempt(job, attempt);
    to.registry.delivered(&worker, delivered);
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fleet::registry::Registration;
    use protocol::JobParams;

    fn worker(r: &Registry) -> (String, mpsc::Receiver<crate::fleet::registry::ToSession>) {
        let (tx, rx) = mpsc::channel(8);
        let reg = Registration::for_test("p", vec![]);
        (r.register(reg, tx), rx)
    }

    fn assign(job: u64) -> ToWorker {
        ToWorker::Assign {
            v: protocol::VERSION,
            job,
            attempt: 1,
            model: "m".into(),
            prompt: vec![1, 2],
            resume: vec![],
            kv: None,
            params: JobParams {
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                min_p: 0.0,
                seed: 1,
                max_tokens: 2,
                stop_token_ids: vec![],
                ignore_eos: true,
                repetition_penalty: 1.0,
                frequency_penalty: 0.0,
                presence_penalty: 0.0,
                logit_bias: vec![],
                logprobs: None,
                tenant: 0,
            },
        }
    }

    #[tokio::test]
    async fn a_replica_places_work_on_another_replicas_worker_through_redis() {
        let url = crate::cache::tests::redis_url();
        let ns = format!("test-{}", uuid::Uuid::new_v4().simple());
        let (a, b) = (Arc::new(Registry::default()), Arc::new(Registry::default()));
        start(&url, &ns, a.clone()).expect("bus a");
        start(&url, &ns, b.clone()).expect("bus b");
        let (w, mut session) = worker(&a);
        a.set_profile(
            &w,
            crate::fleet::registry::Profile {
                prefill_tokens_per_s: 1.0,
                prefill_ms_long: 0.0,
                decode_step_ms_1: 1.0,
                decode_step_ms_4: 1.0,
                measured_at: 1,
            },
        );
        // B lists A's worker, active, with A's replica and profile.
        let seen = async {
            loop {
                if let Some(x) = b.serving("m").into_iter().find(|x| x.id == w) {
                    return x;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let listed = tokio::time::timeout(Duration::from_secs(5), seen)
            .await
            .expect("B sees the worker");
        assert_eq!(listed.replica, a.replica());
        assert!(listed.profile.is_some());
        // B's relay places a job on it: the assignment reaches the worker's
        // session on A, and the worker's events reach B's slot.
        let job = b.jobs.next_id();
        let (tx, mut events) = mpsc::unbounded_channel();
        b.jobs.place(job, &w, 1, tx);
        assert!(b.send(&w, assign(job)).await);
        let got = tokio::time::timeout(Duration::from_secs(5), session.recv())
            .await
            .expect("assigned")
            .expect("message");
        assert!(
            matches!(got, crate::fleet::registry::ToSession::Msg(ToWorker::Assign { job: j, .. }) if j == job)
        );
        let token = JobEvent::Core(CoreEvent::Token {
            id: 9,
            logprob: None,
        });
        assert_eq!(
            a.jobs.deliver(&w, job, 1, token),
            super::super::assignments::Delivery::Delivered
        );
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("event")
            .expect("open");
        assert!(matches!(ev, JobEvent::Core(CoreEvent::Token { id: 9, .. })));
        // The worker leaves A: B's job hears it is lost, and B drops it.
        a.remove(&w);
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("lost")
            .expect("open");
        assert!(matches!(ev, JobEvent::Lost(_)), "{ev:?}");
        let gone = async {
            while !b.serving("m").is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), gone)
            .await
            .expect("B forgets it");
    }

    #[test]
    fn job_events_cross_the_bus_unchanged() {
        let events = vec![
            JobEvent::Core(CoreEvent::Accepted),
            JobEvent::Core(CoreEvent::Token {
                id: 7,
                logprob: Some(TokenLogprob {
                    token: 7,
                    logprob: -0.5,
                    top: vec![(7, -0.5), (3, -1.5)],
                }),
            }),
            JobEvent::Core(CoreEvent::Token {
                id: 9,
                logprob: None,
            }),
            JobEvent::Core(CoreEvent::Finished {
                reason: FinishReason::Length,
                usage: Usage {
                    prompt_tokens: 4,
                    completion_tokens: 2,
                    cached_tokens: 1,
                },
            }),
            JobEvent::Lost("gone".into()),
        ];
        for ev in events {
            let before = format!("{ev:?}");
            let wire = wire_of(ev);
            let text = serde_json::to_string(&wire).expect("json");
            let back: Wire = serde_json::from_str(&text).expect("parse");
            assert_eq!(back, wire);
            assert_eq!(format!("{:?}", event_of(back)), before);
        }
    }
}
