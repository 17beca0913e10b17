//! Measures the semantic cache on labelled paraphrases and near misses,
//! with the default embedding model's int8 query encoder as the server
//! runs it. Sets (`loadtest/data/`):
//! - `semantic-tune.jsonl`: written for issue 18; the verifier's word
//!   lists and the threshold were tuned on it;
//! - `semantic-heldout.jsonl`: written at the same time by someone else,
//!   never read while tuning;
//! - `paraphrase-eval.jsonl`: the first set (templated; tuned on before);
//! - fow-cache's 600 labelled pairs (`scripts/fetch-models.sh eval`),
//!   never tuned on.
//!
//! In a group set, every group's first phrasing is cached in one index;
//! the other phrasings should hit their own group, the near misses
//! nothing. In the pair set, each pair's first question is cached alone
//! and the second asked. Each row is a first-stage threshold with the
//! verifier off, with one half of it (structure: numbers, names, units and
//! direction, negation, opposites, kind, language; topic words), and
//! whole. Last, the lookup's latency through `SemanticIndex` itself.
//!
//! `cargo bench -p server --bench semantic [-- curve]`

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use engine::EmbeddingHandle;
use server::cache::semantic::{IndexKey, Limits, Policy, SemanticIndex, similarity};
use server::cache::verify::{ALIGN, Checks, Facts, verify};

type Words = std::collections::HashMap<String, Vec<f32>>;

/// One labelled pair of fow-cache's set.
#[derive(serde::Deserialize)]
struct Pair {
    category: String,
    a: String,
    b: String,
    same_answer: bool,
}

/// A near miss, tagged with its kind or not (the first set).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Near {
    Tagged { text: String, kind: String },
    Plain(String),
}

#[derive(serde::Deserialize)]
struct Group {
    prompts: Vec<String>,
    near_misses: Vec<Near>,
}

/// A prompt read for the cache: its text's facts and its vector.
struct Item {
    facts: Facts,
    vector: Vec<f32>,
}

fn models_dir() -> PathBuf {
    std::env::var_os("SYNOR_MODELS_DIR").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")),
        PathBuf::from,
    )
}

const fn checks(topic: bool, align: f32, align_any: f32) -> Option<Checks> {
    Some(Checks {
        structure: true,
        topic,
        align,
        align_any,
    })
}

const CONFIGS: [(&str, Option<Checks>); 5] = [
    ("off", None),
    ("structure", checks(false, 2.0, 2.0)),
    (SERVER, checks(true, 2.0, 2.0)),
    ("verifier+align0.6", checks(true, ALIGN, ALIGN + 0.1)),
    ("verifier+align0.8", checks(true, 0.8, 0.9)),
];

/// The server's default: every check, topic words by stem.
const SERVER: &str = "verifier (server)";

/// As the index does: the closest few over `threshold`, verified in order.
fn best(
    cached: &[Item],
    q: &Item,
    threshold: f32,
    checks: Option<Checks>,
    words: &Words,
) -> Option<usize> {
    let mut near: Vec<(f32, usize)> = cached
        .iter()
        .enumerate()
        .map(|(i, c)| (similarity(&c.vector, &q.vector), i))
        .filter(|(s, _)| *s >= threshold)
        .collect();
    near.sort_by(|a, b| b.0.total_cmp(&a.0));
    near.into_iter()
        .take(8)
        .map(|n| n.1)
        .find(|&i| checks.is_none_or(|c| verify(&cached[i].facts, &q.facts, c, words).is_ok()))
}

struct Embedder<'a> {
    rt: &'a tokio::runtime::Runtime,
    handle: &'a EmbeddingHandle,
    words: std::cell::RefCell<Words>,
}

impl Embedder<'_> {
    /// The texts' facts and vectors, and their topic words' vectors.
    fn items(&self, texts: &[String]) -> Vec<Item> {
        let items: Vec<Item> = texts
            .iter()
            .map(|t| Item {
                facts: Facts::of(t),
                vector: self.rt.block_on(self.handle.embed_query(t)).expect("embed"),
            })
            .collect();
        let mut words = self.words.borrow_mut();
        let new: Vec<String> = items
            .iter()
            .flat_map(|i| i.facts.topic_words())
            .filter(|w| !words.contains_key(*w))
            .map(str::to_string)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let vectors = self
            .rt
            .block_on(self.handle.embed_queries(new.clone()))
            .expect("embed words");
        words.extend(new.into_iter().zip(vectors));
        items
    }
}

const THRESHOLDS: [f32; 7] = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9];

/// The threshold whose misses and false hits `SEMANTIC_SHOW` prints.
const SHOW_AT: f32 = 0.7;

fn pct(k: usize, of: usize) -> f64 {
    100.0 * k as f64 / of.max(1) as f64
}

/// A group set's table: paraphrase hits (own group), wrong-group hits,
/// near-miss false hits (all, and by kind).
fn group_set(name: &str, file: &str, e: &Embedder, show: bool) {
    let path = format!("{}/../loadtest/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!("{name}: {path} missing");
        return;
    };
    let groups: Vec<Group> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("group"))
        .collect();
    let firsts: Vec<String> = groups.iter().map(|g| g.prompts[0].clone()).collect();
    let cached = e.items(&firsts);
    let para: Vec<(String, usize)> = groups
        .iter()
        .enumerate()
        .flat_map(|(i, g)| g.prompts[1..].iter().map(move |p| (p.clone(), i)))
        .collect();
    let near: Vec<(String, String)> = groups
        .iter()
        .flat_map(|g| {
            g.near_misses.iter().map(|n| match n {
                Near::Tagged { text, kind } => (text.clone(), kind.clone()),
                Near::Plain(t) => (t.clone(), "-".to_string()),
            })
        })
        .collect();
    let para_items = e.items(&para.iter().map(|p| p.0.clone()).collect::<Vec<_>>());
    let near_items = e.items(&near.iter().map(|p| p.0.clone()).collect::<Vec<_>>());
    let words = e.words.borrow();
    println!(
        "\n{name} ({file}): {} groups cached, {} paraphrases, {} near misses",
        groups.len(),
        para.len(),
        near.len()
    );
    println!(
        "| threshold | check | paraphrase hits | wrong-group hits | near-miss false hits | false hits by kind |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, checks) in CONFIGS {
        for t in THRESHOLDS {
            let (mut right, mut wrong) = (0, 0);
            for ((text, g), q) in para.iter().zip(&para_items) {
                match best(&cached, q, t, checks, &words) {
                    Some(h) if h == *g => right += 1,
                    Some(h) => {
                        wrong += 1;
                        if show && label == SERVER && t == SHOW_AT {
                            println!("  wrong group: {text:?} -> {:?}", firsts[h]);
                        }
                    }
                    None => {
                        if show && label == SERVER && t == SHOW_AT {
                            let own = &cached[*g];
                            let s = similarity(&own.vector, &q.vector);
                            let r = verify(&own.facts, &q.facts, Checks::ALL, &*words).err();
                            println!("  missed ({s:.2}, {r:?}): {text:?} / {:?}", firsts[*g]);
                        }
                    }
                }
            }
            let mut by: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
            let mut false_hits = 0;
            for ((text, kind), q) in near.iter().zip(&near_items) {
                let hit = best(&cached, q, t, checks, &words);
                let k = by.entry(kind.as_str()).or_default();
                k.1 += 1;
                if let Some(h) = hit {
                    k.0 += 1;
                    false_hits += 1;
                    if show && label == SERVER && t == SHOW_AT {
                        println!("  FALSE HIT [{kind}]: {text:?} -> {:?}", firsts[h]);
                    }
                }
            }
            let kinds: Vec<String> = by
                .iter()
                .filter(|(k, _)| **k != "-")
                .map(|(k, (h, n))| format!("{k} {h}/{n}"))
                .collect();
            println!(
                "| {t:.2} | {label} | {:.1}% | {:.1}% | {:.1}% ({false_hits}) | {} |",
                pct(right, para.len()),
                pct(wrong, para.len()),
                pct(false_hits, near.len()),
                kinds.join(", ")
            );
        }
    }
}

/// fow-cache's pairs: same-answer hits and near-miss false hits.
fn pair_set(e: &Embedder) {
    let path = models_dir().join("eval/fow-cache-pairs.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!(
            "held-out pairs: {} missing (scripts/fetch-models.sh eval)",
            path.display()
        );
        return;
    };
    let pairs: Vec<Pair> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("pair"))
        .collect();
    let a = e.items(&pairs.iter().map(|p| p.a.clone()).collect::<Vec<_>>());
    let b = e.items(&pairs.iter().map(|p| p.b.clone()).collect::<Vec<_>>());
    let same = pairs.iter().filter(|p| p.same_answer).count();
    let words = e.words.borrow();
    println!(
        "\nfow-cache pairs (never tuned on): {same} same-answer pairs, {} near misses",
        pairs.len() - same
    );
    println!("| threshold | check | same-answer hits | near-miss false hits | by category |");
    println!("|---|---|---|---|---|");
    for (label, checks) in CONFIGS {
        for t in THRESHOLDS {
            let mut by: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
            let (mut hits, mut false_hits) = (0, 0);
            for ((p, x), y) in pairs.iter().zip(&a).zip(&b) {
                let h = best(std::slice::from_ref(x), y, t, checks, &words).is_some();
                let c = by.entry(p.category.as_str()).or_default();
                c.0 += usize::from(h);
                c.1 += 1;
                match p.same_answer {
                    true => hits += usize::from(h),
                    false => false_hits += usize::from(h),
                }
            }
            let cats: Vec<String> = by
                .iter()
                .map(|(c, (h, n))| format!("{c} {:.0}%", pct(*h, *n)))
                .collect();
            println!(
                "| {t:.2} | {label} | {:.1}% | {:.1}% | {} |",
                pct(hits, same),
                pct(false_hits, pairs.len() - same),
                cats.join(", ")
            );
        }
    }
}

/// The lookup as the server makes it (embedding, facts, scan, verify),
/// over an index of `n` questions.
fn latency(e: &Embedder) {
    let mut index = SemanticIndex::new(Limits {
        per_index: 10_000,
        total: 10_000,
        ttl: std::time::Duration::from_secs(3600),
    });
    let ik = IndexKey {
        scope: "s".into(),
        model: "m".into(),
        context: "c".into(),
    };
    let now = Instant::now();
    let mut rng = 0x9e37_79b9_u32;
    for i in 0..1000 {
        let v: Vec<f32> = (0..384)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 17;
                rng ^= rng << 5;
                rng as f32 / u32::MAX as f32 - 0.5
            })
            .collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let v = v.iter().map(|x| x / n).collect();
        index.insert(
            ik.clone(),
            v,
            &format!("Question number {i} about France"),
            format!("k{i}"),
            now,
        );
    }
    let policy = Policy {
        threshold: 0.0,
        verify: true,
        align: None,
    };
    for with_words in [false, true] {
        let mut times = Vec::new();
        for q in [
            "What is the capital of France?",
            "Convert 10 miles to km",
            "How do I boil an egg?",
        ] {
            for _ in 0..20 {
                let t = Instant::now();
                let v = e.rt.block_on(e.handle.embed_query(q)).expect("embed");
                if with_words {
                    // With `--semantic-align`: the query's topic words too
                    // (the server keeps the ones it has seen).
                    let words = Facts::of(q).topic_words().map(str::to_string).collect();
                    let _ = e.rt.block_on(e.handle.embed_queries(words));
                }
                let _ = index.lookup(&ik, &v, &Facts::of(q), policy, now);
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        println!(
            "lookup (embed{} + scan of 1000 + verify 8): p50 {:.2} ms, p99 {:.2} ms",
            if with_words {
                " + its topic words, none cached"
            } else {
                ""
            },
            times[times.len() / 2],
            times[times.len() * 99 / 100]
        );
    }
}

fn main() {
    let show = std::env::var_os("SEMANTIC_SHOW").is_some();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let handle = EmbeddingHandle::start(&models_dir().join("all-minilm-l6-v2")).expect("model");
    let e = Embedder {
        rt: &rt,
        handle: &handle,
        words: Default::default(),
    };
    println!();
    let only = std::env::var("SEMANTIC_SETS").unwrap_or_else(|_| "tune,heldout,first,pairs".into());
    let t = Instant::now();
    if only.contains("tune") {
        group_set("tuning set", "semantic-tune.jsonl", &e, show);
    }
    if only.contains("heldout") {
        group_set("held-out set", "semantic-heldout.jsonl", &e, false);
    }
    if only.contains("first") {
        group_set(
            "first set (tuned on before)",
            "paraphrase-eval.jsonl",
            &e,
            false,
        );
    }
    if only.contains("pairs") {
        pair_set(&e);
    }
    latency(&e);
    println!("(ran in {:.1} s)", t.elapsed().as_secs_f64());
}
