//! `synor simulate`: reads a fleet file and a workload (a JSON-lines
//! trace, or a TOML generator spec), runs the simulator once per
//! placement policy asked for and writes the report (JSON, a text
//! summary, SVG charts); the summary also goes to stdout.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Options of `synor simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The fleet (TOML: regions, processor profiles, models, provider
    /// groups, the cloud baseline).
    #[arg(long)]
    pub fleet: PathBuf,
    /// The workload: a trace (`.jsonl`, one request per line) or a
    /// generator spec (`.toml`).
    #[arg(long)]
    pub workload: PathBuf,
    /// Placement policies to compare, comma-separated (measured,
    /// round-robin, least-loaded, cheapest-first).
    #[arg(
        long,
        default_value = "measured,round-robin,least-loaded,cheapest-first"
    )]
    pub policy: String,
    /// Seed of every random draw (fleet, workload, crashes, checks).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// With a generator spec: this many requests instead of its own.
    #[arg(long)]
    pub requests: Option<usize>,
    /// Seconds of virtual time between utilization samples.
    #[arg(long, default_value_t = 300.0)]
    pub sample_s: f64,
    /// Where the report goes.
    #[arg(long, default_value = "sim-report")]
    pub report: PathBuf,
    /// Also write the (generated) trace here, as JSON lines.
    #[arg(long)]
    pub write_trace: Option<PathBuf>,
}

pub fn run(a: &SimulateArgs) -> anyhow::Result<()> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let mut rng = StdRng::seed_from_u64(a.seed);
    let fleet = sim::fleet::FleetFile::parse(&read(&a.fleet)?)
        .with_context(|| format!("in {}", a.fleet.display()))?
        .expand(&mut rng)?;
    let text = read(&a.workload)?;
    let trace = if a.workload.extension().is_some_and(|e| e == "toml") {
        let mut g: sim::workload::Generator =
            toml::from_str(&text).with_context(|| format!("in {}", a.workload.display()))?;
        if let Some(n) = a.requests {
            g.requests = n;
        }
        g.generate(&mut rng)?
    } else {
        sim::workload::read(&text).with_context(|| format!("in {}", a.workload.display()))?
    };
    if let Some(out) = &a.write_trace {
        let lines: Vec<String> = trace
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()?;
        std::fs::write(out, lines.join("\n") + "\n")?;
    }
    anyhow::ensure!(a.sample_s > 0.0, "--sample-s must be positive");
    let policies = a
        .policy
        .split(',')
        .map(|name| {
            let name = name.trim();
            Ok((
                name.to_string(),
                sim::Settings {
                    policy: sim::policy_named(name)?,
                    weights: Default::default(),
                    spot: Default::default(),
                    sample_s: a.sample_s,
                    step_target_ms: 100.0,
                    record: false,
                },
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let reports = sim::simulate(&fleet, &trace, &policies, a.seed)?;
    let summary = sim::write(&a.report, &reports)?;
    print!("{summary}");
    println!("report: {}", a.report.display());
    Ok(())
}
