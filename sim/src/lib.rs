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
pub mod svg;
pub mod workload;
pub mod world;

use std::path::Path;
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use server::services::placement::policy::PolicyKind;

pub use report::Report;
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

/// The reports side by side, as text.
pub fn summary(reports: &[Report]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<15} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>7} {:>8}",
        "policy",
        "served",
        "goodput",
        "ttft p50",
        "ttft p99",
        "tpot p50",
        "tpot p99",
        "user/Mtok",
        "earn/Mtok",
        "idle",
        "cloud x"
    );
    for r in reports {
        let _ = writeln!(
            s,
            "{:<15} {:>9} {:>7.1}% {:>8.0}ms {:>8.0}ms {:>7.1}ms {:>7.1}ms {:>10.4} {:>10.4} {:>6.1}% {:>7.2}x",
            r.policy,
            r.served,
            r.goodput * 100.0,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.tpot_ms.p50,
            r.tpot_ms.p99,
            r.money.user_cost_per_mtok,
            r.money.provider_earned_per_mtok,
            r.idle_share * 100.0,
            r.baseline.fleet_cheaper_static,
        );
    }
    if let Some(r) = reports.first() {
        let b = &r.baseline;
        let _ = writeln!(
            s,
            "\ncloud baseline: {} at {:.2}/h ({}), {} provisioned for the peak: {:.4}/Mtok static, {:.4}/Mtok autoscaled",
            b.profile,
            b.price_per_hour,
            b.source,
            b.provisioned,
            b.cost_per_mtok_static,
            b.cost_per_mtok_autoscaled
        );
        let _ = writeln!(
            s,
            "{} requests over {:.1} virtual hours; per policy:",
            r.requests, r.hours
        );
    }
    for r in reports {
        let m = &r.money;
        let _ = writeln!(
            s,
            "  {}: users paid {:.4}, providers {:.4}, treasury {:.4}, refunded {:.4}; providers' own cost {:.4}/Mtok (electricity of busy hours {:.4}/Mtok); {} failovers, {} crashes, {} quarantined; {} events in {:.2} s",
            r.policy,
            m.users_paid,
            m.providers_paid,
            m.treasury,
            m.refunded,
            m.provider_cost_per_mtok,
            m.provider_energy_per_mtok,
            r.failovers,
            r.crashes,
            r.quarantined,
            r.events,
            r.wall_s
        );
        if let Some(k) = &r.market {
            let last: Vec<String> = k
                .prices
                .iter()
                .rev()
                .take(3)
                .map(|(h, m, p)| format!("{m} {p:.4} at {h:.1} h"))
                .collect();
            let _ = writeln!(
                s,
                "    market: {} asks, {} bids, {} fills, {:.0} token-seconds bought, prepaid {:.4} (sellers {:.4}), {} requests covered; last trades: {}",
                k.asks_posted,
                k.bids_posted,
                k.fills,
                k.capacity_bought,
                k.prepaid,
                k.sellers_paid,
                k.covered_requests,
                last.join(", ")
            );
        }
        for (c, t) in &r.cheats {
            let _ = writeln!(
                s,
                "    {c:?}: {} attempts, {} wrong, {} caught, {:.6} paid by users for wrong answers not caught, {:.6} of fees refunded by the treasury",
                t.attempts, t.harmful, t.caught, t.cost_to_users, t.cost_to_treasury
            );
        }
        for k in &r.kinds {
            let _ = writeln!(
                s,
                "    {:<8} {:>6} providers, {:>9.1} online h, idle {:>5.1}%, utilization {:>5.1}%",
                k.kind,
                k.providers,
                k.online_hours,
                k.idle_share * 100.0,
                k.utilization * 100.0
            );
        }
    }
    s
}
