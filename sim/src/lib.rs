//! Synor Compute's fleet simulator (`synor simulate`): a fleet described
//! in TOML (`fleet`), a workload read from JSON lines or generated
//! (`workload`), and a discrete-event run in virtual time (`world`) that
//! drives the production placement policies, pricing engine, spot-check
//! rates, adaptive caps and settlement rule through their own
//! interfaces; only execution is virtual, timed from calibrated profiles.
//! Each placement policy runs over the same trace, and the report
//! (`report`, charts in `svg`) compares them and a cloud baseline.

pub mod fleet;
pub mod journal;
pub mod market;
pub mod report;
pub mod summary;
pub mod svg;
pub mod workload;
pub mod world;

use std::path::Path;
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use server::services::placement::policy::PolicyKind;

pub use report::Report;
pub use summary::summary;
pub use world::Settings;

/// The policies by the names `--placement` takes.
pub fn policy_named(name: &str) -> anyhow::Result<PolicyKind> {
    Ok(match name {
        "measured" => PolicyKind::Measured,
        "round-robin" => PolicyKind::RoundRobin,
        "least-loaded" => PolicyKind::LeastLoaded,
        "cheapest-first" => PolicyKind::CheapestFirst,
        other => anyhow::bail!(
            "no placement policy {other} (measured, round-robin, least-loaded, cheapest-first)"
        ),
    })
}

/// Runs `trace` over `fleet` under each of `policies` (the same seed for
/// each: the same fleet draws, crashes and checks where the runs agree).
pub fn simulate(
    fleet: &fleet::Fleet,
    trace: &[workload::Request],
    policies: &[(String, Settings)],
    seed: u64,
) -> anyhow::Result<Vec<Report>> {
    policies
        .iter()
        .map(|(name, settings)| Ok(run_one(fleet, trace, name, settings, seed)?.0))
        .collect()
}

/// One run: its report, and its settlements when `settings.record`.
pub fn run_one(
    fleet: &fleet::Fleet,
    trace: &[workload::Request],
    name: &str,
    settings: &Settings,
    seed: u64,
) -> anyhow::Result<(Report, Vec<journal::Settled>)> {
    let started = Instant::now();
    let rng = StdRng::seed_from_u64(seed ^ 0x5157);
    let mut w = world::World::new(fleet, trace, settings.clone(), rng)?;
    let (events, end) = w.run();
    let wall = started.elapsed().as_secs_f64();
    let settled = std::mem::take(&mut w.settled);
    let market = w.market_report();
    let mut report = w.tally.report(fleet, trace, name, end, events, wall);
    report.market = market;
    Ok((report, settled))
}

/// Writes `reports` under `dir`: `report.json`, `summary.txt` and one
/// utilization chart per policy (`utilization-<policy>.svg`).
pub fn write(dir: &Path, reports: &[Report]) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(reports)?,
    )?;
    let text = summary(reports);
    std::fs::write(dir.join("summary.txt"), &text)?;
    for r in reports {
        std::fs::write(
            dir.join(format!("utilization-{}.svg", r.policy)),
            svg::utilization(r),
        )?;
    }
    std::fs::write(dir.join("policies.svg"), svg::policies(reports))?;
    Ok(text)
}
