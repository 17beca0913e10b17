//! Chooses the semantic cache's threshold: embeds the paraphrase set
//! (`loadtest/data/paraphrase-eval.jsonl`: 120 groups of four phrasings,
//! 480 near misses) with the default embedding model, caches each group's
//! first phrasing in one index, and asks with the other three phrasings
//! (should hit their own group) and with the near misses (should hit
//! nothing), at several thresholds, with and without the key-term guard.
//! Then the held-out set, never tuned on: fow-cache's 600 labelled pairs
//! (`scripts/fetch-models.sh eval`), each pair's first question cached and
//! its second asked: the same-answer pairs should hit, the near misses
//! (negation, swapped entities, other numbers or dates, other scope)
//! should not.
//!
//! `cargo bench -p server --bench semantic`

use std::path::PathBuf;
use std::time::Instant;

use engine::EmbeddingHandle;
use server::cache::semantic::{
    IndexKey, Limits, SemanticIndex, key_terms, ordered_terms, question_kind, similarity,
    topic_drift,
};

/// One labelled pair of the held-out set.
#[derive(serde::Deserialize)]
struct Pair {
    category: String,
    a: String,
    b: String,
    same_answer: bool,
}

#[derive(serde::Deserialize)]
struct Group {
    group: String,
    prompts: Vec<String>,
    near_misses: Vec<String>,
}

fn models_dir() -> PathBuf {
    std::env::var_os("SYNOR_MODELS_DIR").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")),
        PathBuf::from,
    )
}

/// Best match of `v` among `cached` over `threshold` (guarded or not).
fn best(
    cached: &[(Vec<f32>, String, usize)],
    v: &[f32],
    text: &str,
    threshold: f32,
    guard: usize,
) -> Option<usize> {
    let terms = key_terms(text);
    let strict = |t: &str| {
        ordered_terms(t) == ordered_terms(text) && question_kind(t) == question_kind(text)
    };
    let ok = |t: &str| match guard {
        0 => true,
        1 => key_terms(t) == terms,
        2..=4 => key_terms(t) == terms && topic_drift(t, text) <= guard - 2,
        5 => strict(t),
        d => strict(t) && topic_drift(t, text) <= d - 6,
    };
    cached
        .iter()
        .map(|(c, t, g)| (similarity(c, v), t, *g))
        .filter(|(s, t, _)| *s >= threshold && ok(t))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, _, g)| g)
}

const GUARDS: [&str; 9] = [
    "off",
    "terms",
    "terms+drift0",
    "terms+drift1",
    "terms+drift2",
    "strict",
    "strict+drift0",
    "strict+drift1",
    "strict+drift2",
];

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../loadtest/data/paraphrase-eval.jsonl"
    );
    let groups: Vec<Group> = std::fs::read_to_string(path)
        .expect("paraphrase set")
        .lines()
        .map(|l| serde_json::from_str(l).expect("row"))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let embedder = EmbeddingHandle::start(&models_dir().join("all-minilm-l6-v2")).expect("model");
    // As the cache does: every vector from the int8 query encoder.
    let embed = |texts: Vec<String>| -> Vec<Vec<f32>> {
        texts
            .iter()
            .map(|t| rt.block_on(embedder.embed_query(t)).expect("embed"))
            .collect()
    };
    let t = Instant::now();
    let firsts: Vec<String> = groups.iter().map(|g| g.prompts[0].clone()).collect();
    let cached: Vec<(Vec<f32>, String, usize)> = embed(firsts.clone())
        .into_iter()
        .zip(firsts)
        .enumerate()
        .map(|(i, (v, t))| (v, t, i))
        .collect();
    let para: Vec<(String, usize)> = groups
        .iter()
        .enumerate()
        .flat_map(|(i, g)| g.prompts[1..].iter().map(move |p| (p.clone(), i)))
        .collect();
    let near: Vec<String> = groups.iter().flat_map(|g| g.near_misses.clone()).collect();
    let para_v = embed(para.iter().map(|p| p.0.clone()).collect());
    let near_v = embed(near.clone());
    let n = cached.len() + para.len() + near.len();
    println!(
        "{} groups, {} paraphrase queries, {} near misses; embedded {n} texts in {:.2} s",
        groups.len(),
        para.len(),
        near.len(),
        t.elapsed().as_secs_f64()
    );
    println!("| threshold | guard | paraphrase hits | wrong-group hits | near-miss false hits |");
    println!("|---|---|---|---|---|");
    for guard in [0usize, 1, 2, 5, 6] {
        for threshold in [0.70f32, 0.80, 0.85, 0.90, 0.92, 0.93, 0.94, 0.95, 0.97] {
            let (mut right, mut wrong) = (0, 0);
            for ((text, g), v) in para.iter().zip(&para_v) {
                match best(&cached, v, text, threshold, guard) {
                    Some(h) if h == *g => right += 1,
                    Some(_) => wrong += 1,
                    None => {}
                }
            }
            let false_hits = near
                .iter()
                .zip(&near_v)
                .filter(|(t, v)| best(&cached, v, t, threshold, guard).is_some())
                .count();
            let pct = |k: usize, of: usize| 100.0 * k as f64 / of as f64;
            println!(
                "| {threshold:.2} | {} | {:.1}% | {:.1}% | {:.1}% |",
                GUARDS[guard],
                pct(right, para.len()),
                pct(wrong, para.len()),
                pct(false_hits, near.len())
            );
        }
    }
    if std::env::var_os("SEMANTIC_SHOW").is_some() {
        for (t, v) in near.iter().zip(&near_v) {
            if let Some(g) = best(&cached, v, t, 0.85, 5) {
                println!("false hit: {t:?} -> {:?}", cached[g].1);
            }
        }
    }
    held_out(&embed);
    // The index itself, as the server uses it: one lookup among 120.
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
    for (v, t, g) in &cached {
        index.insert(ik.clone(), v.clone(), t, groups[*g].group.clone(), now);
    }
    let t = Instant::now();
    let mut hits = 0;
    for ((text, _), v) in para.iter().zip(&para_v) {
        hits += usize::from(index.lookup(&ik, v, text, 0.85, now).is_some());
    }
    println!(
        "index lookups: {:.1} us each over {} entries ({hits} hits at 0.85)",
        t.elapsed().as_secs_f64() * 1e6 / para.len() as f64,
        index.len()
    );
    let t = Instant::now();
    let reps = 20;
    for _ in 0..reps {
        rt.block_on(embedder.embed_query("What is the capital of France?"))
            .expect("embed");
    }
    println!(
        "one short query embedded in {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3 / reps as f64
    );
}

/// The held-out pairs' hit rates (same answer) and false-hit rates (near
/// misses, also per category at each guard's best row).
fn held_out(embed: &dyn Fn(Vec<String>) -> Vec<Vec<f32>>) {
    let path = models_dir().join("eval/fow-cache-pairs.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!(
            "held-out set: {} missing (scripts/fetch-models.sh eval)",
            path.display()
        );
        return;
    };
    let pairs: Vec<Pair> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("pair"))
        .collect();
    let va = embed(pairs.iter().map(|p| p.a.clone()).collect());
    let vb = embed(pairs.iter().map(|p| p.b.clone()).collect());
    let same = pairs.iter().filter(|p| p.same_answer).count();
    println!(
        "held-out (fow-cache, never tuned on): {same} same-answer pairs, {} near misses",
        pairs.len() - same
    );
    println!("| threshold | guard | same-answer hits | near-miss false hits | by category |");
    println!("|---|---|---|---|---|");
    for guard in [0usize, 1, 5, 6] {
        for threshold in [0.70f32, 0.80, 0.85, 0.90, 0.95] {
            let hit: Vec<bool> = pairs
                .iter()
                .zip(&va)
                .zip(&vb)
                .map(|((p, a), b)| {
                    let cached = [(a.clone(), p.a.clone(), 0)];
                    best(&cached, b, &p.b, threshold, guard).is_some()
                })
                .collect();
            let mut by: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
            let (mut hits, mut false_hits) = (0, 0);
            for (p, &h) in pairs.iter().zip(&hit) {
                let e = by.entry(p.category.as_str()).or_default();
                e.0 += usize::from(h);
                e.1 += 1;
                if p.same_answer {
                    hits += usize::from(h);
                } else {
                    false_hits += usize::from(h);
                }
            }
            let cats: Vec<String> = by
                .iter()
                .map(|(c, (h, n))| format!("{c} {:.0}%", 100.0 * *h as f64 / *n as f64))
                .collect();
            println!(
                "| {threshold:.2} | {} | {:.1}% | {:.1}% | {} |",
                GUARDS[guard],
                100.0 * hits as f64 / same as f64,
                100.0 * false_hits as f64 / (pairs.len() - same) as f64,
                cats.join(", ")
            );
        }
    }
}
