//! Embedding latency and throughput through `EmbeddingHandle` (the API's
//! path): one short query on the int8 query encoder, and batches of short,
//! mixed and long texts on the f32 model. Run with
//! `cargo bench -p engine --bench embed` (models fetched by `make models`).

use std::time::Instant;

use engine::EmbeddingHandle;

fn models_dir() -> std::path::PathBuf {
    std::env::var_os("SYNOR_MODELS_DIR")
        .map(Into::into)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../models").into())
}

/// Deterministic text of about `words` words.
fn text(seed: usize, words: usize) -> String {
    const VOCAB: [&str; 16] = [
        "the", "harbour", "boats", "weather", "capital", "France", "convert", "degrees",
        "question", "small", "river", "market", "prices", "engine", "quietly", "morning",
    ];
    (0..words)
        .map(|i| VOCAB[(seed * 7 + i * 13) % VOCAB.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A batch: its name, its texts, words of text `i`, repetitions.
type Case<'a> = (&'a str, usize, &'a dyn Fn(usize) -> usize, usize);

fn main() {
    let dir = models_dir().join("all-minilm-l6-v2");
    let h = EmbeddingHandle::start(&dir).expect("load all-MiniLM-L6-v2");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let query = "Which city is the capital of France?";
    let reps = 200;
    rt.block_on(h.embed_query(query)).expect("warm");
    let t = Instant::now();
    for _ in 0..reps {
        rt.block_on(h.embed_query(query)).expect("query");
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
    println!(
        "{:34} {ms:8.2} ms per call",
        "query (int8), 1 short question"
    );
    let cases: [Case; 4] = [
        ("1 short text", 1, &|_| 10, 100),
        ("32 short texts (~10 words)", 32, &|_| 10, 20),
        (
            "32 mixed texts (5-120 words)",
            32,
            &|i| 5 + (i * 37) % 116,
            10,
        ),
        ("8 long texts (~250 words)", 8, &|_| 250, 10),
    ];
    for (name, n, words, reps) in cases {
        let texts: Vec<String> = (0..n).map(|i| text(i, words(i))).collect();
        let warm = rt.block_on(h.embed(texts.clone())).expect("warm");
        let t = Instant::now();
        for _ in 0..reps {
            rt.block_on(h.embed(texts.clone())).expect("embed");
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{name:34} {:8.2} ms per call, {:7.0} texts/s, {:7.0} tokens/s",
            s * 1e3,
            n as f64 / s,
            warm.prompt_tokens as f64 / s
        );
    }
}
