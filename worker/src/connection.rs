//! One connection to the server's gateway: the handshake (the token as a
//! bearer, the registration, the welcome within `WELCOME_WITHIN`), then
//! the loop until it ends: heartbeats with the engines' load, the job
//! events and KV frames queued for the server, and what the server sends
//! (assignments, prefills, KV ends and aborts, cancels, embeddings,
//! drain). A refused token or a sanction is fatal; anything else that
//! ends the connection is `Ended::Lost` and the caller reconnects.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::{Ended, Faults, Link, Out, jobs, kv};
use engine::registry::{ModelKind, ModelRegistry};
use protocol::engine_side::Meter;
use protocol::{FromWorker, ToWorker, VERSION};

/// How long the server has to answer a registration.
const WELCOME_WITHIN: Duration = Duration::from_secs(10);
/// Messages queued for the server (job events wait when it is full).
const OUT_QUEUE: usize = 1024;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One connection: handshake, register, heartbeats until it ends.
pub(crate) async fn connect_once(
    link: Link<'_>,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<Ended> {
    let (socket, heartbeat) = match open(&link).await? {
        Ok(opened) => opened,
        Err(ended) => return Ok(ended),
    };
    let (mut sink, mut stream) = socket.split();
    let mut session = Session::new(link.models, link.stages.clone(), link.faults);
    let mut meter = Meter::default();
    let mut tick = tokio::time::interval(heartbeat);
    let (out, mut outgoing) = mpsc::channel::<Out>(OUT_QUEUE);
    let ended = loop {
        if session.draining && session.running.is_empty() {
            let _ = sink.send(Message::Close(None)).await;
            break Ended::Leave;
        }
        let sent = tokio::select! {
            _ = tick.tick() => {
                let load = meter.load(&text_engines(link.models));
                let status = serde_json::to_string(&FromWorker::Status { v: VERSION, load })
                    .context("encoding status")?;
                sink.send(Message::Text(status.into())).await
            }
            Some(msg) = outgoing.recv() => {
                let msg = match msg {
                    Out::Text(t) => Message::Text(t.into()),
                    Out::Frame(b) => Message::Binary(b.into()),
                };
                sink.send(msg).await
            }
            frame = stream.next() => match session.on_frame(frame, &out)? {
                Step::Go => Ok(()),
                Step::Drain => {
                    session.draining = start_drain(&mut sink, session.draining).await;
                    Ok(())
                }
                Step::End(ended) => break ended,
            },
            _ = stop.changed(), if !session.draining => {
                tracing::info!("signal: draining");
                session.draining = start_drain(&mut sink, session.draining).await;
                Ok(())
            }
        };
        if let Err(e) = sent {
            break Ended::Lost(e.to_string());
        }
    };
    // Whatever is still running was lost with the connection: the server
    // replays it elsewhere.
    session.running.abort_all();
    Ok(ended)
}

/// Connects with the token, registers and waits for the welcome: the
/// socket and the heartbeat the server asks for, or how it ended.
async fn open(link: &Link<'_>) -> anyhow::Result<Result<(Socket, Duration), Ended>> {
    let url = link.url;
    let mut request = url.into_client_request().context("the --server address")?;
    let auth = format!("Bearer {}", link.token)
        .parse()
        .context("the worker token is not a valid header value")?;
    request.headers_mut().insert("authorization", auth);
    // No Nagle: a stage's answer is frames and then a short message.
    let mut socket = match tokio_tungstenite::connect_async_with_config(request, None, true).await {
        Ok((s, _)) => s,
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 401 => {
            let body = r
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            bail!("the server refused the worker token: {body}");
        }
        Err(e) => return Ok(Err(Ended::Lost(format!("connecting to {url}: {e}")))),
    };
    let text = serde_json::to_string(link.register).context("encoding register")?;
    if let Err(e) = socket.send(Message::Text(text.into())).await {
        return Ok(Err(Ended::Lost(e.to_string())));
    }
    // The first message that is not a ping or a pong must be the welcome.
    let first = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => return other,
            }
        }
    };
    let heartbeat = match tokio::time::timeout(WELCOME_WITHIN, first).await {
        Ok(Some(Ok(Message::Text(t)))) => match serde_json::from_str::<ToWorker>(&t) {
            Ok(ToWorker::Welcome {
                worker_id,
                heartbeat_ms,
                ..
            }) => {
                tracing::info!(worker = %worker_id, url, "registered with the server");
                Duration::from_millis(heartbeat_ms.clamp(100, 60_000))
            }
            other => {
                let why = format!("expected welcome, got {other:?}");
                return Ok(Err(Ended::Lost(why)));
            }
        },
        Ok(Some(Ok(Message::Close(Some(CloseFrame { reason, .. }))))) => {
            bail!("the server refused the registration: {reason}");
        }
        other => return Ok(Err(Ended::Lost(format!("no welcome: {other:?}")))),
    };
    Ok(Ok((socket, heartbeat)))
}

/// What the loop does after a message from the server.
enum Step {
    Go,
    /// The server asked this worker to drain.
    Drain,
    End(Ended),
}

/// One connection's work: what runs, and whether it drains.
struct Session<'a> {
    models: &'a ModelRegistry,
    stages: Arc<crate::stage::Stages>,
    faults: Faults,
    running: Arc<jobs::Running>,
    draining: bool,
}

impl<'a> Session<'a> {
    fn new(models: &'a ModelRegistry, stages: Arc<crate::stage::Stages>, faults: Faults) -> Self {
        let running = Arc::new(if faults.replay {
            jobs::Running::replaying(faults.cheat_after)
        } else {
            jobs::Running::default()
        });
        Self {
            models,
            stages,
            faults,
            running,
            draining: false,
        }
    }

    /// One frame from the server (`Err`: fatal, the worker stops).
    fn on_frame(
        &mut self,
        frame: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
        out: &mpsc::Sender<Out>,
    ) -> anyhow::Result<Step> {
        let lost = |why: String| Ok(Step::End(Ended::Lost(why)));
        match frame {
            Some(Ok(Message::Text(t))) => Ok(self.on_text(&t, out)),
            Some(Ok(Message::Binary(b))) => {
                if protocol::frame_kind(&b) == Some(protocol::FrameKind::Hidden) {
                    self.stages.frame(&b);
                    return Ok(Step::Go);
                }
                // A frame of a transfer no job waits for (cancelled, or
                // given up) is dropped.
                if let Ok(transfer) = protocol::frame_transfer(&b) {
                    let _ = (self.running).arrive(transfer, jobs::Arrival::Frame(b.to_vec()));
                }
                Ok(Step::Go)
            }
            Some(Ok(Message::Close(Some(f))))
                if u16::from(f.code) == protocol::CLOSE_SANCTIONED =>
            {
                bail!("the server closed this worker: {}", f.reason);
            }
            Some(Ok(Message::Close(Some(f)))) if u16::from(f.code) == protocol::CLOSE_REMOVED => {
                tracing::warn!(reason = %f.reason, "removed from the fleet by an admin: leaving");
                Ok(Step::End(Ended::Leave))
            }
            Some(Ok(Message::Close(frame))) => lost(frame.map_or_else(
                || "closed".to_string(),
                |f| format!("closed: {} {}", u16::from(f.code), f.reason),
            )),
            Some(Ok(_)) => Ok(Step::Go),
            Some(Err(e)) => lost(e.to_string()),
            None => lost("connection ended".into()),
        }
    }

    /// One control message from the server.
    fn on_text(&mut self, t: &str, out: &mpsc::Sender<Out>) -> Step {
        let (models, running) = (self.models, &self.running);
        match protocol::decode_from_server(t) {
            Ok(ToWorker::Assign {
                job,
                attempt,
                model,
                prompt,
                resume,
                params,
                kv,
                ..
            }) => {
                let a = jobs::Assignment {
                    job,
                    attempt,
                    model,
                    prompt,
                    resume,
                    params,
                };
                self.assign(a, kv, out);
            }
            Ok(
                m @ (ToWorker::Prefill { .. } | ToWorker::KvEnd { .. } | ToWorker::KvAbort { .. }),
            ) => {
                self.on_transfer(m, out);
            }
            Ok(ToWorker::Cancel { job, .. }) => running.cancel(job),
            Ok(ToWorker::Embed {
                job,
                model,
                texts,
                tokens,
                query,
                ..
            }) => jobs::embed(models, job, &model, texts, tokens, query, out),
            Ok(ToWorker::Drain { .. }) => {
                tracing::warn!(
                    "an admin of the server removed this worker: it finishes its running work, \
                     then exits (start it again to rejoin)"
                );
                return Step::Drain;
            }
            Ok(ToWorker::Pause { paused: true, .. }) => {
                tracing::warn!(
                    "an admin of the server paused this worker: it gets no new work until resumed \
                     (it stays connected; running work finishes)"
                );
            }
            Ok(ToWorker::Pause { paused: false, .. }) => {
                tracing::info!("an admin of the server resumed this worker: it takes work again");
            }
            Ok(ToWorker::Error { code, message, .. }) => {
                tracing::warn!(%code, "the server says: {message}");
            }
            Ok(
                m @ (ToWorker::LoadPart { .. }
                | ToWorker::DropPart { .. }
                | ToWorker::StageStep { .. }),
            ) => {
                self.on_stage(m, out);
            }
            Ok(ToWorker::Welcome { .. }) | Err(_) => {
                let head = &t[..t.len().min(100)];
                return Step::End(Ended::Lost(format!("unexpected message: {head}")));
            }
        }
        Step::Go
    }

    /// A pipeline stage's message: a part to load or drop, a step to run.
    fn on_stage(&self, msg: ToWorker, out: &mpsc::Sender<Out>) {
        use crate::stage::{LoadPart, StageStepMsg};
        match msg {
            ToWorker::LoadPart {
                model,
                first,
                end,
                blocks,
                block_size,
                ..
            } => {
                let part = LoadPart {
                    model,
                    first,
                    end,
                    blocks,
                    block_size,
                };
                self.stages.load(part, out.clone());
            }
            ToWorker::DropPart { model, .. } => self.stages.drop_part(&model),
            ToWorker::StageStep {
                step,
                model,
                chunks,
                rows,
                sampling,
                ..
            } => {
                let s = StageStepMsg {
                    step,
                    model,
                    chunks,
                    rows,
                    sampling,
                };
                self.stages.step(s, out.clone());
            }
            ToWorker::Welcome { .. }
            | ToWorker::Error { .. }
            | ToWorker::Drain { .. }
            | ToWorker::Pause { .. }
            | ToWorker::Assign { .. }
            | ToWorker::Cancel { .. }
            | ToWorker::Embed { .. }
            | ToWorker::Prefill { .. }
            | ToWorker::KvEnd { .. }
            | ToWorker::KvAbort { .. } => {}
        }
    }

    /// A message of a KV transfer: a prefill to run, or the end or
    /// abort of one this worker receives.
    fn on_transfer(&self, msg: ToWorker, out: &mpsc::Sender<Out>) {
        match msg {
            ToWorker::Prefill {
                transfer,
                model,
                prompt,
                params,
                from,
                ..
            } => {
                let from = from as usize;
                let job = kv::Prefill {
                    transfer,
                    model,
                    prompt,
                    params,
                    from,
                };
                self.running
                    .start_prefill(self.models, job, out, self.faults.kv);
            }
            ToWorker::KvEnd {
                transfer,
                tokens,
                digest,
                first,
                ..
            } => {
                let end = jobs::Arrival::End {
                    tokens,
                    digest,
                    first,
                };
                self.running.arrive(transfer, end);
            }
            ToWorker::KvAbort {
                transfer, reason, ..
            } => {
                self.running.arrive(transfer, jobs::Arrival::Abort(reason));
            }
            ToWorker::Welcome { .. }
            | ToWorker::Error { .. }
            | ToWorker::Drain { .. }
            | ToWorker::Pause { .. }
            | ToWorker::LoadPart { .. }
            | ToWorker::DropPart { .. }
            | ToWorker::StageStep { .. }
            | ToWorker::Assign { .. }
            | ToWorker::Cancel { .. }
            | ToWorker::Embed { .. } => {}
        }
    }

    /// Starts an assignment (its prompt's KV from a transfer when `kv`
    /// says so), or refuses it while draining.
    fn assign(
        &self,
        a: jobs::Assignment,
        kv: Option<protocol::KvIncoming>,
        out: &mpsc::Sender<Out>,
    ) {
        let f = self.faults;
        if self.draining {
            let refused = FromWorker::Failed {
                v: VERSION,
                job: a.job,
                attempt: a.attempt,
                message: "this worker is draining".into(),
            };
            let text = serde_json::to_string(&refused).unwrap_or_default();
            jobs::send_later(out, Out::Text(text));
        } else if let Some(kv) = kv {
            self.running
                .start_split(self.models, a, kv.transfer, out, f.token_delay);
        } else {
            self.running
                .start(self.models, a, out, f.token_delay, f.stall_after);
        }
    }
}

/// Tells the server this worker drains (once); returns the new state.
async fn start_drain<S>(sink: &mut S, draining: bool) -> bool
where
    S: SinkExt<Message> + Unpin,
{
    if !draining {
        let drain = serde_json::to_string(&FromWorker::Drain { v: VERSION }).unwrap_or_default();
        let _ = sink.send(Message::Text(drain.into())).await;
    }
    true
}

/// The text engines of `models` (their load is the worker's).
fn text_engines(models: &ModelRegistry) -> Vec<engine::EngineHandle> {
    models
        .list()
        .into_iter()
        .filter_map(|m| match m.kind {
            ModelKind::Text(h) => Some(h),
            ModelKind::Embedding(_) => None,
        })
        .collect()
}
