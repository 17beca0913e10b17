//! The simulator over the small example fleet (100 providers, 10,000
//! generated requests, fixed seeds): every request is accounted for, the
//! totals are pinned, the money obeys the ledger's invariants, a run is
//! reproducible, cheats are caught by spot checks at their rates, and no
//! copy of the production logic lives in the simulator.

use std::path::Path;

use rand::SeedableRng;
use rand::rngs::StdRng;
use server::services::spotcheck::SpotConfig;
use sim::fleet::{Cheat, Fleet, FleetFile};
use sim::workload::{Generator, Request};
use sim::{Report, Settings};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn small(seed: u64, edit: impl FnOnce(&mut FleetFile)) -> (Fleet, Vec<Request>) {
    let read =
        |f: &str| std::fs::read_to_string(root().join("fleets").join(f)).expect("fleet file");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut file = FleetFile::parse(&read("small.toml")).expect("parse");
    edit(&mut file);
    let fleet = file.expand(&mut rng).expect("expand");
    let mut g: Generator = toml::from_str(&read("day.toml")).expect("workload");
    g.requests = 10_000;
    let trace = g.generate(&mut rng).expect("trace");
    (fleet, trace)
}

fn settings(policy: &str, spot: SpotConfig) -> (String, Settings) {
    (
        policy.to_string(),
        Settings {
            policy: sim::policy_named(policy).expect("policy"),
            weights: Default::default(),
            spot,
            sample_s: 300.0,
            step_target_ms: 100.0,
            record: false,
        },
    )
}

fn run(fleet: &Fleet, trace: &[Request], policies: &[&str], spot: SpotConfig) -> Vec<Report> {
    let p: Vec<_> = policies.iter().map(|p| settings(p, spot)).collect();
    sim::simulate(fleet, trace, &p, 7).expect("simulate")
}

/// What providers may be paid for `paid` by users at most: the price net
/// of the fee (the fee is inside each price).
fn net_of_fee(paid: f64, fee_bps: i64) -> f64 {
    paid * 10_000.0 / (10_000 + fee_bps) as f64
}

#[test]
fn a_small_fleet_day_has_checked_totals() {
    let (fleet, trace) = small(1, |_| {});
    let members: usize = fleet.providers.iter().map(|p| p.stages.len().max(1)).sum();
    assert_eq!(members + fleet.unchained, 100);
    // Four home GPUs of 24 GB hold the 42 GB model as two pipelines of two.
    let pipes: Vec<_> = fleet
        .providers
        .iter()
        .filter(|p| !p.stages.is_empty())
        .collect();
    assert_eq!(pipes.len(), 2, "{pipes:?}");
    for p in &pipes {
        let layers: u32 = p.stages.iter().map(|s| s.1.end - s.1.start).sum();
        assert_eq!((p.stages.len(), layers), (2, 80), "{p:?}");
    }
    let all = ["measured", "round-robin", "least-loaded", "cheapest-first"];
    let reports = run(&fleet, &trace, &all, SpotConfig::default());
    let prompt: u64 = trace.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let output: u64 = trace.iter().map(|r| u64::from(r.output_tokens)).sum();
    assert_eq!((prompt, output), (PROMPT_TOKENS, OUTPUT_TOKENS));
    for r in &reports {
        let name = &r.policy;
        assert_eq!(r.served + r.unserved, 10_000, "{name}");
        assert_eq!(r.unserved, 0, "{name}: the small fleet serves every model");
        assert_eq!(
            (r.prompt_tokens, r.output_tokens),
            (prompt, output),
            "{name}"
        );
        let m = &r.money;
        assert!(
            m.users_paid > 0.0 && m.providers_paid > 0.0,
            "{name}: {m:?}"
        );
        assert!(
            m.providers_paid <= net_of_fee(m.users_paid, 700) + 1e-9,
            "{name}: {m:?}"
        );
        assert!(
            (m.users_paid - m.providers_paid - m.treasury).abs() < 1e-9,
            "{name}: {m:?}"
        );
        for (c, t) in &r.cheats {
            assert!(
                t.caught <= t.harmful && t.harmful <= t.attempts,
                "{name} {c:?}: {t:?}"
            );
        }
        assert!(
            r.goodput > 0.8 && r.goodput <= 1.0,
            "{name}: goodput {}",
            r.goodput
        );
        assert!(
            r.ttft_ms.p50 <= r.ttft_ms.p99 && r.tpot_ms.p50 <= r.tpot_ms.p99,
            "{name}"
        );
        let online: f64 = r.kinds.iter().map(|k| k.online_hours).sum();
        assert!(
            online > 0.0 && (0.0..=1.0).contains(&r.idle_share),
            "{name}"
        );
        assert!(
            r.baseline.provisioned > 0 && r.baseline.cost_per_mtok_static > 0.0,
            "{name}"
        );
    }
    // A tenth of the tenants buy capacity: fills, and requests run on it.
    for r in &reports {
        let m = r.market.as_ref().expect("the small fleet has a market");
        assert!(
            m.fills > 0 && m.covered_requests > 0 && m.prepaid > 0.0,
            "{}: {m:?}",
            r.policy
        );
        assert!(
            m.sellers_paid <= net_of_fee(m.prepaid, 700) + 1e-9,
            "{}: {m:?}",
            r.policy
        );
    }
    // The cost model places work where it is cheapest for its time: users
    // pay less under it than with placement blind to price.
    let cost = |p: &str| {
        reports
            .iter()
            .find(|r| r.policy == p)
            .expect("policy")
            .money
            .user_cost_per_mtok
    };
    assert!(
        cost("measured") < cost("round-robin"),
        "{}",
        sim::summary(&reports)
    );
    assert!(
        cost("cheapest-first") <= cost("measured"),
        "{}",
        sim::summary(&reports)
    );
}

#[test]
fn a_run_is_reproducible_from_its_seed() {
    let (fleet, trace) = small(2, |_| {});
    let json = |r: &Report| {
        let mut v = serde_json::to_value(r).expect("json");
        v["wall_s"] = 0.into();
        v
    };
    let a = run(&fleet, &trace, &["measured"], SpotConfig::default());
    let b = run(&fleet, &trace, &["measured"], SpotConfig::default());
    assert_eq!(json(&a[0]), json(&b[0]));
    let (fleet2, trace2) = small(2, |_| {});
    assert_eq!(trace, trace2);
    assert_eq!(fleet.providers.len(), fleet2.providers.len());
}

#[test]
fn cheats_are_caught_at_the_spot_check_rate_refunded_and_quarantined() {
    // Every provider cheats; a quarter of a new provider's attempts are
    // checked (the production default).
    let (fleet, trace) = small(3, |f| f.groups.iter_mut().for_each(|g| g.dishonest = 1.0));
    let r = &run(&fleet, &trace, &["measured"], SpotConfig::default())[0];
    let garbage = r.cheats.get(&Cheat::Garbage).expect("garbage cheats");
    assert!(
        garbage.caught > 0 && garbage.cost_to_users > 0.0,
        "{garbage:?}"
    );
    assert!(
        r.quarantined > 0 && r.money.refunded > 0.0 && r.money.clawed_back > 0.0,
        "{r:?}"
    );
    // Wrong counts cost nothing: the server bills what it counted.
    if let Some(t) = r.cheats.get(&Cheat::InflatedCounts) {
        assert_eq!((t.harmful, t.cost_to_users), (0, 0.0), "{t:?}");
    }
    // Every attempt checked: no wrong answer is ever paid for.
    let all = SpotConfig {
        new_rate: 1.0,
        rate: 1.0,
        ..SpotConfig::default()
    };
    let r = &run(&fleet, &trace, &["measured"], all)[0];
    for (c, t) in &r.cheats {
        assert_eq!(
            (t.caught, t.cost_to_users),
            (t.harmful, 0.0),
            "{c:?}: {t:?}"
        );
    }
    let m = &r.money;
    assert!(
        m.providers_paid <= net_of_fee(m.users_paid, 700) + 1e-9,
        "{m:?}"
    );
}

#[test]
fn the_money_of_a_run_replays_into_the_ledger_and_passes_its_audit() {
    // Contracts are prepaid through the ledger's trades, not settlements:
    // this run has no market.
    let (fleet, mut trace) = small(4, |f| {
        f.market = None;
        f.groups.iter_mut().for_each(|g| g.dishonest = 0.3);
    });
    trace.truncate(1_500);
    let (name, mut s) = settings("measured", SpotConfig::default());
    s.record = true;
    let (report, settled) = sim::run_one(&fleet, &trace, &name, &s, 4).expect("run");
    assert_eq!(settled.len() as u64, report.served);
    assert!(settled.iter().any(|x| x.clawed), "some cheat caught");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let replayed = rt.block_on(async {
        let db = money::store::Db::connect(&money::store::testing::sqlite_url())
            .await
            .expect("db");
        sim::journal::replay(db, &settled).await.expect("replay")
    });
    assert!(replayed.audit.violations.is_empty(), "{:?}", replayed.audit);
    assert_eq!(replayed.audit.open_holds, 0);
    let m = &report.money;
    assert_eq!(replayed.users_paid, m.users_paid_ticks);
    assert_eq!(replayed.providers_paid, m.providers_paid_ticks);
}

#[test]
fn providers_that_come_and_go_leave_no_request_behind() {
    // Everyone arrives within six minutes and stays about ten.
    let (fleet, trace) = small(5, |f| {
        for g in &mut f.groups {
            g.arrive_within_h = 0.1;
            g.stay_h = Some(0.17);
        }
    });
    let r = &run(&fleet, &trace, &["measured"], SpotConfig::default())[0];
    assert!(r.departures > 50, "{}", r.departures);
    assert_eq!(r.served + r.unserved, 10_000);
    assert!(r.failovers > 0 && r.unserved > 0, "{r:?}");
    // Requests that found no provider at all are not billed.
    assert!(r.money.users_paid > 0.0);
}

/// The production functions the simulator must call, never redefine:
/// every public function of the placement, pricing, settlement, spot
/// check and calibration-profile modules.
const PRODUCTION: [&str; 9] = [
    "../server/src/services/placement/policy.rs",
    "../server/src/services/placement/score.rs",
    "../server/src/services/placement/disagg.rs",
    "../server/src/services/spotcheck.rs",
    "../money/src/market/pricing.rs",
    "../money/src/market/book.rs",
    "../money/src/ledger/amount.rs",
    "../money/src/ledger/settle.rs",
    "../protocol/src/bus.rs",
];

/// Names too common to mean a copy.
const COMMON: [&str; 9] = [
    "new", "run", "default", "fmt", "from_str", "len", "is_empty", "check", "as_str",
];

fn fn_names(text: &str) -> Vec<String> {
    text.split("fn ")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[test]
fn no_copy_of_the_production_logic_lives_in_the_simulator() {
    let mut production = std::collections::BTreeSet::new();
    for f in PRODUCTION {
        let text = std::fs::read_to_string(root().join(f)).expect(f);
        production.extend(fn_names(&text));
    }
    assert!(production.contains("payees") && production.contains("demand_bps"));
    let mut files = Vec::new();
    let mut dirs = vec![root().join("src")];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("source dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 8, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).expect("source");
        assert!(
            !text.contains("impl Policy for"),
            "{}: a placement policy of its own",
            path.display()
        );
        for name in fn_names(&text) {
            assert!(
                COMMON.contains(&name.as_str()) || !production.contains(&name),
                "{} defines `{name}`, a production function: call it instead",
                path.display()
            );
        }
    }
}

/// The small day's token totals (seed 1): the generator's output, pinned.
const PROMPT_TOKENS: u64 = 4_892_513;
const OUTPUT_TOKENS: u64 = 2_747_286;
