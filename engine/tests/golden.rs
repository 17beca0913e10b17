//! Parity with llama.cpp, the reference implementation of GGUF, kept
//! without llama.cpp: `scripts/llama-golden.sh` (never run in CI) wrote
//! `tests/golden/*.json` from llama-server on each model file: prompts'
//! token ids, and for each position of a greedy continuation the token
//! and llama.cpp's top-k log-probabilities. Here the same file runs the
//! prompt and that continuation (teacher-forced, one forward pass) and
//! every position is compared:
//!
//! - where llama.cpp's first token leads its second by more than
//!   `MARGIN` nats, it is our first token too;
//! - the differences between our log-probabilities of llama.cpp's top-k
//!   tokens and its own stay under `MEDIAN` at the median and `P90` at
//!   the 90th percentile.
//!
//! The files: the default model, the two real Qwen2.5-Coder models
//! (`scripts/fetch-models.sh qwen2.5-coder-1.5b`, `...-0.5b`), and a small
//! synthetic llama per weight type (`make synthetic`: synor-genmodel, a
//! fixed seed). A golden file whose model is not on this machine is
//! skipped (the real Qwen models are fetched by name, not by default); one
//! whose model differs from the file it was made from (sha256) fails.
//!
//! On the synthetic files llama.cpp's own spread is small (0.0007 median
//! for F32), and every type we read natively sits within 1.25 times it;
//! the two still converted at load (Q2_K, Q3_K to Q8_0) sit at 1.4-1.45
//! times it, as Q4_K, Q5_0 and Q6_K did when they were transcoded, which
//! `SPREAD` now fails.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};

use engine::RequestId;
use engine::executor::LocalExecutor;
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};
use sha2::{Digest, Sha256};

/// Leads under which a different first token is not a disagreement.
const MARGIN: f64 = 0.5;
/// How far our top-k log-probabilities may be from llama.cpp's, over all
/// positions of a file, as multiples of how far llama.cpp is from itself
/// between its two CPU attention paths (the file's `self_spread`, `-fa on`
/// against `-fa off`: on SmolLM2 Q4_1 0.074 median, 0.22 p90, 0.61 max,
/// and two of six greedy continuations part): the median and the 90th
/// percentile within 1.3 times its own, the largest within twice.
const SPREAD: [f64; 3] = [1.3, 1.3, 2.0];
/// The bounds of the files whose weights we convert at load (Q2_K and
/// Q3_K to Q8_0: a finer step, not the file's exact values).
const SPREAD_CONVERTED: [f64; 3] = [1.5, 1.5, 2.0];
const CONVERTED: [&str; 2] = ["parity-q2_k.json", "parity-q3_k.json"];
/// Routed experts: the share of positions (rounded up) whose worst top-k
/// difference the max bound leaves out. Routing is discontinuous: where a
/// token's last chosen expert and the next are within rounding of each
/// other, any two implementations may route apart there, llama.cpp's own
/// two attention paths included (its self-spread max on the MoE files is
/// 0.065 to 0.30 nats, against 0.0135 on the dense Qwen3 one). The median
/// and p90 bounds hold over every position.
const MOE_ROUTING_FLIPS: f64 = 0.01;
/// Spreads under these count as these (a file whose runs agree exactly).
const FLOOR: [f64; 3] = [0.01, 0.03, 0.1];
const BLOCK: usize = 16;

/// The prompts `scripts/llama_golden.py` gives llama.cpp, in its order.
fn prompts() -> Vec<String> {
    let mut log = String::from("A ship's log, one line a day.\n");
    for d in 1..61 {
        log += &format!(
            "Day {d}: wind from the {}, {} knots; {} miles made good; {}.\n",
            ["north", "east", "south", "west"][d % 4],
            (d * 7) % 30 + 5,
            (d * 13) % 90 + 10,
            ["clear", "rain", "fog", "squalls", "overcast"][d % 5],
        );
    }
    log += "Day 61:";
    [
        "The capital of France is",
        "def fibonacci(n):\n",
        "Once upon a time, in a small village by the sea,",
        "List three primary colors:",
        "The quick brown fox",
        "Water boils at a temperature of",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([log])
    .collect()
}

#[derive(serde::Deserialize)]
struct Golden {
    model: String,
    sha256: String,
    self_spread: Spread,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Spread {
    median: f64,
    p90: f64,
    max: f64,
}

#[derive(serde::Deserialize)]
struct Case {
    prompt: Vec<u32>,
    tokens: Vec<Position>,
}

#[derive(serde::Deserialize)]
struct Position {
    id: u32,
    top: Vec<(u32, f64)>,
}

/// What one file's comparison found.
#[derive(Debug, Default)]
struct Found {
    positions: usize,
    /// Positions where llama.cpp's lead is past `MARGIN`, and of those
    /// where our first token is llama.cpp's.
    decided: usize,
    agreed: usize,
    /// Every top-k log-probability's difference.
    diffs: Vec<f64>,
    /// Each compared position's worst difference.
    worst: Vec<f64>,
    failures: Vec<String>,
}

impl Found {
    /// The largest per-position difference once the worst `share` of
    /// positions (rounded up) are left out.
    fn max_but(&mut self, share: f64) -> f64 {
        self.worst.sort_by(f64::total_cmp);
        let skip = (self.worst.len() as f64 * share).ceil() as usize;
        let kept = self.worst.len().saturating_sub(skip);
        self.worst[..kept].last().copied().unwrap_or(0.0)
    }

    /// The `q` quantile of the differences.
    fn quantile(&mut self, q: f64) -> f64 {
        self.diffs.sort_by(f64::total_cmp);
        let i = ((self.diffs.len() as f64 - 1.0) * q).round() as usize;
        self.diffs.get(i).copied().unwrap_or(0.0)
    }
}

fn golden_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    files
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("read the model");
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Log-probabilities of a logits row.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

/// Our logits rows for every continuation position of `case`.
fn rows(ex: &mut LocalExecutor, case: &Case) -> Vec<Vec<f32>> {
    let cont: Vec<u32> = case.tokens.iter().map(|t| t.id).collect();
    let draft = cont[..cont.len() - 1].to_vec();
    let mut tokens = case.prompt.clone();
    tokens.extend_from_slice(&draft);
    let batch = ModelBatch {
        chunks: vec![SeqChunk {
            seq: RequestId(1),
            block_table: (0..tokens.len().div_ceil(BLOCK) as u32).collect(),
            swa_table: Vec::new(),
            tokens,
            start_pos: 0,
            want_logits: true,
            draft,
        }],
    };
    ex.logits(&batch).expect("forward")
}

fn compare(case: &Case, rows: &[Vec<f32>], found: &mut Found) {
    for (j, (pos, row)) in case.tokens.iter().zip(rows).enumerate() {
        // llama-server gave nothing here (a token ending inside a UTF-8
        // character): the position is fed, not compared.
        if pos.top.is_empty() {
            continue;
        }
        let ours = log_softmax(row);
        found.positions += 1;
        let lead = match pos.top.as_slice() {
            [a, b, ..] => a.1 - b.1,
            _ => f64::INFINITY,
        };
        if lead > MARGIN {
            found.decided += 1;
            let mine = (0..ours.len()).max_by(|&a, &b| ours[a].total_cmp(&ours[b]));
            if mine == Some(pos.top[0].0 as usize) {
                found.agreed += 1;
            } else {
                found.failures.push(format!(
                    "position {j}: llama.cpp's first token {} leads by {lead:.3}, ours is {mine:?}",
                    pos.top[0].0
                ));
            }
        }
        let mut here = 0f64;
        for &(id, lp) in &pos.top {
            let d = (ours.get(id as usize).copied().unwrap_or(f64::NEG_INFINITY) - lp).abs();
            here = here.max(d);
            found.diffs.push(if d.is_nan() { f64::INFINITY } else { d });
        }
        found
            .worst
            .push(if here.is_nan() { f64::INFINITY } else { here });
        if std::env::var_os("SYNOR_GOLDEN_VERBOSE").is_some() {
            let (id, lp) = pos.top[0];
            let first = ours[id as usize] - lp;
            eprintln!(
                "  position {j}: lead {lead:.3}, worst top-k difference {here:.4}, first token ours - theirs {first:+.4}"
            );
        }
    }
}

#[test]
fn every_golden_file_matches_llama_cpp() {
    let files = golden_files();
    assert!(!files.is_empty(), "no golden files in tests/golden");
    let mut compared = 0;
    let mut failed = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        let golden: Golden = serde_json::from_str(&text).expect("a golden file");
        let model = common::models_dir().join(&golden.model);
        if !model.exists() {
            eprintln!(
                "{}: skipped, {} is not here",
                file.display(),
                model.display()
            );
            continue;
        }
        assert_eq!(
            sha256(&model),
            golden.sha256,
            "{}: made from another file",
            file.display()
        );
        let loaded = load_gguf(&model, &Default::default()).expect("load");
        let longest = golden
            .cases
            .iter()
            .map(|c| c.prompt.len() + c.tokens.len())
            .max()
            .unwrap_or(0);
        let layout = loaded
            .model
            .config
            .kv_layout(BLOCK, longest.div_ceil(BLOCK) + 1);
        // Our tokenizer gives llama.cpp's ids for the same text.
        for (case, text) in golden.cases.iter().zip(prompts()) {
            let ours = loaded.tokenizer.encode_prompt(&text).expect("encode");
            if ours != case.prompt {
                let at = ours
                    .iter()
                    .zip(&case.prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                failed.push(format!(
                    "{}: {text:.30?} tokenizes to {} ids, llama.cpp's {}; first apart at {at}",
                    file.display(),
                    ours.len(),
                    case.prompt.len()
                ));
            }
        }
        let moe = loaded.model.config.moe.is_some();
        let mut ex = LocalExecutor::new(loaded.model, layout).expect("executor");
        let mut found = Found::default();
        for case in &golden.cases {
            let rows = rows(&mut ex, case);
            compare(case, &rows, &mut found);
        }
        let ours = [
            found.quantile(0.5),
            found.quantile(0.9),
            found.max_but(if moe { MOE_ROUTING_FLIPS } else { 0.0 }),
        ];
        let s = &golden.self_spread;
        let own = [s.median, s.p90, s.max];
        eprintln!(
            "{}: {} positions; first token agrees at {} of {} past a {MARGIN}-nat lead; \
             top-k log-probabilities apart by {:.4} / {:.4} / {:.4} (median / p90 / max{}); \
             llama.cpp from itself {:.4} / {:.4} / {:.4}",
            file.display(),
            found.positions,
            found.agreed,
            found.decided,
            ours[0],
            ours[1],
            ours[2],
            if moe { " of 99% of positions" } else { "" },
            own[0],
            own[1],
            own[2],
        );
        let converted = file
            .file_name()
            .is_some_and(|n| CONVERTED.iter().any(|c| n == *c));
        let spread = if converted { SPREAD_CONVERTED } else { SPREAD };
        for (i, what) in ["median", "p90", "max"].iter().enumerate() {
            let bound = spread[i] * own[i].max(FLOOR[i]);
            if ours[i].is_nan() || ours[i] > bound {
                found.failures.push(format!(
                    "top-k log-probabilities apart by {:.4} ({what}), past {bound:.4}",
                    ours[i]
                ));
            }
        }
        if !found.failures.is_empty() {
            let shown = found.failures.iter().take(20).cloned().collect::<Vec<_>>();
            failed.push(format!("{}:\n{}", file.display(), shown.join("\n")));
        }
        compared += 1;
    }
    assert!(
        compared > 0,
        "no golden file's model is here: run `make models`"
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
