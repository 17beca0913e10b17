//! Teacher-forced comparison of two KV cache dtypes on one model and one
//! text (llama.cpp's `perplexity --kl-divergence` measures): the text runs
//! through two executors in lockstep, chunk by chunk with logits for every
//! position, and each position's next-token distributions are compared.
//! Shared by `tests/kv_dtype.rs` and `benches/kv_cache.rs`.

use std::path::Path;

use engine::RequestId;
use engine::executor::LocalExecutor;
use engine::kv_cache::KvDtype;
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};

/// Positions per KV block.
const BLOCK: usize = 16;

/// What the second dtype changed, over every predicted token of the text.
#[derive(Debug, Default)]
pub struct KvCompare {
    /// Tokens predicted (the text's length less one).
    pub tokens: usize,
    /// Mean negative log-likelihood of the text's next tokens, per dtype.
    pub nll: [f64; 2],
    /// Mean KL divergence of the second dtype's next-token distribution
    /// from the first's, in nats.
    pub kl: f64,
    /// Largest KL divergence at one position.
    pub kl_max: f64,
    /// Positions where both pick the same most likely token.
    pub same_top1: usize,
}

impl KvCompare {
    pub fn perplexity(&self, i: usize) -> f64 {
        self.nll[i].exp()
    }

    pub fn same_top1_share(&self) -> f64 {
        self.same_top1 as f64 / self.tokens.max(1) as f64
    }
}

/// An executor for `model` with room for `positions` of one sequence.
fn executor(model: &Path, positions: usize, dtype: KvDtype) -> LocalExecutor {
    let loaded = load_gguf(model, &Default::default()).expect("load the model");
    let layout = engine::kv_cache::KvLayout {
        dtype,
        ..loaded
            .model
            .config
            .kv_layout(BLOCK, positions.div_ceil(BLOCK) + 1)
    };
    LocalExecutor::new(loaded.model, layout).expect("executor")
}

/// Log-softmax of one logits row, in f64.
fn log_probs(l: &[f32]) -> Vec<f64> {
    let max = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let z: f64 = l.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lz = max + z.ln();
    l.iter().map(|&v| v as f64 - lz).collect()
}

fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b })
}

/// Runs `text` (at most `max_tokens` of it) through `model` with each of
/// `dtypes`, `chunk` tokens per forward pass, and compares.
pub fn compare(
    model: &Path,
    text: &str,
    max_tokens: usize,
    chunk: usize,
    dtypes: [KvDtype; 2],
) -> KvCompare {
    let tokenizer = load_gguf(model, &Default::default())
        .expect("load the model")
        .tokenizer;
    let mut ids = tokenizer.encode_prompt(text).expect("tokenize");
    ids.truncate(max_tokens);
    let n = ids.len();
    assert!(n > 1, "the text is too short");
    let mut execs = dtypes.map(|d| executor(model, n, d));
    let table: Vec<u32> = (0..n.div_ceil(BLOCK) as u32 + 1).collect();
    let mut out = KvCompare::default();
    for start in (0..n).step_by(chunk) {
        let tokens = ids[start..(start + chunk).min(n)].to_vec();
        let batch = ModelBatch {
            chunks: vec![SeqChunk {
                seq: RequestId(1),
                start_pos: start,
                want_logits: true,
                block_table: table.clone(),
                swa_table: Vec::new(),
                // Drafting every token after the first asks for the logits
                // of every position.
                draft: tokens[1..].to_vec(),
                tokens,
            }],
        };
        let [a, b] = [0, 1].map(|i| execs[i].logits(&batch).expect("forward"));
        for (i, (la, lb)) in a.iter().zip(&b).enumerate() {
            let Some(&next) = ids.get(start + i + 1) else {
                break;
            };
            let (pa, pb) = (log_probs(la), log_probs(lb));
            out.tokens += 1;
            out.nll[0] -= pa[next as usize];
            out.nll[1] -= pb[next as usize];
            let kl: f64 = pa.iter().zip(&pb).map(|(x, y)| x.exp() * (x - y)).sum();
            out.kl += kl;
            out.kl_max = out.kl_max.max(kl);
            out.same_top1 += usize::from(argmax(la) == argmax(lb));
        }
    }
    let t = out.tokens.max(1) as f64;
    out.nll = out.nll.map(|x| x / t);
    out.kl /= t;
    out
}
