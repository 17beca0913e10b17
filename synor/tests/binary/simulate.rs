//! `synor simulate` as a user runs it: the small fleet over a generated
//! workload writes its report (JSON, summary, charts) and prints the
//! summary; a trace it wrote replays to the same totals; bad input is a
//! clear error, not a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_synor"))
        .arg("simulate")
        .args(args)
        .current_dir(root())
        .output()
        .expect("run synor simulate")
}

fn tmp() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "synor-sim-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&d).expect("tmp");
    d
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn totals(dir: &Path) -> Vec<(String, u64, i64)> {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v.as_array()
        .expect("one report per policy")
        .iter()
        .map(|r| {
            (
                r["policy"].as_str().expect("policy").to_string(),
                r["served"].as_u64().expect("served"),
                r["money"]["users_paid_ticks"].as_i64().expect("ticks"),
            )
        })
        .collect()
}

#[test]
fn a_small_fleet_writes_its_report_and_a_written_trace_replays_to_the_same_totals() {
    let (out, trace) = (tmp(), tmp().join("trace.jsonl"));
    let o = simulate(&[
        "--fleet",
        "sim/fleets/small.toml",
        "--workload",
        "sim/fleets/day.toml",
        "--requests",
        "2000",
        "--policy",
        "measured,least-loaded",
        "--report",
        out.to_str().expect("utf-8"),
        "--write-trace",
        trace.to_str().expect("utf-8"),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("measured") && stdout.contains("cloud baseline"),
        "{stdout}"
    );
    for f in [
        "summary.txt",
        "utilization-measured.svg",
        "utilization-least-loaded.svg",
        "policies.svg",
    ] {
        let text = std::fs::read_to_string(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(!text.is_empty(), "{f}");
        if f.ends_with(".svg") {
            assert!(
                text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
                "{f}"
            );
        }
    }
    let first = totals(&out);
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|t| t.1 == 2000 && t.2 > 0), "{first:?}");
    // The trace it wrote, replayed with the same seed, gives the same run.
    let again = tmp();
    let o = simulate(&[
        "--fleet",
        "sim/fleets/small.toml",
        "--workload",
        trace.to_str().expect("utf-8"),
        "--policy",
        "measured,least-loaded",
        "--report",
        again.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(totals(&again), first);
    for d in [out, again, trace.parent().expect("dir").to_path_buf()] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--fleet",
                "no/such.toml",
                "--workload",
                "sim/fleets/day.toml",
            ],
            "no/such.toml",
        ),
        (
            &[
                "--fleet",
                "sim/fleets/small.toml",
                "--workload",
                "sim/fleets/day.toml",
                "--policy",
                "fastest",
            ],
            "no placement policy fastest",
        ),
        (
            &[
                "--fleet",
                "sim/fleets/day.toml",
                "--workload",
                "sim/fleets/day.toml",
            ],
            "sim/fleets/day.toml",
        ),
        (
            &[
                "--fleet",
                "sim/fleets/small.toml",
                "--workload",
                "Cargo.toml",
            ],
            "Cargo.toml",
        ),
    ];
    for (args, says) in cases {
        let o = simulate(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
