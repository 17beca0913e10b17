//! The `synor` binary: parse the command line, set up logging, run.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use server::config::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            server::telemetry::init(&args.log_format);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(server::startup::serve(*args))
        }
        Command::Openapi { out } => {
            std::fs::write(&out, server::http::openapi::json())?;
            println!("wrote {}", out.display());
            Ok(())
        }
        Command::Keys(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(server::keys_cli::run(args))
        }
        Command::Accounts(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(server::keys_cli::accounts(args))
        }
        Command::Providers(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(server::keys_cli::providers(args))
        }
        Command::Worker(args) => {
            server::telemetry::init(&args.log_format);
            if let Some(n) = args.threads {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .build_global()?;
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let models = server::startup::load_models(&args.models, &args.scheduler)
                    .await
                    .context("loading the worker's models")?;
                let stop = server::startup::shutdown_signal();
                worker::run(args.worker_config(), Arc::new(models), stop).await
            })
        }
    }
}
