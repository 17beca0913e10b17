//! The `synor-loadtest` binary: runs a benchmark (or compares two result
//! files) and turns every error into one line and exit status 1.

use std::time::Duration;

use clap::Parser;
use loadtest::cli::{self, Cli, Command, RunArgs};
use loadtest::report::{self, BenchResult, RunInfo};
use loadtest::{bench, compare, metrics, plot, probe, vllm};

async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let plan = args.plan()?;
    let slo = args.slo()?;
    let out = bench::run(&plan).await?;
    let aggregates = metrics::aggregate(
        &out.records,
        out.duration,
        out.peak_concurrency,
        &args.percentiles,
        slo,
    );
    let cancellation_check = match plan.cancel_after {
        Some(_) => {
            probe::check_drained(&args.base_url, Duration::from_secs_f64(args.drain_grace)).await
        }
        None => None,
    };
    let result = BenchResult {
        run: RunInfo {
            date: report::utc_now(),
            base_url: args.base_url.clone(),
            model: args.model.clone(),
            endpoint: format!("{:?}", args.endpoint).to_lowercase(),
            dataset: format!("{:?}", args.dataset()),
            num_prompts: args.num_prompts,
            request_rate: args.request_rate.clone(),
            burstiness: args.burstiness,
            max_concurrency: args.max_concurrency,
            seed: args.seed,
            cache: Some(args.cache),
            command: cli::recorded_command(std::env::args()),
        },
        aggregates,
        cancellation_check,
        output_tokens_per_second: metrics::tokens_per_second(&out.records),
        details: args.save_detailed.then(|| report::details(&out.records)),
    };
    print!("{}", report::render(&result));
    if plan.cancel_after.is_some() && result.cancellation_check.is_none() {
        println!(
            "Cancellation check: n/a (the server has neither /metrics gauges nor /health stats)"
        );
    }
    if let Some(path) = &args.result_file {
        result.write(path)?;
        println!("result written to {}", path.display());
    }
    if args.save_result {
        save_vllm(&args, &result, &out.records)?;
    }
    if let Some(dir) = &args.plot_dir {
        for p in plot::write_all(dir, &out.records)? {
            println!("plot written to {}", p.display());
        }
    }
    let a = &result.aggregates;
    let nothing_worked = a.completed == 0 && a.cancelled == 0 && a.rejected == 0;
    let storm_failed = result
        .cancellation_check
        .as_ref()
        .is_some_and(|c| !c.passed);
    Ok(!nothing_worked && !storm_failed)
}

/// Writes vLLM's flat result file, and ours beside it.
fn save_vllm(
    args: &RunArgs,
    result: &BenchResult,
    records: &[metrics::Record],
) -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = args.result_dir.clone().unwrap_or_else(|| ".".into());
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = args
        .result_filename
        .clone()
        .unwrap_or_else(|| vllm::file_name(&result.run));
    let path = dir.join(&name);
    let flat = vllm::flat(
        &result.run,
        &result.aggregates,
        records,
        &args.percentiles,
        &args.percentile_metrics,
    );
    std::fs::write(&path, serde_json::to_string_pretty(&flat)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let ours = path.with_extension("synor.json");
    result.write(&ours)?;
    println!(
        "vLLM result written to {} (ours: {})",
        path.display(),
        ours.display()
    );
    Ok(())
}

async fn overhead(a: loadtest::overhead::OverheadArgs) -> anyhow::Result<bool> {
    let r = loadtest::overhead::run(&a).await?;
    let l = &r.latency_ms;
    let pct = report::sorted_percentiles(l);
    let pct: Vec<String> = pct.iter().map(|(p, v)| format!("p{p} {v:.2}")).collect();
    println!(
        "{} {} x{} at concurrency {}: mean {:.2} ms, {} ms; {:.0} req/s; statuses {:?}",
        if a.body.is_some() { "POST" } else { "GET" },
        a.path,
        a.requests,
        a.concurrency,
        l.mean,
        pct.join(", "),
        r.throughput,
        r.statuses
    );
    if r.cache.hit_rate.is_some() {
        println!(
            "cache hits: {} ({})",
            report::cache_hits(&r.cache),
            report::cache_outcomes(&r.cache)
        );
    }
    print!("{}", report::cache_warning(&r.cache, Some(a.cache)));
    Ok(true)
}

fn compare_files(a: &std::path::Path, b: &std::path::Path) -> anyhow::Result<bool> {
    let (ra, rb) = (BenchResult::read(a)?, BenchResult::read(b)?);
    let name = |p: &std::path::Path| {
        p.file_stem()
            .map_or("?".into(), |s| s.to_string_lossy().into_owned())
    };
    print!("{}", compare::render(&ra, &rb, (&name(a), &name(b))));
    Ok(true)
}

fn main() {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("synor-loadtest: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let outcome = match cli.command {
        Some(Command::Compare { a, b }) => compare_files(&a, &b),
        Some(Command::Overhead(o)) => rt.block_on(overhead(o)),
        None => rt.block_on(run(cli.run)),
    };
    match outcome {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("synor-loadtest: {e:#}");
            std::process::exit(1);
        }
    }
}
