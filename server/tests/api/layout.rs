//! The server's layering, checked from its sources: domain modules
//! (`cache`, `fleet`) never reach the services or the HTTP layer, services
//! never reach the HTTP layer, and no two modules import each other in a
//! circle (top-level modules, and the children of `http` and `services`,
//! each counted as one unit). Production code only: test modules
//! (`tests.rs`, and what follows `#[cfg(test)]`) may reach across. The
//! money (store, ledger, market) is a crate of its own below the server:
//! that it reaches neither is a dependency fact (`money/tests/boundaries.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const DOMAIN: [&str; 2] = ["cache", "fleet"];
/// Modules that wire the binary together; nothing below them uses them.
const WIRING: [&str; 4] = ["startup", "config", "listen", "keys_cli"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("readable source dir")
        .flatten()
    {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The unit a module path belongs to: `http::<child>`, `services::<child>`
/// or the top-level module.
fn unit(segments: &[&str]) -> String {
    match segments {
        [layer @ ("http" | "services"), child, ..]
            if *child != "mod" && child.starts_with(|c: char| c.is_ascii_lowercase()) =>
        {
            format!("{layer}::{child}")
        }
        [first, ..] => first.to_string(),
        [] => String::new(),
    }
}

/// The unit of a source file, from its path under `src/`.
fn file_unit(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under src");
    let segs: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    unit(&segs)
}

/// The units a path after `crate::` names; a group (`a::{b, c::D}`)
/// names one per item.
fn targets(rest: &str) -> Vec<String> {
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(rest.len());
    let path: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
    let group = rest[end..]
        .strip_prefix('{')
        .and_then(|g| g.split('}').next())
        .filter(|_| rest[..end].ends_with("::"));
    match group {
        None => vec![unit(&path)],
        Some(items) => items
            .split(',')
            .map(|item| {
                let mut p = path.clone();
                p.extend(item.trim().split("::").next());
                unit(&p)
            })
            .collect(),
    }
}

/// Every unit each unit names through a `crate::` path.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let from = file_unit(&f);
        if matches!(&from[..], "lib" | "main") || f.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("readable source");
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        let deps = g.entry(from.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            for to in targets(&text[i + "crate::".len()..]) {
                if !to.is_empty() && to != from {
                    deps.insert(to);
                }
            }
        }
    }
    g
}

/// A cycle through `start`, if there is one.
fn cycle_from(g: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        g: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in g.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(g, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(g, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn no_two_modules_import_each_other_in_a_circle() {
    let g = graph();
    assert!(g.contains_key("http::routes") && g.contains_key("services::generation"));
    for unit in g.keys() {
        if let Some(cycle) = cycle_from(&g, unit) {
            panic!("import circle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn domain_modules_know_nothing_of_services_or_http_and_services_nothing_of_http() {
    let g = graph();
    for (from, deps) in &g {
        let top = from.split("::").next().unwrap_or_default();
        let forbidden: Vec<&str> = if DOMAIN.contains(&top) {
            vec!["http", "services"]
        } else if top == "services" {
            vec!["http"]
        } else {
            continue;
        };
        for d in deps {
            let dtop = d.split("::").next().unwrap_or_default();
            assert!(
                !forbidden.contains(&dtop) && !WIRING.contains(&dtop),
                "`{from}` uses `{d}`: it sits below that layer"
            );
        }
    }
}

#[test]
fn the_checker_sees_a_planted_circle() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle_from(&g, "a"),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
    assert_eq!(unit(&["http", "routes", "chat"]), "http::routes");
    assert_eq!(unit(&["ledger", "accounts"]), "ledger");
    assert_eq!(unit(&["services", "ServiceError"]), "services");
    assert_eq!(
        targets("http::{state::AppState, error::ApiError};"),
        ["http::state", "http::error"]
    );
}
