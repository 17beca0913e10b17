//! Command line and environment configuration: one typed tree (clap derive,
//! every option also from a `SYNOR_*` variable), with the defaults `make run`
//! relies on: 127.0.0.1:8080, the default models under `./models`, and a
//! SQLite file under `./data`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use engine::GenerationDefaults;

/// Synor Compute: OpenAI-compatible inference serving.
#[derive(Debug, Parser)]
#[command(name = "synor", version, about, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the configured models over the OpenAI-compatible HTTP API.
    Serve(Box<ServeArgs>),
    /// Manage API keys in the database.
    Keys(KeysArgs),
    /// Manage ledger accounts: list, create, top up.
    Accounts(AccountsArgs),
    /// Manage providers and their worker tokens.
    Providers(ProvidersArgs),
    /// Run a provider worker: load models, connect to a server's gateway,
    /// register, report load, and run what it is given.
    Worker(Box<WorkerArgs>),
    /// Simulate a fleet in virtual time: the production placement,
    /// pricing, spot checks and settlement over described providers and
    /// a trace or generated workload; writes a report.
    Simulate(crate::simulate_cli::SimulateArgs),
    /// Write the OpenAPI description (default: openapi/openapi.json).
    Openapi {
        #[arg(long, default_value = "openapi/openapi.json")]
        out: PathBuf,
    },
}

/// The database the CLI commands work on: the server's, which must
/// exist (a command run from another directory would otherwise make a new
/// empty one beside it, and a key made there is one the server never sees).
#[derive(Debug, Clone, Args)]
pub struct DatabaseArg {
    /// Database of keys and the ledger (SQLite file or Postgres URL): the
    /// one `synor serve` uses (accepted before or after the subcommand).
    #[arg(
        long,
        global = true,
        env = "SYNOR_DATABASE_URL",
        default_value = "sqlite://data/synor.db"
    )]
    pub database_url: ServiceUrl,
}

impl DatabaseArg {
    /// Connects (and migrates) to a database that exists.
    pub async fn connect(&self) -> anyhow::Result<money::store::Db> {
        use anyhow::Context;
        let url = self.database_url.expose();
        if let Some(path) = missing_sqlite_file(url) {
            anyhow::bail!(
                "no database at {path} (from --database-url {url}, relative to {}): run this \
                 where `synor serve` runs (the server creates its database on start), or pass \
                 the server's own --database-url",
                std::env::current_dir().map_or("?".into(), |d| d.display().to_string())
            );
        }
        money::store::Db::connect(url)
            .await
            .with_context(|| format!("opening the database {}", self.database_url))
    }
}

/// The file of a `sqlite://` URL when it does not exist.
fn missing_sqlite_file(url: &str) -> Option<String> {
    let rest = url.strip_prefix("sqlite://")?;
    let path = rest.split('?').next().unwrap_or(rest);
    (path != ":memory:" && !std::path::Path::new(path).exists()).then(|| path.to_string())
}

/// Options of `synor keys`.
#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    #[command(subcommand)]
    pub action: KeysAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum KeysAction {
    /// Create a key; its secret is printed once.
    Create {
        #[arg(long)]
        name: String,
        /// Requests per minute.
        #[arg(long)]
        rpm: Option<i64>,
        /// Tokens per minute (prompt plus max_tokens, charged at admission).
        #[arg(long)]
        tpm: Option<i64>,
        /// Requests in flight at once.
        #[arg(long)]
        max_concurrent: Option<i64>,
        /// The user account it spends from (default: a new account).
        #[arg(long)]
        account: Option<String>,
        /// Most the key may spend (an amount like 2.5).
        #[arg(long)]
        budget: Option<String>,
    },
    /// List keys (never their secrets).
    List,
    /// Revoke a key by id.
    Revoke { id: String },
}

/// Options of `synor accounts`.
#[derive(Debug, Clone, Args)]
pub struct AccountsArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    #[command(subcommand)]
    pub action: AccountsAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AccountsAction {
    /// List accounts with their balances.
    List,
    /// Create a user account.
    Create {
        #[arg(long)]
        name: String,
        /// How far below zero it may go (an amount like 10).
        #[arg(long, default_value = "0")]
        credit_limit: String,
    },
    /// Credit an amount (like 25 or 0.5) to an account.
    Topup {
        id: String,
        amount: String,
        #[arg(long, default_value = "")]
        memo: String,
    },
}

/// The response cache.
#[derive(Debug, Clone, Args)]
pub struct CacheArgs {
    /// Turn the response cache off.
    #[arg(long, env = "SYNOR_NO_CACHE")]
    pub no_cache: bool,

    /// Folder of the disk tier (L2).
    #[arg(long, env = "SYNOR_CACHE_DIR", default_value = "data/cache")]
    pub cache_dir: PathBuf,

    /// Memory of the in-process tier (L1), e.g. `256MiB`.
    #[arg(long, env = "SYNOR_CACHE_L1_BYTES", default_value = "256MiB", value_parser = parse_size)]
    pub cache_l1_bytes: usize,

    /// Disk space of L2, e.g. `1GiB`.
    #[arg(long, env = "SYNOR_CACHE_L2_BYTES", default_value = "1GiB", value_parser = parse_size)]
    pub cache_l2_bytes: usize,

    /// Seconds a cached answer lives.
    #[arg(long, env = "SYNOR_CACHE_TTL", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub cache_ttl: u64,

    /// Redis for the shared tier (L3), e.g. `redis://127.0.0.1:6379/`.
    #[arg(long, env = "SYNOR_REDIS_URL")]
    pub redis_url: Option<ServiceUrl>,

    /// Similarity a semantic candidate needs (cosine, 0-1); the verifier
    /// then decides (see `--semantic-verify`).
    #[arg(long, env = "SYNOR_SEMANTIC_THRESHOLD", default_value_t = 0.70, value_parser = fraction_f32)]
    pub semantic_threshold: f32,

    /// Whether a semantic candidate must also pass the verifier (same
    /// numbers, names, units and direction, negation, question kind,
    /// language and topic). `false` trusts similarity alone.
    #[arg(long, env = "SYNOR_SEMANTIC_VERIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub semantic_verify: bool,

    /// Let topic words that differ match by their word vectors at this
    /// similarity (0-1; unset: only the same stems match).
    #[arg(long, env = "SYNOR_SEMANTIC_ALIGN")]
    pub semantic_align: Option<f32>,

    /// A bound on wrong answers (0-1, e.g. 0.01; unset: off): near matches
    /// are served only as far as verification by the served model has
    /// learned they may be, the share served wrong staying under it; the
    /// others are generated and compared. Per model through the admin API.
    #[arg(long, env = "SYNOR_SEMANTIC_DELTA", value_parser = fraction_f32)]
    pub semantic_delta: Option<f32>,

    /// Put each near match that passes the verifier's structure to the
    /// requested model as a judge, serving it when its chance that both
    /// questions get the same answer is at least this (0-1; unset: off).
    /// One prefill pair per near match, on the response path: for models
    /// able to judge (BENCHMARKS.md). Per model through the admin API.
    #[arg(long, env = "SYNOR_SEMANTIC_JUDGE", value_parser = fraction_f32)]
    pub semantic_judge: Option<f32>,

    /// Price of a cache hit as a fraction of the generated price (bps).
    #[arg(long, env = "SYNOR_CACHE_PRICE_BPS", default_value_t = 1_000, value_parser = clap::value_parser!(i64).range(0..=10_000))]
    pub cache_price_bps: i64,
}

impl CacheArgs {
    /// The cache's configuration (`None` when it is off).
    pub fn to_config(&self) -> Option<server::cache::CacheConfig> {
        let ttl = std::time::Duration::from_secs(self.cache_ttl);
        (!self.no_cache).then(|| server::cache::CacheConfig {
            l1_bytes: self.cache_l1_bytes as u64,
            l2_dir: Some(self.cache_dir.clone()),
            l2_bytes: self.cache_l2_bytes as u64,
            redis_url: self.redis_url.as_ref().map(|u| u.expose().to_string()),
            ttl,
            policy: server::cache::semantic::Policy {
                threshold: self.semantic_threshold,
                verify: self.semantic_verify,
                align: self
                    .semantic_align
                    .filter(|a| (0.0..=1.0).contains(a) && *a > 0.0),
                delta: self.semantic_delta.filter(|d| *d > 0.0 && *d < 1.0),
                judge: self.semantic_judge.filter(|j| *j > 0.0 && *j <= 1.0),
            },
            // 384 floats (1.5 KiB) per entry: at most about 80 MB.
            semantic: server::cache::semantic::Limits {
                per_index: 5_000,
                total: 50_000,
                ttl,
            },
        })
    }
}

/// Options of `synor serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub models: ModelArgs,

    #[command(flatten)]
    pub scheduler: SchedulerArgs,

    #[command(flatten)]
    pub cache: CacheArgs,

    /// Log format: `text` or `json`.
    #[arg(long, env = "SYNOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Read options from a TOML file (its `[serve]` and `[worker]`
    /// tables, keyed by these flags' names); flags given here win.
    #[arg(long, env = "SYNOR_CONFIG")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub listen: ListenArgs,

    #[command(flatten)]
    pub access: AccessArgs,

    #[command(flatten)]
    pub ledger: LedgerArgs,

    #[command(flatten)]
    pub fleet: FleetArgs,

    #[command(flatten)]
    pub spot: SpotCheckArgs,
}

/// How the HTTP listener takes connections and lets them go.
#[derive(Debug, Clone, Args)]
pub struct ListenArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SYNOR_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,

    /// Largest accepted request body, in bytes (larger bodies get 413).
    #[arg(long, env = "SYNOR_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Seconds a client has to send a request's headers (from connecting,
    /// or from its previous response on a kept-alive connection) before
    /// the connection is closed.
    #[arg(long, env = "SYNOR_HEADER_TIMEOUT", default_value_t = 10.0, value_parser = seconds_within::<100, 3_600>)]
    pub header_timeout: f64,

    /// Open connections one client address may hold; more are answered
    /// 503 and closed.
    #[arg(long, env = "SYNOR_MAX_CONNECTIONS_PER_CLIENT", default_value_t = 512, value_parser = at_least_one)]
    pub max_connections_per_client: usize,

    /// Seconds that running streams get to finish after SIGTERM/SIGINT.
    /// Meanwhile `/health` answers 503 `draining` (so load balancers move
    /// away) and new API requests get 503; the server exits as soon as
    /// nothing runs.
    #[arg(long, env = "SYNOR_SHUTDOWN_GRACE", default_value_t = 30.0, value_parser = seconds_within::<0, 86_400>)]
    pub shutdown_grace: f64,
}

/// Who may call the API and the admin API.
#[derive(Debug, Clone, Args)]
pub struct AccessArgs {
    /// Open single-user mode: no API key needed (loopback addresses only;
    /// `make run` uses it).
    #[arg(long, env = "SYNOR_OPEN")]
    pub open: bool,

    /// Token for the admin API (`/admin/...`); unset disables it.
    #[arg(long, env = "SYNOR_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<Secret>,

    /// Failed admin authentications one address may make in a row before
    /// it must wait (one more a second).
    #[arg(long, env = "SYNOR_ADMIN_AUTH_BURST", default_value_t = 10)]
    pub admin_auth_burst: u32,
}

/// Where the money is kept and how it settles.
#[derive(Debug, Clone, Args)]
pub struct LedgerArgs {
    /// Database of the ledger and market (SQLite file or Postgres URL).
    #[arg(
        long,
        env = "SYNOR_DATABASE_URL",
        default_value = "sqlite://data/synor.db"
    )]
    pub database_url: ServiceUrl,

    /// The protocol fee on every token, in basis points (500-1000 = 5-10%).
    #[arg(long, env = "SYNOR_PROTOCOL_FEE_BPS", default_value_t = 700,
          value_parser = clap::value_parser!(i64).range(0..=10_000))]
    pub protocol_fee_bps: i64,

    /// Seconds a provider's earnings stay pending before they are final:
    /// a failed spot check can claw them back meanwhile, and penalties
    /// take final funds only.
    #[arg(long, env = "SYNOR_EARNINGS_WINDOW", default_value_t = 3600)]
    pub earnings_window: u64,

    /// Seconds without a heartbeat after which another server instance
    /// counts as dead and its open holds are released.
    #[arg(long, env = "SYNOR_INSTANCE_STALE_AFTER", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    pub instance_stale_after: u64,
}

/// How a pipeline's layers are shared among its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PipelinePlacement {
    Measured,
    Even,
}

/// How work is placed on the fleet's workers and watched there.
#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// A model to serve as a pipeline of workers that each hold a layer
    /// range (`synor worker --part-model NAME=PATH`), for models no one
    /// worker holds: `NAME=PATH` (repeatable). The server reads only its
    /// metadata and tokenizer.
    #[arg(long = "pipeline-model", value_name = "NAME=PATH", value_parser = parse_extra_model)]
    pub pipeline_models: Vec<(String, PathBuf)>,

    /// KV blocks (16 tokens each) every pipeline stage holds for each of
    /// its layers: the tokens a pipeline model's running sequences share.
    #[arg(long, env = "SYNOR_PIPELINE_KV_BLOCKS", default_value_t = 512)]
    pub pipeline_kv_blocks: u32,

    /// Seconds a pipeline stage has for one step before it is replaced,
    /// and a step waits for a chain of workers when there is none (then
    /// its requests fail with 503 and `Retry-After`).
    #[arg(long, env = "SYNOR_PIPELINE_STEP_TIMEOUT", default_value_t = 60.0)]
    pub pipeline_step_timeout: f64,

    /// A pipeline step's batch goes through the chain in at most this
    /// many micro-batches at once, so each stage computes one while the
    /// next computes another (0: as many as the chain has stages; 1: the
    /// whole batch at once). It pays where a stage's time grows with its
    /// tokens (prefill, compute-bound devices); where a step costs a stage
    /// about the same at any batch size, each micro-batch costs a whole
    /// step (BENCHMARKS.md, session 38).
    #[arg(long, env = "SYNOR_PIPELINE_MICRO_BATCHES", default_value_t = 1)]
    pub pipeline_micro_batches: usize,

    /// Chains a pipeline model runs on at most at once, each an engine on
    /// workers of its own (formed while the fleet has workers for them);
    /// each request goes to the chain expected to serve it soonest.
    #[arg(long, env = "SYNOR_PIPELINE_CHAINS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub pipeline_chains: u64,

    /// How a pipeline's layers are shared among its workers: `measured`
    /// (in proportion to each worker's measured speed, re-planned when
    /// the measures say the slowest stage would gain at least 20%), or
    /// `even` (the same number each, for comparisons).
    #[arg(long, env = "SYNOR_PIPELINE_PLACEMENT", value_enum, default_value_t = PipelinePlacement::Measured)]
    pub pipeline_placement: PipelinePlacement,

    /// How choices are placed: `measured` (the cost model: price,
    /// expected time from calibration, reputation and load), or, for
    /// comparisons, `round-robin`, `least-loaded` or `cheapest-first`
    /// over the workers serving the model.
    #[arg(long, env = "SYNOR_PLACEMENT", value_enum, default_value_t = Placement::Measured)]
    pub placement: Placement,

    /// How placement weighs each executor's price, expected time,
    /// unloaded speed, provider reputation and load: `cost=0.3,latency=0.2,
    /// capability=0.2,reputation=0.15,load=0.15` (the default; terms left
    /// out weigh 0). `latency=1` places by expected finish time alone.
    #[arg(
        long,
        env = "SYNOR_PLACEMENT_WEIGHTS",
        default_value = "cost=0.3,latency=0.2,capability=0.2,reputation=0.15,load=0.15"
    )]
    pub placement_weights: server::services::placement::Weights,

    /// How much the house engine's expected wait weighs against the
    /// workers' when placing a choice (1 = as it is measured; larger sends
    /// work to workers first, keeping the house as the fallback).
    #[arg(long, env = "SYNOR_PLACEMENT_HOUSE_FACTOR", default_value_t = 1.0, value_parser = positive)]
    pub placement_house_factor: f64,

    /// Past saturation (every executor of a model at its batch cap), at
    /// most this many choices wait for room; more are refused with 503
    /// and Retry-After.
    #[arg(long, env = "SYNOR_FLEET_MAX_QUEUE", default_value_t = 256)]
    pub fleet_max_queue: usize,

    /// Seconds a choice waits for room before it fails with 503.
    #[arg(long, env = "SYNOR_FLEET_QUEUE_TIMEOUT", default_value_t = 30.0, value_parser = seconds_within::<0, 3_600>)]
    pub fleet_queue_timeout: f64,

    /// The decode step (ms) a choice should see: each executor takes at
    /// most as many choices at once as keep its step under it (from its
    /// calibration, shrunk x0.7 when a step misses it, grown when well
    /// under); a full executor counts four times slower in placement.
    #[arg(long, env = "SYNOR_FLEET_STEP_TARGET_MS", default_value_t = 100.0, value_parser = positive)]
    pub fleet_step_target_ms: f64,

    /// Seconds a worker may run a job without sending anything before the
    /// job is taken from it and replayed elsewhere.
    #[arg(long, env = "SYNOR_FLEET_PROGRESS_TIMEOUT", default_value_t = 30.0, value_parser = seconds_within::<100, 3_600>)]
    pub fleet_progress_timeout: f64,

    /// A choice a worker has not started after this many milliseconds
    /// (queued behind others) is taken by an idle worker.
    #[arg(long, env = "SYNOR_FLEET_STEAL_AFTER_MS", default_value_t = 1000)]
    pub fleet_steal_after_ms: u64,

    /// Prefill a choice's prompt on another worker than its decode, the
    /// KV moved between them: `auto` when the cost model expects it to
    /// pay, `always` whenever a second worker can, `never`.
    #[arg(long, env = "SYNOR_FLEET_SPLIT", default_value = "auto")]
    pub fleet_split: server::services::placement::SplitMode,

    /// Seconds a worker has for each calibration challenge (a whole
    /// calibration has 2.5 times as long). A worker that answers some
    /// challenges right and then runs out of time is told it is too slow
    /// for the model, not quarantined.
    #[arg(long, env = "SYNOR_FLEET_CALIBRATION_TIMEOUT", default_value_t = 60.0, value_parser = seconds_within::<1_000, 3_600>)]
    pub fleet_calibration_timeout: f64,

    /// Seconds a KV transfer may take before the decode worker
    /// recomputes the prompt instead.
    #[arg(long, env = "SYNOR_FLEET_KV_TIMEOUT", default_value_t = 10.0, value_parser = seconds_within::<50, 3_600>)]
    pub fleet_kv_timeout: f64,

    /// The most workers one worker token may have connected to this
    /// server at once (more are refused at registration).
    #[arg(long, env = "SYNOR_FLEET_MAX_WORKERS_PER_TOKEN", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub fleet_max_workers_per_token: u32,

    /// The most workers one provider may have connected to this server at
    /// once, over all its tokens.
    #[arg(long, env = "SYNOR_FLEET_MAX_WORKERS_PER_PROVIDER", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub fleet_max_workers_per_provider: u32,

    /// Share workers with the other `synor serve` replicas of this
    /// deployment over this Redis (pub/sub): a worker connected to any
    /// replica serves requests arriving at every one. Without it, each
    /// replica places work on its own workers only.
    #[arg(long, env = "SYNOR_FLEET_BUS")]
    pub fleet_bus: Option<ServiceUrl>,

    /// The fleet bus's channel prefix: replicas of one deployment share
    /// it; another deployment on the same Redis uses its own.
    #[arg(long, env = "SYNOR_FLEET_BUS_NAMESPACE", default_value = "synor")]
    pub fleet_bus_namespace: String,
}

impl FleetArgs {
    /// How dispatch places and waits, spot checks as `spot` says.
    pub fn dispatch(&self, spot: &SpotCheckArgs) -> server::services::dispatch::DispatchConfig {
        let secs = std::time::Duration::from_secs_f64;
        server::services::dispatch::DispatchConfig {
            policy: self.placement.into(),
            weights: self.placement_weights,
            house_factor: self.placement_house_factor,
            progress: secs(self.fleet_progress_timeout),
            step_target_ms: self.fleet_step_target_ms,
            max_queue: self.fleet_max_queue,
            queue_timeout: secs(self.fleet_queue_timeout),
            steal_after: std::time::Duration::from_millis(self.fleet_steal_after_ms),
            split: self.fleet_split,
            kv_timeout: secs(self.fleet_kv_timeout),
            spot: spot.config(),
        }
    }
}

/// How often workers' output is re-scored on the house engine, and how strictly.
#[derive(Debug, Clone, Args)]
pub struct SpotCheckArgs {
    /// Share of a proven provider's worker attempts re-scored on the
    /// house engine (spot checks).
    #[arg(long, env = "SYNOR_SPOT_CHECK_RATE", default_value_t = 0.02, value_parser = fraction)]
    pub spot_check_rate: f64,

    /// Share of a new provider's worker attempts spot-checked.
    #[arg(long, env = "SYNOR_SPOT_CHECK_NEW_RATE", default_value_t = 0.25, value_parser = fraction)]
    pub spot_check_new_rate: f64,

    /// Attempts a provider delivers before it counts as proven.
    #[arg(long, env = "SYNOR_SPOT_CHECK_PROVEN_AFTER", default_value_t = 200)]
    pub spot_check_proven_after: u64,

    /// A greedy token passes a spot check when it is among the
    /// reference's this many most likely.
    #[arg(long, env = "SYNOR_SPOT_CHECK_TOP_K", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub spot_check_top_k: u32,

    /// Largest difference (nats) between a token's log-probability as a
    /// worker reported it and as the house engine scores it.
    #[arg(long, env = "SYNOR_SPOT_CHECK_TOLERANCE", default_value_t = 0.25, value_parser = non_negative_f32)]
    pub spot_check_tolerance: f32,
}

impl SpotCheckArgs {
    pub fn config(&self) -> server::services::spotcheck::SpotConfig {
        server::services::spotcheck::SpotConfig {
            new_rate: self.spot_check_new_rate,
            rate: self.spot_check_rate,
            proven_after: self.spot_check_proven_after,
            top_k: self.spot_check_top_k,
            tolerance: self.spot_check_tolerance,
        }
    }
}

/// `NAME=PATH` of `--extra-model`.
fn parse_extra_model(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, got `{s}`")),
    }
}

/// Options of `synor providers`.
#[derive(Debug, Clone, Args)]
pub struct ProvidersArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    #[command(subcommand)]
    pub action: ProvidersAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ProvidersAction {
    /// Create a provider account and a worker token (shown once); with
    /// `--account`, a new token for an existing provider.
    Create {
        /// The provider's (or the token's) name.
        #[arg(long)]
        name: String,
        /// An existing provider account id.
        #[arg(long)]
        account: Option<String>,
    },
    /// List worker tokens.
    Tokens,
    /// Revoke a worker token: its workers are refused from their next
    /// connection.
    Revoke { id: String },
    /// A provider's own earnings (over HTTP, with its worker token):
    /// balance, payable and pending funds, today's earnings, jobs, spot
    /// checks and connected workers, in units.
    Earnings(ProviderLink),
    /// Pays out part of a provider's payable funds (recorded in the
    /// ledger as a `payout` transaction).
    Payout {
        #[command(flatten)]
        link: ProviderLink,
        /// Units to pay out: `1.50`.
        #[arg(long)]
        amount: String,
        /// Where it goes, for the record.
        #[arg(long, default_value = "")]
        memo: String,
    },
}

/// How a provider reaches the server as itself: the address its workers
/// use and one of its worker tokens.
#[derive(Debug, Clone, Args)]
pub struct ProviderLink {
    /// The server: `ws://HOST:PORT` (as `synor worker --server`) or
    /// `http://HOST:PORT`.
    #[arg(long, env = "SYNOR_SERVER")]
    pub server: String,
    /// One of the provider's worker tokens.
    #[arg(long, env = "SYNOR_WORKER_TOKEN", hide_env_values = true)]
    pub token: Secret,
}

/// Options of `synor worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The server: `http://HOST:PORT` or its gateway `ws://HOST:PORT` (the
    /// path `/v1/providers/connect` is added when missing).
    #[arg(long, env = "SYNOR_SERVER")]
    pub server: String,

    /// The provider's worker token (`synor providers create`).
    #[arg(long, env = "SYNOR_WORKER_TOKEN", hide_env_values = true)]
    pub token: Secret,

    /// A name for this worker (default: the host name).
    #[arg(long, env = "SYNOR_WORKER_NAME")]
    pub name: Option<String>,

    /// Where this worker runs (an electricity region of the market).
    #[arg(long, env = "SYNOR_REGION", default_value = "local")]
    pub region: String,

    /// Compute threads (default: every core).
    #[arg(long, env = "SYNOR_THREADS")]
    pub threads: Option<usize>,

    /// What this worker's provider takes per million tokens, the protocol
    /// fee not included: `output=0.40[,input=0.10][,cached=0.05]` (money
    /// units; input defaults to the output price, cached to the input
    /// price). One ask per served model; without it the worker takes the
    /// house's price.
    #[arg(long, env = "SYNOR_PRICE", value_parser = parse_price)]
    pub price: Option<PriceArg>,

    /// Generated tokens per second the ask offers (default: what the
    /// server's calibration measures).
    #[arg(long, env = "SYNOR_CAPACITY", default_value_t = 0)]
    pub capacity: u64,

    /// Unix seconds after which the ask lapses (default: it stands while
    /// the worker is connected).
    #[arg(long, env = "SYNOR_UNTIL", default_value_t = 0)]
    pub until: i64,

    /// Offer the capacity as preemptible.
    #[arg(long, env = "SYNOR_PREEMPTIBLE")]
    pub preemptible: bool,

    /// Seconds between status lines (jobs, tokens/s, spot checks,
    /// earnings today); 0 turns them off.
    #[arg(long, env = "SYNOR_STATUS_EVERY", default_value_t = 30)]
    pub status_every: u64,

    /// A model this worker may hold a layer range of, as a stage of the
    /// server's pipeline for a model no one worker holds: `NAME=PATH`
    /// (repeatable; NAME as the server serves it). Only the range the
    /// server asks for is read from the file. With `--model none` the
    /// worker serves no whole model.
    #[arg(long = "part-model", value_name = "NAME=PATH", value_parser = parse_extra_model)]
    pub part_models: Vec<(String, PathBuf)>,

    /// Memory a part may use, weights and KV (`512MiB`, `8GiB`; default:
    /// half of this machine's memory).
    #[arg(long, env = "SYNOR_MAX_MEMORY", value_parser = parse_size)]
    pub max_memory: Option<usize>,

    /// Testing and benchmarks only (the `faults` feature).
    #[cfg(feature = "faults")]
    #[command(flatten)]
    pub faults: FaultArgs,

    #[command(flatten)]
    pub models: ModelArgs,

    #[command(flatten)]
    pub scheduler: SchedulerArgs,

    /// Log format: `text` or `json`.
    #[arg(long, env = "SYNOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Read options from a TOML file (its `[serve]` and `[worker]`
    /// tables, keyed by these flags' names); flags given here win.
    #[arg(long, env = "SYNOR_CONFIG")]
    pub config: Option<PathBuf>,
}

impl WorkerArgs {
    /// The worker's configuration from its command line.
    pub fn worker_config(&self) -> worker::WorkerConfig {
        worker::WorkerConfig {
            server: self.server.clone(),
            token: self.token.expose().to_string(),
            name: self.name.clone(),
            region: self.region.clone(),
            device: self.scheduler.device,
            offer: self.price.map(|p| worker::Offer {
                input: p.input,
                cached_input: p.cached_input,
                output: p.output,
                capacity: self.capacity,
                until: self.until,
                preemptible: self.preemptible,
            }),
            status_every: std::time::Duration::from_secs(self.status_every),
            parts: Vec::new(),
            faults: self.faults(),
        }
    }

    /// The model files of `--part-model`, sized from their tensor tables.
    pub fn part_files(&self) -> anyhow::Result<Vec<worker::stage::PartFile>> {
        let memory = self.max_memory.map_or_else(half_the_memory, |m| m as u64);
        self.part_models
            .iter()
            .map(|(name, path)| {
                let path = self.models.resolve(path);
                worker::stage::PartFile::open(name, path.clone(), memory)
                    .map_err(|e| anyhow::anyhow!("--part-model {name}={}: {e}", path.display()))
            })
            .collect()
    }

    /// What the testing flags ask of the worker.
    #[cfg(feature = "faults")]
    fn faults(&self) -> worker::Faults {
        let f = &self.faults;
        worker::Faults {
            token_delay: std::time::Duration::from_millis(f.debug_token_delay_ms),
            stall_after: f.debug_stall_after,
            kv: worker::kv::Faults {
                corrupt: f.debug_kv_fault == Some(KvFault::Corrupt),
                drop_end: f.debug_kv_fault == Some(KvFault::DropEnd),
                frame_delay: std::time::Duration::from_millis(f.debug_kv_frame_delay_ms),
            },
            replay: f.debug_cheat == Some(Cheat::Replay),
            cheat_after: f.debug_cheat_after,
            stages: worker::stage::StageFaults {
                skip_layers: f.debug_cheat == Some(Cheat::SkipLayers),
                layer_delay: std::time::Duration::from_micros(f.debug_layer_delay_us),
                token_layer_delay: std::time::Duration::from_micros(f.debug_token_layer_delay_us),
            },
        }
    }

    /// An honest worker: a build without the testing flags.
    #[cfg(not(feature = "faults"))]
    fn faults(&self) -> worker::Faults {
        worker::Faults::default()
    }
}

/// A worker's testing flags: a slower device, a hung one, a faulty KV link,
/// a cheating provider. Only in builds with the `faults` feature (the
/// Makefile's test builds and the fleet benchmark); release builds of the
/// product leave them out.
#[cfg(feature = "faults")]
#[derive(Debug, Clone, Args)]
pub struct FaultArgs {
    /// Testing and benchmarks only: hold each generated token this many
    /// milliseconds before sending it, as a slower device would.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_token_delay_ms: u64,

    /// Testing only: run this many assignments, then take the next ones
    /// and never answer them (a hung device).
    #[arg(long, hide = true)]
    pub debug_stall_after: Option<u64>,

    /// Testing only: misbehave as a prefill worker: `corrupt` flips a
    /// byte of a KV frame after its checksum, `drop-end` never sends the
    /// end of a transfer.
    #[arg(long, hide = true, value_enum)]
    pub debug_kv_fault: Option<KvFault>,

    /// Testing only: cheat as a dishonest provider would: `replay` sends
    /// the tokens (and log-probabilities) of one job for every later one;
    /// `skip-layers` passes a stage's hidden states on without running
    /// its layers.
    #[arg(long, hide = true, value_enum)]
    pub debug_cheat: Option<Cheat>,

    /// Testing only: run this many assignments honestly before cheating.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_cheat_after: u64,

    /// Testing only: wait this long before each KV frame (a slow link).
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_kv_frame_delay_ms: u64,

    /// Benchmarks only: as a pipeline stage, hold each step this many
    /// microseconds per layer held, as a slower device would (the sleep
    /// leaves the shared cores to the others).
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_layer_delay_us: u64,

    /// Benchmarks only: as a pipeline stage, hold each step this many
    /// microseconds more per layer for each token of the step, as a
    /// device whose time grows with the batch would.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_token_layer_delay_us: u64,
}

/// A secret from the command line (a token): its `Debug` never shows it,
/// so logging the options cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_string()))
    }
}

/// A service's address (a database, Redis) that may carry a password:
/// `Debug` and `Display` show it with the password masked, so options and
/// error messages can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceUrl(String);

impl ServiceUrl {
    /// The address itself, for the one place that connects.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The address with any password replaced by `***`.
    fn masked(&self) -> String {
        let masked = self.0.split_once("://").and_then(|(scheme, rest)| {
            let (userinfo, host) = rest.rsplit_once('@')?;
            let (user, _) = userinfo.split_once(':')?;
            Some(format!("{scheme}://{user}:***@{host}"))
        });
        masked.unwrap_or_else(|| self.0.clone())
    }
}

impl std::fmt::Display for ServiceUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.masked())
    }
}

impl std::fmt::Debug for ServiceUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServiceUrl({})", self.masked())
    }
}

impl std::str::FromStr for ServiceUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_string()))
    }
}

/// How logs are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How choices are placed (`--placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Placement {
    /// The executor expected to finish first, from its calibration.
    Measured,
    /// In turn over the workers serving the model (for comparisons).
    RoundRobin,
    /// The worker running the least for its batch cap (for comparisons).
    LeastLoaded,
    /// The cheapest worker with room (for comparisons).
    CheapestFirst,
}

impl From<Placement> for server::services::placement::PolicyKind {
    fn from(p: Placement) -> Self {
        match p {
            Placement::Measured => Self::Measured,
            Placement::RoundRobin => Self::RoundRobin,
            Placement::LeastLoaded => Self::LeastLoaded,
            Placement::CheapestFirst => Self::CheapestFirst,
        }
    }
}

/// How a testing worker damages its KV transfers (`--debug-kv-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvFault {
    /// Flip a byte of a KV frame after its checksum.
    Corrupt,
    /// Never send the end of a transfer.
    DropEnd,
}

/// How a testing worker cheats (`--debug-cheat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Cheat {
    /// Send one job's tokens for every later one.
    Replay,
    /// As a pipeline stage, pass the hidden states on without running
    /// its layers.
    SkipLayers,
}

/// A worker's `--price`: ticks per million tokens of each phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriceArg {
    pub input: i64,
    pub cached_input: i64,
    pub output: i64,
}

/// Parses `output=0.40,input=0.10,cached=0.05` (money units per million
/// tokens).
fn parse_price(s: &str) -> Result<PriceArg, String> {
    use money::ledger::amount::parse_units;
    let (mut input, mut cached, mut output) = (None, None, None);
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected phase=price"))?;
        let ticks = parse_units(v.trim()).map_err(|e| format!("`{part}`: {e}"))?;
        if ticks < 0 {
            return Err(format!("`{part}`: a price is not negative"));
        }
        let slot = match k.trim() {
            "input" => &mut input,
            "cached" | "cached_input" => &mut cached,
            "output" => &mut output,
            other => return Err(format!("unknown phase `{other}` (input, cached, output)")),
        };
        *slot = Some(ticks);
    }
    let output = output.ok_or("the output price is required (output=...)")?;
    if output == 0 {
        return Err("the output price is positive".into());
    }
    let input = input.unwrap_or(output);
    Ok(PriceArg {
        input,
        cached_input: cached.unwrap_or(input),
        output,
    })
}

/// Which models to load.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Directory that relative model paths are resolved against.
    #[arg(long, env = "SYNOR_MODELS_DIR", default_value = "models")]
    pub models_dir: PathBuf,

    /// Generative model: a llama-family GGUF file.
    #[arg(
        long,
        env = "SYNOR_MODEL",
        default_value = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    pub model: PathBuf,

    /// Name clients use for the generative model (default: its folder name).
    #[arg(long, env = "SYNOR_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,

    /// The generative model's sampling defaults, over its own (its GGUF's
    /// `general.sampling.*` keys, then a `generation_config.json` beside
    /// the file), as JSON: `{"temperature": 0.2, "top_p": 0.9,
    /// "max_tokens": 512}` (also `top_k`, `min_p`, `repetition_penalty`).
    /// A request without `max_tokens` gets at most 1024 unless set here.
    #[arg(
        long = "override-generation-config",
        env = "SYNOR_OVERRIDE_GENERATION_CONFIG",
        value_name = "JSON",
        default_value = "{}",
        value_parser = GenerationDefaults::parse_override
    )]
    pub generation: GenerationDefaults,

    /// Chat template: `auto`, `gguf` (the stored one, verbatim), `chatml`,
    /// or a path to a Jinja file.
    #[arg(long, env = "SYNOR_CHAT_TEMPLATE", default_value = "auto")]
    pub chat_template: String,

    /// Embedding model folder (BERT safetensors); `none` disables it.
    #[arg(
        long,
        env = "SYNOR_EMBEDDING_MODEL",
        default_value = "all-minilm-l6-v2"
    )]
    pub embedding_model: PathBuf,

    /// Name clients use for the embedding model (default: its folder name).
    #[arg(long, env = "SYNOR_EMBEDDING_MODEL_NAME")]
    pub embedding_model_name: Option<String>,

    /// More generative models to serve, as `NAME=PATH` (repeatable).
    #[arg(long = "extra-model", value_name = "NAME=PATH", value_parser = parse_extra_model)]
    pub extra_models: Vec<(String, PathBuf)>,
}

/// Half of this machine's memory (`/proc/meminfo`), or 4 GiB unread.
fn half_the_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(4 << 30, |kib| kib * 1024 / 2)
}

impl ModelArgs {
    /// Whether a whole generative model is served (`--model none`: not).
    pub fn has_model(&self) -> bool {
        self.model.as_os_str() != "none"
    }

    pub fn resolve(&self, p: &std::path::Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.models_dir.join(p)
        }
    }

    /// Path of the generative model file.
    #[cfg(test)]
    pub fn model_path(&self) -> PathBuf {
        self.resolve(&self.model)
    }

    /// Path of the embedding model folder, unless disabled.
    pub fn embedding_path(&self) -> Option<PathBuf> {
        (self.embedding_model.as_os_str() != "none").then(|| self.resolve(&self.embedding_model))
    }

    /// The generative model's public name.
    pub fn model_name(&self) -> String {
        self.served_model_name
            .clone()
            .unwrap_or_else(|| derived_name(&self.model))
    }

    /// The embedding model's public name.
    pub fn embedding_name(&self) -> String {
        self.embedding_model_name
            .clone()
            .unwrap_or_else(|| derived_name(&self.embedding_model))
    }
}

/// A model's default name: its folder for `dir/file.gguf`, else its stem.
fn derived_name(p: &std::path::Path) -> String {
    let is_file = p.extension().is_some_and(|e| e == "gguf");
    let named = if is_file {
        p.parent().filter(|d| !d.as_os_str().is_empty())
    } else {
        Some(p)
    };
    named
        .and_then(|d| d.file_name())
        .or_else(|| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string())
}

/// Continuous-batching limits.
#[derive(Debug, Clone, Args)]
pub struct SchedulerArgs {
    /// Most sequences decoded together in one step.
    #[arg(long, env = "SYNOR_MAX_NUM_SEQS", default_value_t = 16, value_parser = at_least_one)]
    pub max_num_seqs: usize,

    /// Token budget of one engine step (prefill chunks plus decode tokens).
    /// 256 keeps a step that carries a prefill chunk under ~200 ms on two
    /// cores, so running streams do not stall (see BENCHMARKS.md).
    #[arg(long, env = "SYNOR_MAX_NUM_BATCHED_TOKENS", default_value_t = 256, value_parser = at_least_one)]
    pub max_num_batched_tokens: usize,

    /// Requests allowed to wait for a slot; beyond that, 503 at once.
    #[arg(long, env = "SYNOR_MAX_WAITING", default_value_t = 256)]
    pub max_waiting: usize,

    /// Context length cap (prompt plus output); default: the model's.
    #[arg(long, env = "SYNOR_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,

    /// Prompt-lookup speculative decoding: draft tokens verified per step
    /// (0 turns it off). Outputs are identical with it on.
    #[arg(long, env = "SYNOR_NUM_SPECULATIVE_TOKENS", default_value_t = 0)]
    pub num_speculative_tokens: usize,

    /// Longest n-gram the prompt lookup matches.
    #[arg(long, env = "SYNOR_SPEC_NGRAM_MAX", default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=16))]
    pub spec_ngram_max: u8,

    /// Inter-token target of a step that decodes, in milliseconds: such a
    /// step carries only the prefill tokens that its measured cost says
    /// fit (at least one KV block's worth), so running streams do not
    /// stall behind a long prompt; 0 turns it off (the token budget alone).
    #[arg(long, env = "SYNOR_STEP_TARGET_MS", default_value_t = 200.0, value_parser = parse_step_target)]
    pub step_target_ms: f64,

    /// Memory for the paged KV cache, e.g. `1GiB`, `512MiB`, `2G`.
    #[arg(long, env = "SYNOR_KV_CACHE_MEMORY", default_value = "1GiB", value_parser = parse_size)]
    pub kv_cache_memory: usize,

    /// How the KV cache stores keys and values: `auto` or `f16`, or `q8_0`
    /// (8-bit with a scale per 32 values: about 1.8x the positions in the
    /// same memory and half the bytes read per step at long contexts;
    /// `--device cpu` only).
    #[arg(long, env = "SYNOR_KV_CACHE_DTYPE", default_value = "auto", value_parser = parse_kv_dtype)]
    pub kv_cache_dtype: engine::KvDtype,

    /// Positions per KV block.
    #[arg(long, env = "SYNOR_BLOCK_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub block_size: u16,

    /// Keep every position's KV in sliding-window layers too (Gemma 2
    /// and 3), as llama.cpp's `--swa-full`; by default they keep only the
    /// window's blocks, in a pool of their own (on every device).
    #[arg(long, env = "SYNOR_SWA_FULL")]
    pub swa_full: bool,

    /// Testing only (the `faults` feature): run the model's first N
    /// layers (a provider cheating by skipping layers, for spot checks to
    /// catch).
    #[cfg(feature = "faults")]
    #[arg(long, hide = true)]
    pub debug_keep_layers: Option<usize>,

    /// Where text models run: `cpu`, `wgpu` (the first Vulkan, Metal or
    /// DX12 adapter; the KV cache then lives in its memory), or
    /// `cuda[:N]` (not in this build yet: a clear error).
    #[arg(long, env = "SYNOR_DEVICE", default_value = "cpu")]
    pub device: engine::Device,
}

/// A count of at least one.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A fraction from 0 to 1.
fn fraction(s: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err("a fraction from 0 to 1".into())
    }
}

/// A finite number above 0.
fn positive(s: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err("a number above 0".into())
    }
}

/// A finite number, 0 or more, as f32.
fn non_negative_f32(s: &str) -> Result<f32, String> {
    let x: f32 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err("a number from 0 up".into())
    }
}

/// `fraction`, as f32.
fn fraction_f32(s: &str) -> Result<f32, String> {
    fraction(s).map(|x| x as f32)
}

/// Seconds from `MIN_MS` milliseconds to `MAX_S` seconds.
fn seconds_within<const MIN_MS: u64, const MAX_S: u64>(s: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    let (min, max) = (MIN_MS as f64 / 1000.0, MAX_S as f64);
    if (min..=max).contains(&x) {
        Ok(x)
    } else {
        Err(format!("seconds from {min} to {max}"))
    }
}

/// Parses a KV cache dtype (`auto`, `f16`, `q8_0`).
fn parse_kv_dtype(s: &str) -> Result<engine::KvDtype, String> {
    engine::KvDtype::parse(s)
        .ok_or_else(|| format!("`{s}` is not a KV cache dtype (auto, f16, q8_0)"))
}

/// Parses the step target: milliseconds from 0 (off) to a minute.
fn parse_step_target(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of milliseconds"))?;
    if !(0.0..=60_000.0).contains(&v) {
        return Err(format!("{v} ms is outside 0 (off) to 60000"));
    }
    Ok(v)
}

/// Parses a byte size: a number with an optional `K`, `M`, `G` (powers of
/// 1024; a trailing `iB` or `B` is accepted).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 512MiB or 2GiB"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("`{s}` must be a positive size"));
    }
    Ok((n * mult as f64) as usize)
}

impl SchedulerArgs {
    pub fn to_engine(&self) -> engine::EngineConfig {
        engine::EngineConfig {
            scheduler: engine::SchedulerConfig {
                max_num_seqs: self.max_num_seqs,
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_waiting: self.max_waiting,
                max_model_len: self.max_model_len.unwrap_or(usize::MAX),
                num_speculative_tokens: self.num_speculative_tokens,
                spec_ngram_max: usize::from(self.spec_ngram_max),
                step_target: (self.step_target_ms > 0.0)
                    .then(|| std::time::Duration::from_secs_f64(self.step_target_ms / 1e3)),
            },
            kv_cache_memory: self.kv_cache_memory,
            kv_cache_dtype: self.kv_cache_dtype,
            block_size: usize::from(self.block_size),
            swa_full: self.swa_full,
            #[cfg(feature = "faults")]
            keep_layers: self.debug_keep_layers,
            #[cfg(not(feature = "faults"))]
            keep_layers: None,
            device: self.device,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> ServeArgs {
        let mut argv = vec!["synor", "serve"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Serve(s) => *s,
            Command::Keys(_)
            | Command::Accounts(_)
            | Command::Providers(_)
            | Command::Worker(_)
            | Command::Simulate(_)
            | Command::Openapi { .. } => panic!("parsed `serve` as another command"),
        }
    }

    /// The declared default of a `serve` option (independent of the
    /// environment, which the Makefile and CI set).
    fn default_of(id: &str) -> String {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let serve = cmd.find_subcommand("serve").expect("serve subcommand");
        let arg = serve
            .get_arguments()
            .find(|a| a.get_id() == id)
            .unwrap_or_else(|| panic!("no option {id}"));
        arg.get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn defaults_serve_the_default_models_on_loopback_8080() {
        assert_eq!(default_of("bind"), "127.0.0.1:8080");
        assert_eq!(default_of("models_dir"), "models");
        assert_eq!(
            default_of("model"),
            "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
        );
        assert_eq!(default_of("embedding_model"), "all-minilm-l6-v2");
        assert_eq!(default_of("database_url"), "sqlite://data/synor.db");
        assert_eq!(default_of("chat_template"), "auto");
        let s = serve(&["--models-dir", "m"]);
        assert_eq!(s.models.model_name(), "smollm2-135m-instruct");
        assert_eq!(s.models.embedding_name(), "all-minilm-l6-v2");
        assert_eq!(
            s.models.model_path(),
            PathBuf::from("m/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        assert_eq!(
            s.models.embedding_path(),
            Some(PathBuf::from("m/all-minilm-l6-v2"))
        );
    }

    #[test]
    fn names_and_paths_follow_the_options() {
        let s = serve(&[
            "--model",
            "/abs/tiny.gguf",
            "--embedding-model",
            "none",
            "--bind",
            "127.0.0.1:0",
        ]);
        assert_eq!(s.models.model_path(), PathBuf::from("/abs/tiny.gguf"));
        assert_eq!(s.models.model_name(), "abs");
        assert_eq!(s.models.embedding_path(), None);
        let s = serve(&["--model", "tiny.gguf", "--served-model-name", "t"]);
        assert_eq!(s.models.model_name(), "t");
        assert_eq!(derived_name(std::path::Path::new("tiny.gguf")), "tiny");
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert_eq!(default_of("kv_cache_memory"), "1GiB");
    }

    #[test]
    fn the_database_url_is_taken_after_the_subcommand_and_a_missing_file_is_named() {
        let argv = [
            "synor",
            "keys",
            "create",
            "--name",
            "k",
            "--database-url",
            "sqlite://x/y.db",
        ];
        let Command::Keys(k) = Cli::try_parse_from(argv).expect("parses").command else {
            panic!("parsed `keys` as another command");
        };
        assert_eq!(k.db.database_url.expose(), "sqlite://x/y.db");
        assert_eq!(
            missing_sqlite_file("sqlite://no/such/dir/synor.db").as_deref(),
            Some("no/such/dir/synor.db")
        );
        assert_eq!(missing_sqlite_file("sqlite://:memory:"), None);
        assert_eq!(missing_sqlite_file("postgres://localhost/x"), None);
        let here = std::env::current_exe().expect("exe");
        assert_eq!(
            missing_sqlite_file(&format!("sqlite://{}", here.display())),
            None
        );
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Cli::try_parse_from(["synor", "serve", "--bind", "nowhere"]).is_err());
        assert!(Cli::try_parse_from(["synor", "serve", "--log-format", "xml"]).is_err());
        for bad in ["-1", "soon", "1e9", "NaN"] {
            assert!(
                Cli::try_parse_from(["synor", "serve", "--step-target-ms", bad]).is_err(),
                "{bad}"
            );
        }
        assert_eq!(parse_step_target("0"), Ok(0.0));
        assert_eq!(parse_step_target("80"), Ok(80.0));
        assert!(Cli::try_parse_from(["synor", "serve", "--kv-cache-dtype", "fp8"]).is_err());
    }

    #[test]
    fn the_kv_cache_dtype_reaches_the_engine() {
        assert_eq!(default_of("kv_cache_dtype"), "auto");
        let s = serve(&[]);
        assert_eq!(s.scheduler.to_engine().kv_cache_dtype, engine::KvDtype::F16);
        let s = serve(&["--kv-cache-dtype", "q8_0"]);
        assert_eq!(
            s.scheduler.to_engine().kv_cache_dtype,
            engine::KvDtype::Q8_0
        );
    }

    #[test]
    fn extra_models_are_name_path_pairs() {
        let s = serve(&["--extra-model", "a=x/a.gguf", "--extra-model", "b=/b.gguf"]);
        assert_eq!(
            s.models.extra_models,
            vec![
                ("a".into(), PathBuf::from("x/a.gguf")),
                ("b".into(), PathBuf::from("/b.gguf"))
            ]
        );
        assert!(Cli::try_parse_from(["synor", "serve", "--extra-model", "noequals"]).is_err());
        assert!(Cli::try_parse_from(["synor", "serve", "--extra-model", "=x"]).is_err());
    }

    #[test]
    fn tokens_never_show_in_the_options_debug() {
        let s = serve(&["--admin-token", "adm-s3cret"]);
        assert_eq!(
            s.access.admin_token.as_ref().map(Secret::expose),
            Some("adm-s3cret")
        );
        assert!(!format!("{s:?}").contains("adm-s3cret"), "{s:?}");
        let argv = [
            "synor",
            "worker",
            "--server",
            "ws://h:1",
            "--token",
            "wkr-s3cret",
        ];
        let Command::Worker(w) = Cli::try_parse_from(argv).expect("parses").command else {
            panic!("parsed `worker` as another command");
        };
        assert!(!format!("{w:?}").contains("wkr-s3cret"), "{w:?}");
        let config = w.worker_config();
        assert_eq!(config.token, "wkr-s3cret");
        assert!(!format!("{config:?}").contains("wkr-s3cret"), "{config:?}");
    }

    #[test]
    fn choices_are_typed_and_a_bad_one_names_its_flag() {
        assert_eq!(serve(&["--log-format", "json"]).log_format, LogFormat::Json);
        assert_eq!(
            serve(&["--placement", "round-robin"]).fleet.placement,
            Placement::RoundRobin
        );
        for (flag, bad) in [("--log-format", "yaml"), ("--placement", "random")] {
            let err = Cli::try_parse_from(["synor", "serve", flag, bad])
                .expect_err("a bad choice")
                .to_string();
            assert!(err.contains(flag) && err.contains(bad), "{err}");
        }
    }

    #[test]
    fn out_of_range_values_are_errors_naming_the_flag_never_clamped() {
        let bad = [
            ("--cache-ttl", "0"),
            ("--semantic-threshold", "1.5"),
            ("--max-num-seqs", "0"),
            ("--max-num-batched-tokens", "0"),
            ("--instance-stale-after", "0"),
            ("--spot-check-rate", "-0.1"),
            ("--spot-check-new-rate", "2"),
            ("--spot-check-top-k", "0"),
            ("--cache-price-bps", "10001"),
            ("--max-connections-per-client", "0"),
            ("--fleet-progress-timeout", "0.05"),
            ("--fleet-queue-timeout", "NaN"),
            ("--fleet-kv-timeout", "3601"),
            ("--fleet-calibration-timeout", "0.5"),
            ("--header-timeout", "0"),
            ("--shutdown-grace", "-1"),
        ];
        for (flag, value) in bad {
            let arg = format!("{flag}={value}");
            let err = Cli::try_parse_from(["synor", "serve", &arg])
                .expect_err(flag)
                .to_string();
            assert!(err.contains(flag) && err.contains(value), "{arg}: {err}");
        }
        let s = serve(&[
            "--spot-check-rate",
            "1",
            "--shutdown-grace",
            "0",
            "--fleet-kv-timeout",
            "0.05",
            "--max-num-seqs",
            "1",
        ]);
        assert_eq!(s.spot.spot_check_rate, 1.0);
        assert_eq!(s.listen.shutdown_grace, 0.0);
        assert_eq!(s.fleet.fleet_kv_timeout, 0.05);
        assert_eq!(s.scheduler.max_num_seqs, 1);
    }

    #[test]
    fn the_testing_flags_exist_only_with_the_faults_feature() {
        let argv = [
            "synor",
            "worker",
            "--server",
            "ws://h:1",
            "--token",
            "t",
            "--debug-cheat",
            "replay",
        ];
        let parsed = Cli::try_parse_from(argv);
        assert_eq!(parsed.is_ok(), cfg!(feature = "faults"), "{parsed:?}");
        let keep = Cli::try_parse_from(["synor", "serve", "--debug-keep-layers", "3"]);
        assert_eq!(keep.is_ok(), cfg!(feature = "faults"));
        if let Ok(Command::Worker(w)) = parsed.map(|c| c.command) {
            assert!(w.worker_config().faults.replay);
        }
    }

    #[test]
    fn passwords_in_service_addresses_never_show() {
        let s = serve(&[
            "--database-url",
            "postgres://synor:pg-s3cret@db:5432/synor",
            "--redis-url",
            "redis://:rd-s3cret@cache:6379",
        ]);
        assert_eq!(
            s.ledger.database_url.expose(),
            "postgres://synor:pg-s3cret@db:5432/synor"
        );
        let shown = format!("{s:?} {} {:?}", s.ledger.database_url, s.cache.redis_url);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("postgres://synor:***@db:5432/synor"),
            "{shown}"
        );
        let plain = serve(&["--database-url", "sqlite://data/x.db"])
            .ledger
            .database_url;
        assert_eq!(plain.to_string(), "sqlite://data/x.db");
    }
}
