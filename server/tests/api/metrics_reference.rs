//! The exposition's names, types, labels and help pinned by
//! `docs/reference/metrics.md`: every family `GET /metrics` can show (a
//! text and an embedding model loaded, the response cache on, a worker
//! connected, a ledger audited) must be on the page as it is, and every
//! family on the page must still be exposed, so a series cannot be
//! renamed, retyped or dropped by accident. The page is written from the
//! exposition: `SYNOR_BLESS=1 cargo test -p server --test api metrics_reference`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use server::cache::semantic::{IndexKey, Limits, Policy};
use server::cache::verify::Facts;
use server::cache::{CacheConfig, Found, ResponseCache};
use server::fleet::registry::{Registration, Registry};
use server::http::metrics::{HttpMetrics, render};
use server::services::dispatch::Dispatch;

use crate::helpers::shared_models;

/// One family as the exposition shows it.
#[derive(Debug, Default, PartialEq)]
struct Family {
    kind: String,
    help: String,
    /// Label names seen on its samples (`le` and `quantile` left out).
    labels: Vec<String>,
}

/// Every family of an exposition, by name.
fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.into()).or_default().help = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.into()).or_default().kind = kind.into();
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, rest)) = line.split_once('{') else {
            continue;
        };
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| series.strip_suffix(s).filter(|b| out.contains_key(*b)))
            .unwrap_or(series);
        let Some(f) = out.get_mut(base) else {
            continue;
        };
        let labels = rest.split('}').next().unwrap_or_default();
        for pair in labels.split("\",") {
            let key = pair.split('=').next().unwrap_or_default().trim();
            if !key.is_empty() && key != "le" && !f.labels.iter().any(|l| l == key) {
                f.labels.push(key.into());
            }
        }
    }
    out
}

/// The reference page for these families.
fn page(fams: &BTreeMap<String, Family>) -> String {
    let mut s = String::from(
        "# Metrics reference\n\n\
         What `GET /metrics` exposes (Prometheus text format 0.0.4), one row a\n\
         family. Written from the exposition by\n\
         `SYNOR_BLESS=1 cargo test -p server --test api metrics_reference`; the same\n\
         test fails when the exposition and this page disagree. Names follow\n\
         vLLM's (`synor:` for `vllm:`); per-model series carry `model_name`.\n\
         Labels are those the test's server showed (a family with no sample\n\
         there shows none).\n\n\
         | name | type | labels | what it says |\n|---|---|---|---|\n",
    );
    for (name, f) in fams {
        let labels = f
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let help = f.help.replace('|', "\\|");
        s.push_str(&format!("| `{name}` | {} | {labels} | {help} |\n", f.kind));
    }
    s
}

fn reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/metrics.md")
}

/// The exposition of a server with every part that has metrics.
async fn everything() -> String {
    let fleet = Arc::new(Registry::default());
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let worker = Registration {
        provider_id: "provider:p".into(),
        token_id: "t".into(),
        remote: "r".into(),
        name: "w".into(),
        build: "b".into(),
        devices: vec![],
        models: vec![],
        encoders: vec![],
        threads: 1,
        region: "eu".into(),
        asks: vec![],
        parts: vec![],
    };
    fleet.register(worker, tx);
    let dispatch = Dispatch::new(fleet.clone(), Default::default(), None);
    // An executor's stage and busy clocks, so their labels show.
    let timing = server::services::dispatch::stages::Timing::start();
    dispatch.stats.stages.record("w@provider:p", 10, 5, &timing);
    dispatch.stats.utilization.running("w", 1);
    let cache = ResponseCache::new(&CacheConfig {
        l1_bytes: 1 << 20,
        l2_dir: None,
        l2_bytes: 0,
        redis_url: None,
        ttl: std::time::Duration::from_secs(60),
        policy: Policy {
            threshold: 0.9,
            verify: true,
            align: None,
            delta: Some(0.01),
            judge: None,
        },
        semantic: Limits {
            per_index: 16,
            total: 64,
            ttl: std::time::Duration::from_secs(60),
        },
    })
    .expect("cache");
    // A near match the bound probed and verified, so its series show.
    let ik = IndexKey {
        scope: "s".into(),
        model: "tiny".into(),
        context: "c".into(),
    };
    let france = "What is the capital of France?";
    cache.semantic_put(ik.clone(), vec![1.0, 0.0], france, "k".into());
    let asked = Facts::of("Which city is the capital of France?");
    match cache.semantic_get(&ik, &[1.0, 0.0], &asked) {
        Some(Found::Probe(p)) => cache.semantic_observe(&ik, &p, true),
        other => panic!("a first near match is probed: {other:?}"),
    }
    let http = HttpMetrics::default();
    http.record("/v1/models", "GET", 200);
    // A request the worker served, so the request series show.
    let served = std::sync::Arc::new(server::services::served::Served::default());
    let on = server::services::served::executor("w@provider:p");
    drop(served.watch("tiny", on, std::time::Instant::now()));
    let text = render(
        &shared_models(),
        Some(&cache),
        &http,
        &fleet,
        &dispatch,
        &served,
        Some(0),
    );
    drop(rx);
    text
}

#[tokio::test]
async fn metrics_reference_lists_every_family_the_exposition_shows_with_its_type() {
    let fams = families(&everything().await);
    assert!(fams.len() > 50, "{} families", fams.len());
    for (name, f) in &fams {
        assert!(name.starts_with("synor:"), "{name}: the product prefix");
        assert!(
            ["counter", "gauge", "histogram"].contains(&f.kind.as_str()),
            "{name}: type `{}`",
            f.kind
        );
        assert!(!f.help.is_empty(), "{name}: no help");
        assert_eq!(
            f.kind == "counter",
            name.ends_with("_total"),
            "{name}: counters, and only they, end in _total"
        );
    }
    let want = page(&fams);
    if std::env::var_os("SYNOR_BLESS").is_some() {
        std::fs::write(reference(), &want).expect("write the reference");
        return;
    }
    let have = std::fs::read_to_string(reference()).unwrap_or_default();
    assert!(
        have == want,
        "docs/reference/metrics.md is not the exposition's: rename nothing by accident, \
         or write it again with SYNOR_BLESS=1 cargo test -p server --test api metrics_reference\n\
         --- the page should read:\n{want}"
    );
}
