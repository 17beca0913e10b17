//! Command-line arguments, checked up front so that a bad value is one
//! clear line and a non-zero exit, never a backtrace.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::bench::Plan;
use crate::client::{CacheMode, Endpoint, Target};
use crate::dataset::{self, Dataset};
use crate::metrics::Slo;

#[derive(Debug, Parser)]
#[command(
    name = "synor-loadtest",
    version,
    about = "Serving benchmark for OpenAI-compatible servers (vLLM's metrics)",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print two result files side by side, with ratios (b / a).
    Compare { a: PathBuf, b: PathBuf },
    /// Latency of cheap requests (e.g. `/v1/models`) at a fixed concurrency.
    Overhead(crate::overhead::OverheadArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetKind {
    Random,
    Chat,
    Paraphrase,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Server base URL (without /v1).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub base_url: String,
    /// Model name to request.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    pub model: String,
    #[arg(long, value_enum, default_value = "chat")]
    pub endpoint: Endpoint,
    /// Bearer token, if the server needs one.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The prompts (`--dataset-name`, vLLM's name, works too).
    #[arg(long, alias = "dataset-name", value_enum, default_value = "random")]
    pub dataset: DatasetKind,
    /// JSONL file for `chat` or `paraphrase` (default: the built-in set).
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Words per random prompt (about one token each).
    #[arg(long, default_value_t = 128)]
    pub random_input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: u32,
    /// Lengths vary uniformly within ±ratio of the given ones.
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Words of a prefix shared by every random prompt (prefix caching).
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: usize,
    /// `max_tokens` for the chat and paraphrase datasets.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Requests to run (after one warm-up request).
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Requests per second, or `inf` to send them all at once.
    #[arg(long, default_value = "inf")]
    pub request_rate: String,
    /// Gamma shape of the gaps between requests (1.0 = Poisson).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Most requests in flight at once.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Ask the server to ignore EOS, so outputs have their full length.
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling's `top_p`, sent only when given (sampling's cost
    /// over a large vocabulary is part of what a user's request pays).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// `bypass` sends `x-synor-cache: bypass`, so every answer is generated;
    /// `allow` lets the server's response cache answer (to measure it).
    #[arg(long, value_enum, default_value_t = CacheMode::Bypass)]
    pub cache: CacheMode,
    #[arg(long)]
    pub no_warmup: bool,
    /// Cancellation storm: drop each connection after this many content
    /// chunks, then check that the server has nothing left running.
    #[arg(long)]
    pub cancel_after: Option<usize>,
    /// Seconds to wait for the server to drain after a storm.
    #[arg(long, default_value_t = 5.0)]
    pub drain_grace: f64,
    /// Percentiles to report (`--metric-percentiles`, vLLM's name, works
    /// too).
    #[arg(
        long,
        alias = "metric-percentiles",
        value_delimiter = ',',
        default_value = "50,90,99"
    )]
    pub percentiles: Vec<f64>,
    /// Which metrics the vLLM result file summarizes (of ttft, tpot, itl,
    /// e2el).
    #[arg(long, value_delimiter = ',', default_value = "ttft,tpot,itl,e2el")]
    pub percentile_metrics: Vec<String>,
    /// SLOs for goodput, e.g. `--goodput ttft:500 tpot:50 e2el:10000` (ms).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Write our JSON result here.
    #[arg(long)]
    pub result_file: Option<PathBuf>,
    /// Write vLLM's flat result JSON (`benchmark_serving`'s fields) into
    /// `--result-dir`, with ours beside it (`<name>.synor.json`).
    #[arg(long)]
    pub save_result: bool,
    /// Folder of `--save-result` (default: the current one).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// File name of `--save-result` (default:
    /// `synor-<rate>qps-<model>-<date>.json`).
    #[arg(long)]
    pub result_filename: Option<String>,
    /// Stop sending after this many seconds (requests not sent by then
    /// are left out; running ones finish). Give `--num-prompts` enough
    /// for the rate.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Put every request's timings into the result file.
    #[arg(long)]
    pub save_detailed: bool,
    /// Write SVG plots (TTFT, ITL, throughput over time) into this folder.
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// A tokenizer.json to count output tokens when the server sends no usage.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    #[arg(long)]
    pub no_progress: bool,
}

impl RunArgs {
    /// The dataset these arguments describe.
    pub fn dataset(&self) -> Dataset {
        match self.dataset {
            DatasetKind::Random => Dataset::Random {
                input_len: self.random_input_len,
                output_len: self.random_output_len,
                range_ratio: self.random_range_ratio,
                prefix_len: self.random_prefix_len,
            },
            DatasetKind::Chat => Dataset::Chat {
                path: self.dataset_path.clone(),
            },
            DatasetKind::Paraphrase => Dataset::Paraphrase {
                path: self.dataset_path.clone(),
            },
        }
    }

    /// The rate as a number (`inf` is infinity).
    pub fn rate(&self) -> anyhow::Result<f64> {
        let r = match self.request_rate.trim() {
            "inf" | "infinity" => f64::INFINITY,
            s => s
                .parse::<f64>()
                .with_context(|| format!("--request-rate must be a number or inf, not `{s}`"))?,
        };
        if r.is_nan() || r <= 0.0 {
            bail!("--request-rate must be greater than 0 (or inf for all at once)");
        }
        Ok(r)
    }

    /// Checks every value and builds the run plan.
    pub fn plan(&self) -> anyhow::Result<Plan> {
        let rate = self.rate()?;
        if !(self.burstiness > 0.0 && self.burstiness.is_finite()) {
            bail!("--burstiness must be a positive number");
        }
        if self.num_prompts == 0 {
            bail!("--num-prompts must be at least 1");
        }
        if self.max_concurrency == Some(0) {
            bail!("--max-concurrency must be at least 1");
        }
        if self.max_tokens == 0 || self.random_output_len == 0 {
            bail!("output lengths must be at least 1 token");
        }
        if !(0.0..1.0).contains(&self.random_range_ratio) {
            bail!("--random-range-ratio must be in [0, 1)");
        }
        if let Some(p) = self
            .percentiles
            .iter()
            .find(|p| !(**p > 0.0 && **p <= 100.0))
        {
            bail!("percentile {p} is outside (0, 100]");
        }
        if !(self.timeout > 0.0 && self.timeout.is_finite()) {
            bail!("--timeout must be a positive number of seconds");
        }
        if self.duration.is_some_and(|d| !(d > 0.0 && d.is_finite())) {
            bail!("--duration must be a positive number of seconds");
        }
        if let Some(m) = self
            .percentile_metrics
            .iter()
            .find(|m| !crate::vllm::METRICS.contains(&m.as_str()))
        {
            bail!("--percentile-metrics: `{m}` is not one of ttft, tpot, itl, e2el");
        }
        let url = reqwest::Url::parse(&self.base_url)
            .with_context(|| format!("--base-url `{}` is not a URL", self.base_url))?;
        if !matches!(url.scheme(), "http" | "https") {
            bail!("--base-url must be http:// or https://");
        }
        let tokenizer = match &self.tokenizer {
            None => None,
            Some(p) => Some(Arc::new(tokenizers::Tokenizer::from_file(p).map_err(
                |e| anyhow::anyhow!("cannot load the tokenizer {}: {e}", p.display()),
            )?)),
        };
        let specs = dataset::build(
            &self.dataset(),
            self.num_prompts,
            self.max_tokens,
            self.seed,
        )?;
        Ok(Plan {
            target: Target {
                base_url: self.base_url.clone(),
                model: self.model.clone(),
                endpoint: self.endpoint,
                api_key: self.api_key.clone(),
                ignore_eos: self.ignore_eos,
                temperature: self.temperature,
                top_p: self.top_p,
                cache: self.cache,
                tokenizer,
            },
            specs,
            request_rate: rate,
            burstiness: self.burstiness,
            max_concurrency: self.max_concurrency,
            seed: self.seed,
            warmup: !self.no_warmup,
            cancel_after: self.cancel_after,
            progress: !self.no_progress,
            timeout: Duration::from_secs_f64(self.timeout),
            duration: self.duration.map(Duration::from_secs_f64),
        })
    }

    /// The goodput SLOs.
    pub fn slo(&self) -> anyhow::Result<Slo> {
        parse_slo(&self.goodput)
    }
}

/// Parses `ttft:MS tpot:MS e2el:MS` (any subset).
pub fn parse_slo(items: &[String]) -> anyhow::Result<Slo> {
    let mut slo = Slo::default();
    for item in items {
        let (k, v) = item
            .split_once(':')
            .with_context(|| format!("--goodput takes KEY:MS pairs, not `{item}`"))?;
        let ms: f64 = v
            .parse()
            .ok()
            .filter(|v: &f64| *v > 0.0 && v.is_finite())
            .with_context(|| format!("--goodput {k}: `{v}` is not a positive number of ms"))?;
        match k {
            "ttft" => slo.ttft_ms = Some(ms),
            "tpot" => slo.tpot_ms = Some(ms),
            "e2el" => slo.e2el_ms = Some(ms),
            other => bail!("--goodput knows ttft, tpot and e2el, not `{other}`"),
        }
    }
    Ok(slo)
}

/// The command line as a result file records it, with the values of
/// the flags that carry secrets (`--api-key`) replaced by `***`: a result
/// file is shared, a key must not travel with it.
pub fn recorded_command(args: impl IntoIterator<Item = String>) -> String {
    const SECRET: &str = "--api-key";
    let mut out: Vec<String> = Vec::new();
    let mut hide_next = false;
    for a in args {
        if hide_next {
            out.push("***".into());
            hide_next = false;
        } else if a == SECRET {
            out.push(a);
            hide_next = true;
        } else if a.starts_with(&format!("{SECRET}=")) {
            out.push(format!("{SECRET}=***"));
        } else {
            out.push(a);
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> anyhow::Result<Plan> {
        let mut v = vec!["synor-loadtest"];
        v.extend_from_slice(extra);
        Cli::try_parse_from(v)?.run.plan()
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let msg = |a: &[&str]| args(a).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(msg(&["--request-rate", "0"]).contains("greater than 0"));
        assert!(msg(&["--request-rate", "fast"]).contains("number or inf"));
        assert!(msg(&["--num-prompts", "0"]).contains("at least 1"));
        assert!(msg(&["--max-concurrency", "0"]).contains("at least 1"));
        assert!(msg(&["--base-url", "localhost:8080"]).contains("http"));
        assert!(
            msg(&["--dataset", "chat", "--dataset-path", "/nope.jsonl"]).contains("cannot read")
        );
        assert!(msg(&["--percentiles", "0"]).contains("outside"));
        assert!(args(&["--request-rate", "2.5", "--num-prompts", "3"]).is_ok());
    }

    #[test]
    fn the_cache_option_defaults_to_bypass_and_accepts_allow() {
        let cache = |a: &[&str]| args(a).map(|p| p.target.cache).ok();
        assert_eq!(cache(&[]), Some(CacheMode::Bypass));
        assert_eq!(cache(&["--cache", "bypass"]), Some(CacheMode::Bypass));
        assert_eq!(cache(&["--cache", "allow"]), Some(CacheMode::Allow));
        assert_eq!(cache(&["--cache", "sometimes"]), None);
        let overhead = |a: &[&str]| match Cli::try_parse_from(a).map(|c| c.command) {
            Ok(Some(Command::Overhead(o))) => Some(o.cache),
            _ => None,
        };
        assert_eq!(overhead(&["l", "overhead"]), Some(CacheMode::Bypass));
        assert_eq!(
            overhead(&["l", "overhead", "--cache", "allow"]),
            Some(CacheMode::Allow)
        );
    }

    #[test]
    fn goodput_pairs_parse() {
        let s = parse_slo(&["ttft:500".into(), "e2el:2000".into()]).expect("valid");
        assert_eq!(
            (s.ttft_ms, s.tpot_ms, s.e2el_ms),
            (Some(500.0), None, Some(2000.0))
        );
        assert!(parse_slo(&["itl:5".into()]).is_err());
        assert!(parse_slo(&["ttft".into()]).is_err());
        assert!(parse_slo(&["ttft:-1".into()]).is_err());
    }

    #[test]
    fn a_recorded_command_never_holds_the_api_key() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            recorded_command(args("synor-loadtest --api-key sk-secret --num-prompts 4")),
            "synor-loadtest --api-key *** --num-prompts 4"
        );
        assert_eq!(
            recorded_command(args("synor-loadtest --api-key=sk-secret")),
            "synor-loadtest --api-key=***"
        );
        assert_eq!(
            recorded_command(args("synor-loadtest --model m")),
            "synor-loadtest --model m"
        );
    }
}
