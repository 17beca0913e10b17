//! Start-up: load the configured models (off the async runtime), bind the
//! listener (port 0 allowed; the bound address is printed for scripts and
//! tests), and serve until SIGINT/SIGTERM, then stop the engines.

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::{ModelArgs, SchedulerArgs, ServeArgs};
use engine::GenerationDefaults;
use engine::registry::{Kind, ModelLoader, ModelRegistry};
use money::ledger::{Ledger, LedgerConfig};
use money::market::Market;
use money::store::Db;
use server::http::auth::Auth;
use server::http::state::AppState;
use server::services::metering::Billing;

/// How often the ledger audits itself (its result in `/metrics`).
const AUDIT_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// How this process loads models (also those the admin API adds later).
pub fn loader(models: &ModelArgs, scheduler: &SchedulerArgs) -> ModelLoader {
    ModelLoader {
        models_dir: models.models_dir.clone(),
        engine: scheduler.to_engine(),
        template: models.chat_template.parse().unwrap_or_default(),
    }
}

/// Serves the `--pipeline-model`s over the fleet and starts their planner.
fn start_pipelines(
    args: &ServeArgs,
    state: &AppState,
    registry: &ModelRegistry,
) -> anyhow::Result<()> {
    use server::services::pipelines::{self, PipelineSpec};
    let f = &args.fleet;
    let mut started = Vec::new();
    for (name, path) in &f.pipeline_models {
        let spec = PipelineSpec {
            name: name.clone(),
            path: args.models.resolve(path),
            blocks: f.pipeline_kv_blocks.max(1),
            block_size: 16,
            step_timeout: std::time::Duration::from_secs_f64(f.pipeline_step_timeout.max(0.1)),
            micro_batches: f.pipeline_micro_batches,
            lanes: f.pipeline_chains as usize,
            measured: f.pipeline_placement == crate::config::PipelinePlacement::Measured,
        };
        let template = args.models.chat_template.parse().unwrap_or_default();
        let sched = args.scheduler.to_engine().scheduler;
        let m = pipelines::start(
            spec,
            &template,
            sched,
            state.fleet.clone(),
            Some(state.dispatch.spot.clone() as Arc<dyn pipelines::checks::Sanctions>),
            registry,
        )
        .with_context(|| format!("--pipeline-model {name}={}", path.display()))?;
        state.dispatch.add_pipeline(name, m.clone());
        started.push(m);
    }
    if !started.is_empty() {
        tokio::spawn(pipelines::run(state.fleet.clone(), started));
    }
    Ok(())
}

/// Loads every configured model (the server's, or a worker's).
pub async fn load_models(
    models: &ModelArgs,
    scheduler: &SchedulerArgs,
) -> anyhow::Result<ModelRegistry> {
    let (models, scheduler) = (models.clone(), scheduler.clone());
    tokio::task::spawn_blocking(move || {
        let loader = loader(&models, &scheduler);
        let m = &models;
        // Paths as given: the loader resolves them against the models dir.
        let none = GenerationDefaults::default();
        let mut wanted = Vec::new();
        if m.has_model() {
            wanted.push((m.model_name(), m.model.clone(), Kind::Text, m.generation));
        }
        if m.embedding_path().is_some() {
            wanted.push((
                m.embedding_name(),
                m.embedding_model.clone(),
                Kind::Embedding,
                none,
            ));
        }
        wanted.extend(
            m.extra_models
                .iter()
                .map(|(n, p)| (n.clone(), p.clone(), Kind::Text, none)),
        );
        let registry = ModelRegistry::default();
        for (name, path, kind, generation) in wanted {
            let model = loader
                .load(&name, &path, kind, generation)
                .with_context(|| {
                    format!(
                        "loading {} (run `make models` to fetch the defaults)",
                        loader.resolve(&path).display()
                    )
                })?;
            registry.add(model).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(registry)
    })
    .await
    .context("model loading panicked")?
}

/// Serves again the models an admin loaded before a restart (saved by
/// `POST /admin/models`). One that no longer loads (its file gone, or its
/// name taken by the command line's) is skipped with a warning: the server
/// still starts.
async fn restore_models(db: &Db, loader: ModelLoader, registry: &Arc<ModelRegistry>) {
    let saved = match db.saved_models().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "the models loaded before the restart could not be read");
            return;
        }
    };
    for m in saved {
        if registry.get(&m.name).is_ok() {
            tracing::warn!(model = %m.name, "a loaded model's name is taken by the command line's: not restored");
            continue;
        }
        let kind = if m.kind == "embedding" {
            Kind::Embedding
        } else {
            Kind::Text
        };
        let generation = if m.generation_config.is_empty() {
            Ok(GenerationDefaults::default())
        } else {
            GenerationDefaults::parse_override(&m.generation_config)
        };
        let (loader, name, path) = (loader.clone(), m.name.clone(), m.path.clone());
        let loaded = tokio::task::spawn_blocking(move || {
            let generation = generation.map_err(|e| anyhow::anyhow!(e))?;
            let path = loader
                .resolve_inside(std::path::Path::new(&path))
                .map_err(|e| anyhow::anyhow!(e))?;
            loader
                .load(&name, &path, kind, generation)
                .map_err(anyhow::Error::from)
        })
        .await;
        match loaded {
            Ok(Ok(model)) => match registry.add(model) {
                Ok(()) => {
                    tracing::info!(model = %m.name, path = %m.path, "restored a model loaded before the restart")
                }
                Err(e) => tracing::warn!(model = %m.name, error = %e, "not restored"),
            },
            Ok(Err(e)) => {
                tracing::warn!(model = %m.name, path = %m.path, error = %e, "a model loaded before the restart no longer loads: not restored")
            }
            Err(e) => tracing::warn!(model = %m.name, error = %e, "restoring a model panicked"),
        }
    }
}

/// The ledger (this instance registered, dead instances' holds released)
/// and the market.
async fn billing(args: &ServeArgs, db: Db) -> anyhow::Result<Billing> {
    let config = LedgerConfig {
        stale_after: std::time::Duration::from_secs(args.ledger.instance_stale_after),
        heartbeat: std::time::Duration::from_secs(
            (args.ledger.instance_stale_after / 6).clamp(1, 2),
        ),
        earnings_window: std::time::Duration::from_secs(args.ledger.earnings_window),
    };
    let ledger = Ledger::start(db.clone(), config)
        .await
        .context("starting the ledger")?;
    let market = Market::load(db, args.ledger.protocol_fee_bps)
        .await
        .context("loading the market")?
        .with_ledger(ledger.clone())
        .await
        .context("reconciling the market's holds")?;
    Ok(Billing {
        ledger,
        market: Arc::new(market),
        capacity: args.scheduler.to_engine().scheduler.max_num_seqs as u64,
        window: std::sync::Mutex::default(),
    })
}

/// Runs `synor serve` until a shutdown signal.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.access.open && !args.listen.bind.ip().is_loopback() {
        anyhow::bail!(
            "--open (no API keys) is only allowed on a loopback address, not {}",
            args.listen.bind
        );
    }
    let db = Db::connect(args.ledger.database_url.expose())
        .await
        .with_context(|| format!("opening the database {}", args.ledger.database_url))?;
    let mut auth = if args.access.open {
        Auth {
            admin_token: args
                .access
                .admin_token
                .as_ref()
                .map(|t| t.expose().to_string()),
            ..Auth::open()
        }
    } else {
        Auth::with_keys(
            db.clone(),
            args.access
                .admin_token
                .as_ref()
                .map(|t| t.expose().to_string()),
        )
    };
    auth.admin_throttle = Arc::new(server::http::auth::admin::AdminThrottle::with_burst(
        args.access.admin_auth_burst,
    ));
    let billing = Arc::new(billing(&args, db.clone()).await?);
    let registry = Arc::new(load_models(&args.models, &args.scheduler).await?);
    restore_models(&db, loader(&args.models, &args.scheduler), &registry).await;
    tokio::spawn(server::services::metering::run_house(
        billing.clone(),
        registry.clone(),
        std::time::Duration::from_secs(10),
    ));
    let mut state = AppState::with_auth(registry.clone(), auth)
        .with_loader(loader(&args.models, &args.scheduler))
        .with_billing(billing.clone());
    state.dispatch = Arc::new(server::services::dispatch::Dispatch::new(
        state.fleet.clone(),
        args.fleet.dispatch(&args.spot),
        Some(billing.clone()),
    ));
    state.fleet.set_caps(server::fleet::registry::Caps {
        per_token: args.fleet.fleet_max_workers_per_token as usize,
        per_provider: args.fleet.fleet_max_workers_per_provider as usize,
    });
    if let Some(url) = &args.fleet.fleet_bus {
        server::fleet::bus::start(
            url.expose(),
            &args.fleet.fleet_bus_namespace,
            state.fleet.clone(),
        )
        .map_err(anyhow::Error::msg)?;
    }
    tokio::spawn(server::services::asks::run(
        state.fleet.clone(),
        billing.market.clone(),
    ));
    tokio::spawn(server::services::standing_sync::run(
        billing.ledger.db.clone(),
        state.fleet.clone(),
        Some(billing.market.clone()),
    ));
    tokio::spawn(billing.ledger.clone().audit_every(AUDIT_EVERY));
    tokio::spawn(server::services::sanctions::run(
        billing.ledger.db.clone(),
        state.fleet.clone(),
    ));
    let dispatch = state.dispatch.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(server::services::dispatch::utilization::SAMPLE);
        loop {
            tick.tick().await;
            dispatch.stats.utilization.sample();
        }
    });
    start_pipelines(&args, &state, &registry)?;
    tokio::spawn(server::services::calibration::run(
        state.fleet.clone(),
        registry.clone(),
        state.dispatch.clone(),
        std::time::Duration::from_secs_f64(args.fleet.fleet_calibration_timeout),
    ));
    if let Some(c) = args.cache.to_config() {
        let cache = server::cache::ResponseCache::new(&c).context("opening the response cache")?;
        state = state.with_cache(Arc::new(cache), args.cache.cache_price_bps);
    }
    let sources = state.overview_sources();
    if let Some(db) = &sources.store {
        state.overview.restore(db).await;
    }
    state.overview.clone().start(sources);
    let listener = TcpListener::bind(args.listen.bind)
        .await
        .with_context(|| format!("binding {}", args.listen.bind))?;
    let addr = listener.local_addr()?;
    // Signals are handled from here on: a SIGTERM right after the line
    // below drains, it does not kill.
    let signalled = shutdown_signal();
    tracing::info!(%addr, "synor listening");
    println!("synor listening on http://{addr}");
    let draining = state.draining.clone();
    let app = server::app(state, args.listen.max_body_bytes);
    let limits = server::listen::Limits {
        header_timeout: secs(args.listen.header_timeout),
        max_per_client: args.listen.max_connections_per_client,
    };
    // At the signal the server drains: it keeps answering (health 503,
    // new requests 503) while running requests finish, for at most
    // `--shutdown-grace`; then it stops listening and ends what is left.
    let grace = secs(args.listen.shutdown_grace);
    let stop = {
        let registry = registry.clone();
        async move {
            signalled.await;
            draining.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(?grace, "draining");
            let _ = tokio::time::timeout(grace, idle(&registry)).await;
        }
    };
    // Connections still open after the drain get a moment to finish
    // their last answer.
    server::listen::serve(
        listener,
        app,
        limits,
        stop,
        std::time::Duration::from_secs(1),
    )
    .await;
    registry.shutdown();
    // Streams ended above settled (or queued their settlement): commit them.
    billing.ledger.flush().await;
    tracing::info!("synor stopped");
    Ok(())
}

/// `s` seconds (the parser checked their range).
fn secs(s: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(s)
}

/// Resolves once no engine has a running or waiting request.
async fn idle(registry: &ModelRegistry) {
    loop {
        let busy = registry.list().iter().any(|m| match &m.kind {
            engine::registry::ModelKind::Text(e) => {
                let s = e.stats();
                s.num_running + s.num_waiting > 0
            }
            engine::registry::ModelKind::Embedding(_) => false,
        });
        if !busy {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is
/// called (not when first awaited), so a signal that arrives before the
/// future is polled is not lost to the default action (termination).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {},
                () = wait(int) => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
