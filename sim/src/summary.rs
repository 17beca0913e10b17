//! The text summary of a run's reports: a table of the policies side by
//! side, the cloud baseline, and per policy its money, failures, market,
//! cheats and processor types.

use std::fmt::Write;

use crate::market::MarketReport;
use crate::report::Report;

/// The reports side by side, as text.
pub fn summary(reports: &[Report]) -> String {
    let mut s = String::new();
    table(&mut s, reports);
    if let Some(r) = reports.first() {
        baseline(&mut s, r);
    }
    for r in reports {
        details(&mut s, r);
    }
    s
}

fn table(s: &mut String, reports: &[Report]) {
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
}

fn baseline(s: &mut String, r: &Report) {
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
        "{} requests over {:.1} virtual hours; {} layer-sharded pipelines of {} providers ({} left unchained); per policy:",
        r.requests, r.hours, r.pipelines, r.pipeline_members, r.unchained
    );
}

fn details(s: &mut String, r: &Report) {
    let m = &r.money;
    let _ = writeln!(
        s,
        "  {}: users paid {:.4}, providers {:.4}, treasury {:.4}, refunded {:.4}; providers' own cost {:.4}/Mtok (electricity of busy hours {:.4}/Mtok); {} failovers, {} crashes, {} departures, {} quarantined; {} events in {:.2} s",
        r.policy,
        m.users_paid,
        m.providers_paid,
        m.treasury,
        m.refunded,
        m.provider_cost_per_mtok,
        m.provider_energy_per_mtok,
        r.failovers,
        r.crashes,
        r.departures,
        r.quarantined,
        r.events,
        r.wall_s
    );
    if let Some(k) = &r.market {
        market(s, k);
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

fn market(s: &mut String, k: &MarketReport) {
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
