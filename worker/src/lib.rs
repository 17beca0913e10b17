//! `synor worker`: a provider's worker. It serves its models from the
//! same engine the server runs, connects to the server's gateway with its
//! worker token, registers (devices, models and their KV geometry,
//! threads, region), then reports its load every heartbeat. When the
//! server goes away it reconnects with capped exponential backoff and
//! jitter, registering afresh; a refused token is fatal. When told to stop
//! (the caller's signal), or when an admin drains it, it says `drain`,
//! lets running work finish and leaves.
//!
//! Work placed on it arrives as assignments (`jobs`): one choice of a
//! request, maybe continuing after tokens a lost worker delivered. The
//! command line is the `synor` binary's: this crate takes a plain
//! `WorkerConfig` and the loaded models.

mod connection;
pub mod devices;
pub mod jobs;
pub mod kv;
pub mod stage;
pub mod status;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::sync::watch;

use engine::registry::{ModelKind, ModelRegistry};
use protocol::engine_side::served_model;
use protocol::{Ask, FromWorker, ServedModel, VERSION};

/// A frame for the server: a control message or a KV frame (one queue,
/// so a transfer's end never overtakes its frames).
#[derive(Debug)]
pub enum Out {
    Text(String),
    Frame(Vec<u8>),
}

/// What a worker is asked to be.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The server's gateway: `ws://HOST:PORT` (the path is added when
    /// missing).
    pub server: String,
    /// The provider's worker token.
    pub token: String,
    /// A name for this worker (default: the host name).
    pub name: Option<String>,
    /// The market region it runs in.
    pub region: String,
    /// The device its models run on (reported with what was detected).
    pub device: engine::Device,
    /// What its provider asks, per served model; `None`: the house's price.
    pub offer: Option<Offer>,
    /// How often it logs a status line (jobs, speed, checks, earnings);
    /// zero: never.
    pub status_every: Duration,
    /// The model files it may hold a layer range of (pipeline stages).
    pub parts: Vec<stage::PartFile>,
    /// Testing knobs (hidden flags of the command line).
    pub faults: Faults,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .field("name", &self.name)
            .field("region", &self.region)
            .field("device", &self.device)
            .field("offer", &self.offer)
            .field("status_every", &self.status_every)
            .field("parts", &self.parts)
            .field("faults", &self.faults)
            .finish()
    }
}

/// A provider's ask for each model the worker serves: ticks per million
/// tokens of each phase, the protocol fee not included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    pub input: i64,
    pub cached_input: i64,
    pub output: i64,
    /// Generated tokens per second offered (0: what calibration measures).
    pub capacity: u64,
    /// Unix seconds after which the ask lapses (0: while connected).
    pub until: i64,
    pub preemptible: bool,
}

/// Testing knobs of a worker: a slower device, a hung one, a faulty KV
/// link, a cheating provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Hold each generated token this long.
    pub token_delay: Duration,
    /// Run this many assignments, then never answer the next ones.
    pub stall_after: Option<u64>,
    pub kv: kv::Faults,
    /// Replay one job's tokens for every later job, after `cheat_after`
    /// honest ones.
    pub replay: bool,
    pub cheat_after: u64,
    pub stages: stage::StageFaults,
}

/// Reconnect delays: doubling from the first to the cap, with jitter.
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// A connection that lasted this long resets the backoff.
const STABLE: Duration = Duration::from_secs(10);

/// How one connection ended.
pub(crate) enum Ended {
    /// We were told to stop (signal or admin drain): leave.
    Leave,
    /// The connection was lost or closed: try again.
    Lost(String),
}

/// Runs the worker over `models` until `stop` resolves (then it drains)
/// or an admin removes it; stops the models' engines when it leaves.
pub async fn run(
    config: WorkerConfig,
    models: Arc<ModelRegistry>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let url = gateway_url(&config.server)?;
    let stages = Arc::new(stage::Stages::new(
        config.parts.clone(),
        config.faults.stages,
    ));
    let register = registration(&config, &models, &stages);
    let (stop_tx, mut stopped) = watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        let _ = stop_tx.send(true);
    });
    if !config.status_every.is_zero() {
        let base = status::http_base(&config.server)?;
        let (token, every) = (config.token.clone(), config.status_every);
        tokio::spawn(status::report(
            base,
            token,
            models.clone(),
            every,
            stopped.clone(),
        ));
    }
    let mut delay = BACKOFF_FIRST;
    loop {
        let started = Instant::now();
        let link = Link {
            url: &url,
            token: &config.token,
            register: &register,
            models: &models,
            stages: &stages,
            faults: config.faults,
        };
        match connection::connect_once(link, &mut stopped).await? {
            Ended::Leave => break,
            Ended::Lost(why) => {
                if started.elapsed() >= STABLE {
                    delay = BACKOFF_FIRST;
                }
                let wait = jitter(delay);
                tracing::warn!(
                    reason = %why,
                    "lost the server (restarting, or the network dropped); reconnecting in {:.1} s",
                    wait.as_secs_f64()
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = stopped.changed() => break,
                }
                delay = (delay * 2).min(BACKOFF_CAP);
            }
        }
    }
    drain_engines(&models).await;
    models.shutdown();
    tracing::info!("worker stopped");
    Ok(())
}

/// What one connection needs.
pub(crate) struct Link<'a> {
    url: &'a str,
    token: &'a str,
    register: &'a FromWorker,
    models: &'a ModelRegistry,
    stages: &'a Arc<stage::Stages>,
    faults: Faults,
}

/// `ws://host:port` with the gateway's path added when missing (the
/// server's own `http://` address works too).
fn gateway_url(server: &str) -> anyhow::Result<String> {
    let s = server.trim_end_matches('/');
    let s = if let Some(rest) = s.strip_prefix("http://") {
        format!("ws://{rest}")
    } else if let Some(rest) = s.strip_prefix("https://") {
        format!("wss://{rest}")
    } else {
        s.to_string()
    };
    if !(s.starts_with("ws://") || s.starts_with("wss://")) {
        bail!("--server is the server's address: ws://, wss:// or http:// (got `{server}`)");
    }
    let after_scheme = &s[s.find("://").map_or(0, |i| i + 3)..];
    Ok(if after_scheme.contains('/') {
        s.to_string()
    } else {
        format!("{s}/v1/providers/connect")
    })
}

/// A delay between 50% and 100% of `d` (spreads reconnecting workers).
fn jitter(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// What this worker registers: its devices and its text models' geometry.
fn registration(
    config: &WorkerConfig,
    models: &ModelRegistry,
    stages: &stage::Stages,
) -> FromWorker {
    let served = models
        .list()
        .into_iter()
        .filter_map(|m| match &m.kind {
            ModelKind::Text(h) => Some(served_model(&m.name, h.info())),
            ModelKind::Embedding(_) => None,
        })
        .collect::<Vec<ServedModel>>();
    let encoders = models
        .list()
        .into_iter()
        .filter(|m| matches!(m.kind, ModelKind::Embedding(_)))
        .map(|m| m.name.clone())
        .collect();
    let asks = config
        .offer
        .map(|p| {
            served
                .iter()
                .map(|m: &ServedModel| Ask {
                    model: m.name.clone(),
                    input: p.input,
                    cached_input: p.cached_input,
                    output: p.output,
                    capacity: p.capacity,
                    until: p.until,
                    preemptible: p.preemptible,
                })
                .collect()
        })
        .unwrap_or_default();
    FromWorker::Register {
        v: VERSION,
        name: config.name.clone().unwrap_or_else(hostname),
        build: format!("synor {}", env!("CARGO_PKG_VERSION")),
        devices: devices::detect(config.device),
        models: served,
        threads: rayon::current_num_threads() as u32,
        region: config.region.clone(),
        asks,
        encoders,
        parts: stages.offers(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into())
}

/// Waits (at most 30 s) for the engines' running work to finish.
async fn drain_engines(models: &ModelRegistry) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let busy = models.list().iter().any(|m| match &m.kind {
            ModelKind::Text(h) => {
                let s = h.stats();
                s.num_running + s.num_waiting > 0
            }
            ModelKind::Embedding(_) => false,
        });
        if !busy {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_addresses_get_the_path_and_bad_schemes_are_refused() {
        assert_eq!(
            gateway_url("ws://127.0.0.1:8080").expect("url"),
            "ws://127.0.0.1:8080/v1/providers/connect"
        );
        assert_eq!(
            gateway_url("ws://h:1/custom/").expect("url"),
            "ws://h:1/custom"
        );
        assert_eq!(
            gateway_url("http://h:1").expect("the server's http address"),
            "ws://h:1/v1/providers/connect"
        );
        assert!(gateway_url("ftp://h:1").is_err());
        let d = Duration::from_secs(2);
        for _ in 0..100 {
            let j = jitter(d);
            assert!(j >= d / 2 && j <= d);
        }
    }
}
