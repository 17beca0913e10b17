//! The batched forward pass against the single-sequence path: logits of
//! every sequence in a mixed batch (prefill chunks and decode tokens at
//! different positions) match those of the same sequence run alone.

mod common;

use engine::RequestId;
use engine::executor::LocalExecutor;
use engine::loader::load_gguf;
use engine::model::{ModelBatch, SeqChunk};

const BLOCK: usize = 16;

fn chunk(seq: u64, tokens: Vec<u32>, start: usize) -> SeqChunk {
    let first = seq as u32 * 8;
    SeqChunk {
        seq: RequestId(seq),
        tokens,
        start_pos: start,
        want_logits: true,
        block_table: (first..first + 8).collect(),
        swa_table: Vec::new(),
        draft: Vec::new(),
    }
}

fn executor() -> LocalExecutor {
    let loaded =
        load_gguf(&common::model_path(common::SMOLLM2), &Default::default()).expect("load");
    let layout = loaded.model.config.kv_layout(BLOCK, 64);
    LocalExecutor::new(loaded.model, layout).expect("executor")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn batched_logits_match_each_sequence_alone() {
    let prompts: Vec<Vec<u32>> = vec![
        (0..37).map(|i| 100 + i * 3).collect(),
        (0..5).map(|i| 2000 + i).collect(),
        (0..20).map(|i| 500 + i * 7).collect(),
    ];
    // Alone: each prompt in one chunk, then one decode token.
    let mut alone = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        let mut ex = executor();
        let pre = ex
            .logits(&ModelBatch {
                chunks: vec![chunk(s as u64, p.clone(), 0)],
            })
            .expect("prefill");
        let dec = ex
            .logits(&ModelBatch {
                chunks: vec![chunk(s as u64, vec![42], p.len())],
            })
            .expect("decode");
        alone.push((pre[0].clone(), dec[0].clone()));
    }
    // Together: sequence 0 prefilled in two chunks, the others joining
    // mid-way, then all three decoding in one step.
    let mut ex = executor();
    let c = |s: usize, t: Vec<u32>, start: usize| chunk(s as u64, t, start);
    let mut first = c(0, prompts[0][..16].to_vec(), 0);
    first.want_logits = false;
    let step1 = ex
        .logits(&ModelBatch {
            chunks: vec![first, c(1, prompts[1].clone(), 0)],
        })
        .expect("step 1");
    assert_eq!(step1.len(), 1, "a mid-prompt chunk yields no logits");
    assert!(
        max_diff(&step1[0], &alone[1].0) < 1e-4,
        "seq 1 prefill: {}",
        max_diff(&step1[0], &alone[1].0)
    );
    let step2 = ex
        .logits(&ModelBatch {
            chunks: vec![
                c(0, prompts[0][16..].to_vec(), 16),
                c(2, prompts[2].clone(), 0),
            ],
        })
        .expect("step 2");
    let step3 = ex
        .logits(&ModelBatch {
            chunks: (0..3).map(|s| c(s, vec![42], prompts[s].len())).collect(),
        })
        .expect("step 3");
    assert!(
        max_diff(&step2[0], &alone[0].0) < 1e-4,
        "seq 0 prefill: {}",
        max_diff(&step2[0], &alone[0].0)
    );
    assert!(
        max_diff(&step2[1], &alone[2].0) < 1e-4,
        "seq 2 prefill: {}",
        max_diff(&step2[1], &alone[2].0)
    );
    for s in 0..3 {
        let d = max_diff(&step3[s], &alone[s].1);
        assert!(d < 1e-4, "seq {s} decode logits differ by {d}");
    }
}
