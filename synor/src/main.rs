//! The `synor` binary: the command line (`config`), logging
//! (`telemetry`), signals and shutdown, and the wiring of the crates below
//! it: `synor serve` composes the server (`startup`), `synor worker` the
//! provider's worker, `synor keys|accounts|providers` the store and ledger
//! (`keys_cli`), `synor simulate` the fleet simulator (`simulate_cli`).

mod config;
mod config_file;
mod keys_cli;
mod provider_cli;
mod simulate_cli;
mod startup;
mod telemetry;

use std::sync::Arc;

use crate::config::{Cli, Command};
use anyhow::Context;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let argv =
        config_file::expand(std::env::args_os().collect()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cli = Cli::parse_from(argv);
    match cli.command {
        Command::Serve(args) => {
            crate::telemetry::init(args.log_format);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(crate::startup::serve(*args))
        }
        Command::Simulate(args) => crate::simulate_cli::run(&args),
        Command::Openapi { out } => {
            std::fs::write(&out, server::http::openapi::json())?;
            println!("wrote {}", out.display());
            Ok(())
        }
        Command::Keys(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(crate::keys_cli::run(args))
        }
        Command::Accounts(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(crate::keys_cli::accounts(args))
        }
        Command::Providers(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(crate::keys_cli::providers(args))
        }
        Command::Worker(args) => {
            crate::telemetry::init(args.log_format);
            if let Some(n) = args.threads {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .build_global()?;
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let models = crate::startup::load_models(&args.models, &args.scheduler)
                    .await
                    .context("loading the worker's models")?;
                let stop = crate::startup::shutdown_signal();
                let mut config = args.worker_config();
                config.parts = args.part_files()?;
                worker::run(config, Arc::new(models), stop).await
            })
        }
    }
}
