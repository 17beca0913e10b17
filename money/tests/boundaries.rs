//! The money crate's boundary as a dependency fact: nothing it builds on,
//! directly or through another crate, is the server, the engine, an HTTP
//! framework or a model or GPU crate (DESIGN.md: "`money` imports neither
//! axum nor the engine"), so `cargo test -p money` compiles none of them.
//! Read from the workspace's `Cargo.lock`, which resolves every edge.

use std::collections::{BTreeMap, BTreeSet};

/// Crates the money must never reach.
const FORBIDDEN: [&str; 11] = [
    "server",
    "engine",
    "kernels",
    "axum",
    "hyper",
    "candle-core",
    "llguidance",
    "tokenizers",
    "wgpu",
    "cudarc",
    "minijinja",
];

/// Each package's direct dependencies (names only), from a lock file.
fn lock_graph(lock: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let Some(name) = package
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
        else {
            continue;
        };
        let deps = g.entry(name.to_string()).or_default();
        let Some(list) = package.split("dependencies = [").nth(1) else {
            continue;
        };
        let list = list.split(']').next().unwrap_or_default();
        for dep in list.split(',').map(|d| d.trim().trim_matches('"')) {
            if let Some(dep_name) = dep.split(' ').next().filter(|d| !d.is_empty()) {
                deps.insert(dep_name.to_string());
            }
        }
    }
    g
}

/// Every package `root` reaches.
fn reach(g: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(p) = todo.pop() {
        for d in g.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_money_reaches_no_server_engine_http_or_gpu_crate() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock");
    let lock = std::fs::read_to_string(path).expect("the workspace's Cargo.lock");
    let g = lock_graph(&lock);
    let reached = reach(&g, "money");
    assert!(reached.contains("sqlx"), "the lock file was not read");
    for f in FORBIDDEN {
        assert!(!reached.contains(f), "money reaches `{f}`");
    }
}

#[test]
fn the_checker_sees_a_crate_reached_through_another() {
    let lock = r#"
[[package]]
name = "money"
dependencies = [
 "a",
]

[[package]]
name = "a"
version = "1.0.0"
dependencies = [
 "engine 0.1.0",
]

[[package]]
name = "engine"
"#;
    let reached = reach(&lock_graph(lock), "money");
    assert!(reached.contains("engine") && reached.contains("a"));
}
