//! `synor-loadtest`: a serving benchmark that speaks only HTTP and SSE, so it
//! measures Synor and any other OpenAI-compatible server the same way.
//! This first version runs streamed chat requests with a fixed number in
//! flight (`--max-concurrency`) and reports TTFT, TPOT, ITL, E2E latency and
//! throughput with vLLM's definitions; request rates and datasets come next.

mod client;
mod stats;

use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use futures_util::StreamExt;

use crate::client::{ChatJob, RequestResult, stream_chat};

/// Benchmark an OpenAI-compatible chat endpoint.
#[derive(Debug, Parser)]
#[command(name = "synor-loadtest", version, about)]
struct Args {
    /// Server base URL (without /v1).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base_url: String,
    /// Model name to request.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    /// The user message of every request.
    #[arg(long, default_value = "What is the capital of France?")]
    prompt: String,
    /// Requests to run (after one warm-up request).
    #[arg(long, default_value_t = 5)]
    num_prompts: u32,
    /// Requests in flight at once (1 = one after another).
    #[arg(long, default_value_t = 1)]
    max_concurrency: u32,
    /// `max_tokens` of each request.
    #[arg(long, default_value_t = 128)]
    max_tokens: u32,
    /// Ask the server to ignore EOS so every request produces `max_tokens`.
    #[arg(long)]
    ignore_eos: bool,
    /// Send the prompt verbatim to every request (by default each request
    /// gets a distinct numbered prefix, so no prefix cache can share work).
    #[arg(long)]
    same_prompt: bool,
    /// Bearer token, if the server needs one.
    #[arg(long, env = "OPENAI_API_KEY")]
    api_key: Option<String>,
    /// Percentiles to report.
    #[arg(long, value_delimiter = ',', default_value = "50,90,99")]
    percentiles: Vec<f64>,
}

fn print_metric(name: &str, values: &[Duration], percentiles: &[f64]) {
    let Some(s) = stats::summarize(values, percentiles) else {
        println!("{name:<28} n/a");
        return;
    };
    let pcts: Vec<String> = s
        .percentiles
        .iter()
        .map(|(p, v)| format!("p{p}={v:.2}"))
        .collect();
    println!(
        "{name:<28} mean={:.2} median={:.2} std={:.2} {} (ms)",
        s.mean,
        s.median,
        s.std,
        pcts.join(" ")
    );
}

fn report(results: &[RequestResult], wall: Duration, percentiles: &[f64]) {
    let out: u64 = results.iter().map(|r| r.output_tokens).sum();
    let inp: u64 = results.iter().map(|r| r.prompt_tokens).sum();
    println!("============ Serving Benchmark Result ============");
    println!("{:<28} {}", "Successful requests:", results.len());
    println!(
        "{:<28} {:.2}",
        "Benchmark duration (s):",
        wall.as_secs_f64()
    );
    println!("{:<28} {inp}", "Total input tokens:");
    println!("{:<28} {out}", "Total generated tokens:");
    println!(
        "{:<28} {:.2}",
        "Request throughput (req/s):",
        results.len() as f64 / wall.as_secs_f64()
    );
    println!(
        "{:<28} {:.2}",
        "Output token throughput (tok/s):",
        out as f64 / wall.as_secs_f64()
    );
    let ttft: Vec<_> = results.iter().map(|r| r.ttft).collect();
    let tpot: Vec<_> = results.iter().filter_map(RequestResult::tpot).collect();
    let itl: Vec<_> = results.iter().flat_map(|r| r.itl.iter().copied()).collect();
    let e2e: Vec<_> = results.iter().map(|r| r.e2e).collect();
    print_metric("TTFT", &ttft, percentiles);
    print_metric("TPOT (NVIDIA: ITL)", &tpot, percentiles);
    print_metric("ITL (inter-chunk gap)", &itl, percentiles);
    print_metric("E2E latency", &e2e, percentiles);
    let decode: Vec<f64> = tpot.iter().map(|d| 1.0 / d.as_secs_f64()).collect();
    if !decode.is_empty() {
        let mean = decode.iter().sum::<f64>() / decode.len() as f64;
        println!("{:<28} {mean:.1}", "Per-request decode (tok/s):");
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.num_prompts == 0 || args.max_tokens == 0 || args.max_concurrency == 0 {
        bail!("--num-prompts, --max-tokens and --max-concurrency must be at least 1");
    }
    let client = reqwest::Client::new();
    let job = ChatJob {
        base_url: args.base_url.clone(),
        model: args.model.clone(),
        prompt: args.prompt.clone(),
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        api_key: args.api_key.clone(),
    };
    stream_chat(&client, &job).await?; // warm-up
    let started = Instant::now();
    let jobs: Vec<ChatJob> = (0..args.num_prompts)
        .map(|i| {
            let mut j = job.clone();
            if !args.same_prompt {
                j.prompt = format!("[{i}] {}", job.prompt);
            }
            j
        })
        .collect();
    let results: Vec<RequestResult> = futures_util::stream::iter(&jobs)
        .map(|j| stream_chat(&client, j))
        .buffer_unordered(args.max_concurrency as usize)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    report(&results, started.elapsed(), &args.percentiles);
    Ok(())
}

fn main() {
    let args = Args::parse();
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
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("synor-loadtest: {e:#}");
        std::process::exit(1);
    }
}
