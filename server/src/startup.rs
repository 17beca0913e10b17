//! Start-up: load the configured models (off the async runtime), bind the
//! listener (port 0 allowed; the bound address is printed for scripts and
//! tests), and serve until SIGINT/SIGTERM, then stop the engines.

use std::sync::Arc;

use anyhow::Context;
use engine::{EmbeddingHandle, EngineHandle, TemplateChoice};
use tokio::net::TcpListener;

use crate::auth::Auth;
use crate::config::ServeArgs;
use crate::state::{AppState, ModelKind, ModelRegistry, ServedModel};
use crate::store::Db;

/// Loads every configured model.
pub async fn load_models(args: &ServeArgs) -> anyhow::Result<ModelRegistry> {
    let args = args.clone();
    tokio::task::spawn_blocking(move || {
        let created = crate::api::unix_now();
        let mut models = Vec::new();
        let path = args.models.model_path();
        let template: TemplateChoice = args.models.chat_template.parse().unwrap_or_default();
        let engine = EngineHandle::start_gguf(&path, &template, args.scheduler.to_engine())
            .with_context(|| {
                format!(
                    "loading {} (run `make models` to fetch the defaults)",
                    path.display()
                )
            })?;
        models.push(ServedModel {
            name: args.models.model_name(),
            created,
            kind: ModelKind::Text(engine),
        });
        if let Some(dir) = args.models.embedding_path() {
            let embed = EmbeddingHandle::start(&dir).with_context(|| {
                format!(
                    "loading {} (run `make models` to fetch the defaults)",
                    dir.display()
                )
            })?;
            models.push(ServedModel {
                name: args.models.embedding_name(),
                created,
                kind: ModelKind::Embedding(embed),
            });
        }
        Ok(ModelRegistry::new(models))
    })
    .await
    .context("model loading panicked")?
}

/// Runs `synor serve` until a shutdown signal.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.open && !args.bind.ip().is_loopback() {
        anyhow::bail!(
            "--open (no API keys) is only allowed on a loopback address, not {}",
            args.bind
        );
    }
    let auth = if args.open {
        Auth::open()
    } else {
        let db = Db::connect(&args.database_url)
            .await
            .with_context(|| format!("opening the database {}", args.database_url))?;
        Auth::with_keys(db, args.admin_token.clone())
    };
    let registry = Arc::new(load_models(&args).await?);
    let state = AppState::with_auth(registry.clone(), auth);
    let listener = TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding {}", args.bind))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "synor listening");
    println!("synor listening on http://{addr}");
    let app = crate::app(state, args.max_body_bytes);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    registry.shutdown();
    tracing::info!("synor stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
