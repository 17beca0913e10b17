//! An engine built from two executors, prefill on the first and decode on
//! the second (each sequence's KV blocks move between them when its
//! prefill is done), answers exactly as an engine on one executor: greedy
//! and seeded, with shared prompt prefixes, sibling choices and
//! preemption under a small KV budget.

mod common;

use engine::executor::LocalExecutor;
use engine::kv_cache::{KvLayout, SlidingBlocks};
use engine::loader::load_gguf;
use engine::{
    EngineBuilder, EngineHandle, GenerateRequest, ModelFacts, SamplingParams, SchedulerConfig,
    TemplateChoice,
};

const BLOCK: usize = 16;

fn engine(split: bool, num_blocks: usize) -> EngineHandle {
    engine_with(split, num_blocks, 64)
}

fn engine_with(split: bool, num_blocks: usize, step_tokens: usize) -> EngineHandle {
    engine_on(common::TINY, split, num_blocks, step_tokens)
}

fn engine_on(model: &str, split: bool, num_blocks: usize, step_tokens: usize) -> EngineHandle {
    engine_sliding(model, split, num_blocks, step_tokens, 0)
}

/// With `swa` > 0, the model's sliding-window layers keep `swa` blocks of
/// their own (if it has such layers).
fn engine_sliding(
    model: &str,
    split: bool,
    num_blocks: usize,
    step_tokens: usize,
    swa: usize,
) -> EngineHandle {
    let path = common::model_path(model);
    let load = || load_gguf(&path, &TemplateChoice::Auto).expect("load");
    let first = load();
    let mc = &first.model.config;
    let window = mc.sliding_kv().filter(|_| swa > 0).map(|(w, _)| w);
    let layers = SlidingBlocks::mask(mc.n_layer, |l| mc.window(l) > 0).expect("mask");
    let layout = KvLayout {
        sliding: window.map(|_| SlidingBlocks {
            layers,
            first: num_blocks as u32,
        }),
        ..mc.kv_layout(BLOCK, num_blocks + window.map_or(0, |_| swa))
    };
    let facts = ModelFacts {
        architecture: mc.architecture.clone(),
        context_length: mc.context_length,
        vocab_size: mc.vocab_size,
        generation: Default::default(),
    };
    let config = SchedulerConfig {
        max_num_batched_tokens: step_tokens,
        ..Default::default()
    };
    let mut b = EngineBuilder::new(first.tokenizer, first.template, facts)
        .scheduler(config)
        .sliding_window(window)
        .executor(Box::new(
            LocalExecutor::new(first.model, layout).expect("exec"),
        ));
    if split {
        let second = load();
        b = b.executor(Box::new(
            LocalExecutor::new(second.model, layout).expect("exec"),
        ));
    }
    b.start().expect("engine")
}

/// Four prompts sharing a 40-token prefix, two choices each.
fn requests(temperature: f32) -> Vec<GenerateRequest> {
    let shared: Vec<u32> = (0..40).map(|i| 100 + i * 7).collect();
    (0..4u32)
        .map(|i| {
            let mut prompt = shared.clone();
            prompt.extend((0..10 + i * 5).map(|t| 900 + t * (i + 1)));
            GenerateRequest {
                prompt_tokens: prompt,
                params: SamplingParams {
                    temperature,
                    seed: Some(u64::from(i)),
                    max_tokens: 60,
                    ignore_eos: true,
                    n: 2,
                    ..Default::default()
                },
            }
        })
        .collect()
}

async fn run(h: &EngineHandle, reqs: Vec<GenerateRequest>) -> Vec<Vec<u32>> {
    let mut handles = Vec::new();
    for r in reqs {
        for s in h.validate(r).and_then(|r| h.submit_n(r)).expect("submit") {
            handles.push(tokio::spawn(common::drain(s)));
        }
    }
    let mut out = Vec::new();
    for j in handles {
        out.push(j.await.expect("join"));
    }
    out
}

#[tokio::test]
async fn split_stages_answer_like_one_executor() {
    for (num_blocks, temperature) in [(256, 0.0), (256, 1.0), (14, 0.0)] {
        let one = engine(false, num_blocks);
        let two = engine(true, num_blocks);
        assert_eq!(two.info().decode_executor, "cpu");
        let want = run(&one, requests(temperature)).await;
        let got = run(&two, requests(temperature)).await;
        assert_eq!(got, want, "blocks {num_blocks}, temperature {temperature}");
        let s = two.stats();
        assert!(s.prefix_hits > 0, "{s:?}");
        if num_blocks < 20 {
            assert!(s.preemptions > 0, "the small budget preempts: {s:?}");
        }
        one.shutdown();
        two.shutdown();
    }
}

/// Each architecture family beyond llama's block (Qwen3's head norms,
/// Qwen3-MoE's and Mixtral's experts) moves its KV between the stages and
/// answers as on one executor.
#[tokio::test]
async fn every_architecture_splits_like_one_executor() {
    for model in common::ARCH_MODELS {
        let one = engine_on(model, false, 256, 64);
        let want = run(&one, requests(0.0)).await;
        one.shutdown();
        // Gemma's sliding-window layers also with blocks of their own (of
        // the window, both stages' blocks moving).
        for swa in [0, 40] {
            let two = engine_sliding(model, true, 256, 64, swa);
            let got = run(&two, requests(0.0)).await;
            assert_eq!(got, want, "{model} (sliding blocks {swa})");
            assert!(two.stats().prefix_hits > 0, "{model}");
            two.shutdown();
        }
    }
}

/// Random workloads (seeded): prompts drawn from a few shared prefixes,
/// random lengths, choices, sampling and KV budgets; the split engine must
/// give every choice the same tokens as the single one.
#[tokio::test]
async fn random_workloads_split_and_single_agree() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let prefixes: Vec<Vec<u32>> = (0..3)
            .map(|_| {
                (0..rng.random_range(1..50))
                    .map(|_| rng.random_range(1..1000))
                    .collect()
            })
            .collect();
        let reqs: Vec<GenerateRequest> = (0..rng.random_range(1..7))
            .map(|i| {
                let mut prompt = prefixes[rng.random_range(0..prefixes.len())].clone();
                prompt.extend((0..rng.random_range(0..40)).map(|_| rng.random_range(1..1000)));
                GenerateRequest {
                    prompt_tokens: prompt,
                    params: SamplingParams {
                        temperature: if rng.random_bool(0.5) { 0.0 } else { 0.8 },
                        seed: Some(seed * 100 + i),
                        max_tokens: rng.random_range(1..50),
                        ignore_eos: true,
                        n: rng.random_range(1..3),
                        ..Default::default()
                    },
                }
            })
            .collect();
        // Enough blocks for the longest sequence alone (prompt under 90,
        // output under 50), sometimes barely.
        let blocks = 9 + rng.random_range(0..40);
        let step = rng.random_range(8..128);
        let one = engine_with(false, blocks, step);
        let two = engine_with(true, blocks, step);
        let want = run(&one, reqs.clone()).await;
        let got = run(&two, reqs).await;
        assert_eq!(got, want, "seed {seed} (blocks {blocks}, step {step})");
        one.shutdown();
        two.shutdown();
    }
}
