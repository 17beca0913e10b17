//! Perplexity on a fixed text the way `llama-perplexity` computes it, to
//! set beside its number on the same file: the text is tokenized whole
//! (BOS first when the model asks for it), cut into chunks of `N_CTX`
//! tokens (each starting with BOS when the model asks for it), every
//! chunk runs alone from position 0, and only the predictions of its
//! second half count. Run with `cargo bench -p engine --bench perplexity`
//! (the default model; `SYNOR_BENCH_MODEL=path.gguf` for another;
//! `SYNOR_PPL_TEXT=file`, default the GPL-3 text Debian ships;
//! `SYNOR_PPL_CHUNKS`, default 8). The llama.cpp side:
//! `llama-perplexity -m FILE -f TEXT -c 512 --chunks 8 -t 2`.

mod common;

use std::path::PathBuf;

use engine::RequestId;
use engine::executor::LocalExecutor;
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};

const N_CTX: usize = 512;
const BLOCK: usize = 16;

fn main() {
    let model = common::model_path();
    let text_path = std::env::var_os("SYNOR_PPL_TEXT").map_or_else(
        || PathBuf::from("/usr/share/common-licenses/GPL-3"),
        PathBuf::from,
    );
    let text = std::fs::read_to_string(&text_path).expect("the text");
    let chunks: usize = std::env::var("SYNOR_PPL_CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let loaded = load_gguf(&model, &Default::default()).expect("load");
    let tokenizer = loaded.tokenizer;
    let ids = tokenizer.encode_prompt(&text).expect("tokenize");
    let bos = tokenizer
        .encode_prompt("")
        .expect("tokenize")
        .first()
        .copied();
    let layout = loaded.model.config.kv_layout(BLOCK, N_CTX / BLOCK + 1);
    let mut ex = LocalExecutor::new(loaded.model, layout).expect("executor");
    let table: Vec<u32> = (0..(N_CTX / BLOCK) as u32 + 1).collect();
    let n = chunks.min(ids.len() / N_CTX);
    let first = N_CTX / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    for c in 0..n {
        let mut tokens = ids[c * N_CTX..(c + 1) * N_CTX].to_vec();
        if let Some(b) = bos {
            tokens[0] = b;
        }
        let batch = ModelBatch {
            chunks: vec![SeqChunk {
                seq: RequestId(1),
                start_pos: 0,
                want_logits: true,
                block_table: table.clone(),
                swa_table: Vec::new(),
                draft: tokens[1..].to_vec(),
                tokens,
            }],
        };
        let rows = ex.logits(&batch).expect("forward");
        for j in first..N_CTX - 1 {
            let next = ids[c * N_CTX + j + 1] as usize;
            nll -= log_prob(&rows[j], next);
            count += 1;
        }
        println!("[{}] {:.4}", c + 1, (nll / count as f64).exp());
    }
    println!(
        "{}: {} tokens, {n} chunks of {N_CTX}: perplexity {:.4}",
        model.display(),
        ids.len(),
        (nll / count.max(1) as f64).exp()
    );
}

fn log_prob(row: &[f32], token: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row[token] as f64 - max - sum.ln()
}
