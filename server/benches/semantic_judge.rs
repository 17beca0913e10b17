//! The served model as the semantic cache's judge: how well do the
//! signals verification can read from it separate paraphrases (the same
//! answer) from near misses (another answer) on the fresh sets of issue
//! 48? For every group, the default chat model answers the cached
//! phrasing greedily (`A`); for every question of the traffic (`Q`) it
//! answers too, and it scores `A` as the answer to `Q` in one prefill.
//! Signals, for the traffic the structural verifier lets through:
//! - agree: `cache::agree` on `A` and `Q`'s own answer (what a probe that
//!   generates anyway learns);
//! - score: the mean log-probability of `A`'s tokens after `Q`, less
//!   after the cached phrasing (what a probe that scores in one prefill
//!   would read).
//!
//! Each row is how many of each class a signal accepts at a cut, so one
//! can see at what share of near misses it keeps how many paraphrases.
//! `SEMANTIC_JUDGE_ASK=1` instead asks the model whether each pair over
//! the threshold that passes the structure would get the same answer (its
//! probability of `Yes` against `No`), as the server's judge does
//! (`services::cache_judge`).
//! `SEMANTIC_JUDGE_FROM=file` reads such a run's dump
//! (`SEMANTIC_JUDGE_ASK=1 SEMANTIC_JUDGE_DUMP=file`) and runs the bound's
//! rule over the judge's chance, with the sets' labels as outcomes.
//! `SEMANTIC_JUDGE_DUMP=file` writes every question's signals as JSON
//! lines; `SEMANTIC_JUDGE_MODEL=path` (under the models directory) judges
//! with another model. `cargo bench -p server --bench semantic_judge`

mod sets;

use std::path::PathBuf;
use std::time::Instant;

use engine::{ChatMessage, EmbeddingHandle, EngineConfig, EngineHandle, GenerateRequest};
use engine::{SamplingParams, TokenEvent};
use futures_util::StreamExt;
use server::cache::agree;
use server::cache::semantic::similarity;
use server::cache::verify::{Checks, Facts, NoVectors, verify};
use server::services::cache_judge;
use sets::groups_of;

fn models_dir() -> PathBuf {
    std::env::var_os("SYNOR_MODELS_DIR").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")),
        PathBuf::from,
    )
}

/// The chat prompt's tokens for one user question.
fn prompt(h: &EngineHandle, q: &str) -> Vec<u32> {
    let text = h
        .render_chat(&[ChatMessage::new("user", q)])
        .expect("template");
    h.tokenizer().encode_prompt(&text).expect("tokenize")
}

/// A greedy answer of at most 48 tokens: its text and token ids.
async fn answer(h: EngineHandle, q: String) -> (String, Vec<u32>) {
    let req = GenerateRequest {
        prompt_tokens: prompt(&h, &q),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: 48,
            ..Default::default()
        },
    };
    let mut s = h.validate(req).and_then(|r| h.submit(r)).expect("submit");
    let (mut text, mut ids) = (String::new(), Vec::new());
    while let Some(ev) = s.next().await {
        match ev {
            TokenEvent::Delta {
                text: t, token_ids, ..
            } => {
                text.push_str(&t);
                ids.extend(token_ids);
            }
            TokenEvent::Finished { .. } => break,
            TokenEvent::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    (text, ids)
}

/// Greedy answers to `questions`, 64 at a time (the engine's queue is
/// bounded).
async fn answers(h: &EngineHandle, questions: Vec<String>) -> Vec<(String, Vec<u32>)> {
    let mut out = Vec::with_capacity(questions.len());
    for chunk in questions.chunks(64) {
        let tasks = chunk
            .iter()
            .map(|q| tokio::spawn(answer(h.clone(), q.clone())));
        for r in futures_util::future::join_all(tasks).await {
            out.push(r.expect("task"));
        }
    }
    out
}

/// The mean log-probability of `answer` after question `q`.
async fn score(h: &EngineHandle, q: &str, answer: &[u32]) -> f64 {
    let p = prompt(h, q);
    let n = p.len();
    let mut tokens = p;
    tokens.extend_from_slice(answer);
    let s = h.score(tokens, n).await.expect("score");
    s.iter().map(|t| f64::from(t.logprob)).sum::<f64>() / s.len().max(1) as f64
}

/// `SEMANTIC_JUDGE_ASK`: only ask the model about the questions over the
/// threshold that pass the structure, and report its answers.
async fn ask_set(
    file: &str,
    h: &EngineHandle,
    e: &EmbeddingHandle,
    dump: &mut Vec<String>,
) -> Option<()> {
    let groups = groups_of(file)?;
    let structure = Checks::STRUCTURE;
    let (mut para, mut near) = (Vec::new(), Vec::new());
    let (mut all_para, mut all_near) = (0, 0);
    let t = Instant::now();
    for g in &groups {
        let first = &g.prompts[0];
        let asked = g.prompts[1..].iter().map(|p| (p.as_str(), true));
        let asked = asked.chain(g.near_misses.iter().map(|n| (n.text(), false)));
        for (q, same) in asked {
            match same {
                true => all_para += 1,
                false => all_near += 1,
            }
            let v = e
                .embed_queries(vec![first.clone(), q.to_string()])
                .await
                .expect("embed");
            let (fc, fq) = (Facts::of(first), Facts::of(q));
            if similarity(&v[0], &v[1]) < 0.7 || verify(&fc, &fq, structure, &NoVectors).is_err() {
                continue;
            }
            let p = cache_judge::same_answer(h, first, q).await.expect("judged");
            let topic = verify(&fc, &fq, Checks::ALL, &NoVectors).is_ok();
            let row = serde_json::json!({
                "set": file, "cached": first, "question": q, "same": same, "judge": p, "topic": topic,
            });
            dump.push(row.to_string());
            match same {
                true => para.push((p, topic)),
                false => near.push((p, topic)),
            }
        }
    }
    println!(
        "\n{file}: the model asked about {} pairs in {:.0} s",
        para.len() + near.len(),
        t.elapsed().as_secs_f64()
    );
    // How well it ranks: the chance a paraphrase scores over a near miss
    // (AUC), and what it accepts at the cuts that let 0, 2 (0.5%) and 4
    // near misses through.
    let wins: f64 = para
        .iter()
        .map(|p| {
            near.iter()
                .map(|n| match p.0.total_cmp(&n.0) {
                    std::cmp::Ordering::Greater => 1.0,
                    std::cmp::Ordering::Equal => 0.5,
                    std::cmp::Ordering::Less => 0.0,
                })
                .sum::<f64>()
        })
        .sum();
    let auc = wins / (para.len() * near.len()).max(1) as f64;
    println!("AUC of P(same) between paraphrases and near misses: {auc:.3}");
    let mut scores: Vec<f64> = near.iter().map(|n| n.0).collect();
    scores.sort_by(|a, b| b.total_cmp(a));
    for k in [0usize, 2, 4, 20] {
        // The cut just over the (k+1)-th highest near miss.
        let cut = scores.get(k).map_or(0.0, |s| s + 1e-12);
        let p = para.iter().filter(|x| x.0 >= cut).count();
        let pt = para.iter().filter(|x| x.0 >= cut || x.1).count();
        let nt = near.iter().filter(|x| x.0 >= cut || x.1).count();
        println!(
            "at most {k} near misses ({:.2}%): {:.1}% of paraphrases; or the verifier: {:.1}% / {:.2}%",
            pct(k, all_near),
            pct(p, all_para),
            pct(pt, all_para),
            pct(nt, all_near)
        );
    }
    Some(())
}

/// One question of the traffic with its signals.
#[derive(serde::Serialize)]
struct Judged {
    set: String,
    group: usize,
    question: String,
    kind: Option<String>,
    similarity: f32,
    structure: bool,
    verifier: bool,
    agree: bool,
    score: f64,
}

async fn judge_set(
    file: &str,
    h: &EngineHandle,
    e: &EmbeddingHandle,
    out: &mut Vec<Judged>,
) -> Option<()> {
    let groups = groups_of(file)?;
    let t = Instant::now();
    let cached = answers(h, groups.iter().map(|g| g.prompts[0].clone()).collect()).await;
    let mut asked: Vec<(usize, String, Option<String>)> = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        asked.extend(g.prompts[1..].iter().map(|p| (i, p.clone(), None)));
        asked.extend(
            g.near_misses
                .iter()
                .map(|n| (i, n.text().to_string(), Some(n.kind().to_string()))),
        );
    }
    let fresh = answers(h, asked.iter().map(|a| a.1.clone()).collect()).await;
    println!(
        "{file}: {} answers generated in {:.0} s",
        cached.len() + fresh.len(),
        t.elapsed().as_secs_f64()
    );
    let mut own = Vec::new();
    for (g, (_, ids)) in groups.iter().zip(&cached) {
        own.push(score(h, &g.prompts[0], ids).await);
    }
    let structure = Checks::STRUCTURE;
    for ((g, q, kind), (fresh_text, _)) in asked.into_iter().zip(fresh) {
        let (cached_text, ids) = &cached[g];
        let first = &groups[g].prompts[0];
        let v = e
            .embed_queries(vec![
                first.clone(),
                q.clone(),
                agree::compared(cached_text).to_string(),
                agree::compared(&fresh_text).to_string(),
            ])
            .await
            .expect("embed");
        let (fc, fq) = (Facts::of(first), Facts::of(&q));
        out.push(Judged {
            set: file.to_string(),
            group: g,
            kind,
            similarity: similarity(&v[0], &v[1]),
            structure: verify(&fc, &fq, structure, &NoVectors).is_ok(),
            verifier: verify(&fc, &fq, Checks::ALL, &NoVectors).is_ok(),
            agree: agree::agree(cached_text, &fresh_text, &v[2], &v[3]),
            score: score(h, &q, ids).await - own[g],
            question: q,
        });
    }
    Some(())
}

fn pct(k: usize, of: usize) -> f64 {
    100.0 * k as f64 / of.max(1) as f64
}

/// How many paraphrases and near misses (of those over the threshold
/// that pass the structure) a signal accepts.
fn report(set: &str, rows: &[&Judged]) {
    let over: Vec<&&Judged> = rows
        .iter()
        .filter(|r| r.similarity >= 0.7 && r.structure)
        .collect();
    let para: Vec<_> = over.iter().filter(|r| r.kind.is_none()).collect();
    let near: Vec<_> = over.iter().filter(|r| r.kind.is_some()).collect();
    let (all_para, all_near) = (
        rows.iter().filter(|r| r.kind.is_none()).count(),
        rows.len() - rows.iter().filter(|r| r.kind.is_none()).count(),
    );
    println!(
        "\n{set}: of {all_para} paraphrases and {all_near} near misses, {} and {} are over 0.70 and pass the structure",
        para.len(),
        near.len()
    );
    println!("| signal | paraphrases accepted (of all) | near misses accepted (of all) |");
    println!("|---|---|---|");
    let row = |label: &str, accept: &dyn Fn(&Judged) -> bool| {
        let p = para.iter().filter(|r| accept(r)).count();
        let n = near.iter().filter(|r| accept(r)).count();
        println!(
            "| {label} | {:.1}% ({p}) | {:.2}% ({n}) |",
            pct(p, all_para),
            pct(n, all_near)
        );
    };
    row("structure only", &|_| true);
    row("the verifier (topic words)", &|r| r.verifier);
    row("answers agree (a generating probe)", &|r| r.agree);
    for cut in [-0.1, -0.2, -0.3, -0.5, -0.75, -1.0] {
        row(
            &format!("score of the cached answer >= {cut} nats/token"),
            &|r| r.score >= cut,
        );
    }
    row("verifier and answers agree", &|r| r.verifier && r.agree);
    row("verifier and score >= -0.3", &|r| {
        r.verifier && r.score >= -0.3
    });
}

/// One judged pair as `SEMANTIC_JUDGE_DUMP` writes it in ask mode.
#[derive(serde::Deserialize)]
struct Asked {
    set: String,
    same: bool,
    judge: f64,
}

/// The bound's rule (`cache::learned`) with the judge's chance as its
/// feature instead of the similarity, the sets' labels as the probes'
/// outcomes: 8 seeded passes over each set's judged pairs, per delta.
/// Paraphrases and near misses served are shares of the whole set's.
fn bound_over_judge(rows: &[Asked]) {
    use server::cache::learned::{Decision, Observations, POOL_OUTCOMES, decide};
    println!("\nthe bound over the judge's chance (the sets' labels as outcomes)");
    println!("| set | delta | pass 1 | pass 2 | pass 4 | pass 8 |");
    println!("|---|---|---|---|---|---|");
    let sets = [
        ("semantic-fresh-tune.jsonl", 210, 402),
        ("semantic-fresh-heldout.jsonl", 210, 380),
    ];
    for delta in [0.01, 0.05, 0.1] {
        for (set, para, near) in sets {
            let pairs: Vec<&Asked> = rows.iter().filter(|r| r.set == set).collect();
            let (none, mut pool) = (
                Observations::default(),
                Observations::keeping(POOL_OUTCOMES),
            );
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let mut cells = Vec::new();
            for pass in 1..=8 {
                let mut order: Vec<usize> = (0..pairs.len()).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, ((next() * (i + 1) as f64) as usize).min(i));
                }
                let (mut right, mut wrong) = (0, 0);
                for i in order {
                    let r = pairs[i];
                    match decide(&none, &pool, r.judge as f32, delta, next()) {
                        Decision::Serve if r.same => right += 1,
                        Decision::Serve => wrong += 1,
                        Decision::Verify(_) => pool.add(r.judge as f32, r.same),
                    }
                }
                if [1, 2, 4, 8].contains(&pass) {
                    cells.push(format!(
                        "{:.1}% / {:.2}%",
                        pct(right, para),
                        pct(wrong, near)
                    ));
                }
            }
            println!("| {set} | {delta} | {} |", cells.join(" | "));
        }
    }
}

fn main() {
    if let Some(path) = std::env::var_os("SEMANTIC_JUDGE_FROM") {
        let text = std::fs::read_to_string(path).expect("a dump");
        let rows: Vec<Asked> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("a judged pair"))
            .collect();
        bound_over_judge(&rows);
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = models_dir();
    let e = EmbeddingHandle::start(&dir.join("all-minilm-l6-v2")).expect("embedder");
    let model = std::env::var("SEMANTIC_JUDGE_MODEL")
        .unwrap_or_else(|_| "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    println!("the judge: {model}");
    let h = EngineHandle::start_gguf(
        &dir.join(model),
        &Default::default(),
        EngineConfig::default(),
    )
    .expect("the default chat model");
    let mut out = Vec::new();
    let t = Instant::now();
    if std::env::var_os("SEMANTIC_JUDGE_ASK").is_some() {
        let mut dump = Vec::new();
        for file in ["semantic-fresh-tune.jsonl", "semantic-fresh-heldout.jsonl"] {
            rt.block_on(ask_set(file, &h, &e, &mut dump));
        }
        if let Some(path) = std::env::var_os("SEMANTIC_JUDGE_DUMP") {
            std::fs::write(path, dump.join("\n") + "\n").expect("dump");
        }
        println!("(ran in {:.0} s)", t.elapsed().as_secs_f64());
        h.shutdown();
        return;
    }
    for file in ["semantic-fresh-tune.jsonl", "semantic-fresh-heldout.jsonl"] {
        if rt.block_on(judge_set(file, &h, &e, &mut out)).is_none() {
            println!("{file} missing");
        }
    }
    for set in ["semantic-fresh-tune.jsonl", "semantic-fresh-heldout.jsonl"] {
        let rows: Vec<&Judged> = out.iter().filter(|r| r.set == set).collect();
        report(set, &rows);
    }
    if let Some(path) = std::env::var_os("SEMANTIC_JUDGE_DUMP") {
        let lines: Vec<String> = out
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect();
        std::fs::write(path, lines.join("\n") + "\n").expect("dump");
    }
    println!("(ran in {:.0} s)", t.elapsed().as_secs_f64());
    h.shutdown();
}
