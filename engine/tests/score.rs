//! Scoring a continuation in one prefill (the reference of a spot check):
//! what an honest executor generated scores as generated, greedy tokens at
//! rank 0, and the log-probabilities it reported agree with the scored
//! ones within the tolerance spot checks use for a CPU pair; a different
//! continuation does not.

mod common;

use engine::core::CoreEvent;
use engine::{EngineConfig, EngineHandle, GenerateRequest, SamplingParams};

fn engine() -> EngineHandle {
    EngineHandle::start_gguf(
        &common::model_path(common::SMOLLM2),
        &Default::default(),
        EngineConfig::default(),
    )
    .expect("load")
}

/// The tokens and reported log-probabilities of one raw generation.
async fn generate(e: &EngineHandle, prompt: &[u32], params: SamplingParams) -> Vec<(u32, f32)> {
    let req = GenerateRequest {
        prompt_tokens: prompt.to_vec(),
        params,
    };
    let mut s = e
        .validate(req)
        .and_then(|r| e.submit_raw(r, Vec::new()))
        .expect("submit");
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        match ev {
            CoreEvent::Token { id, logprob } => out.push((id, logprob.expect("asked").logprob)),
            CoreEvent::Finished { .. } => return out,
            CoreEvent::Failed(e) => panic!("{e}"),
            CoreEvent::Accepted => {}
        }
    }
    out
}

#[tokio::test]
async fn an_honest_continuation_scores_as_it_was_generated() {
    let e = engine();
    let mut worst = 0f32;
    for (i, text) in [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time",
    ]
    .iter()
    .enumerate()
    {
        let prompt = e.tokenizer().encode_prompt(text).expect("encode");
        for temperature in [0.0, 0.8] {
            let params = SamplingParams {
                temperature,
                seed: Some(i as u64),
                max_tokens: 24,
                ignore_eos: true,
                logprobs: Some(0),
                ..Default::default()
            };
            let got = generate(&e, &prompt, params).await;
            let mut all = prompt.clone();
            all.extend(got.iter().map(|t| t.0));
            let scores = e.score(all, prompt.len()).await.expect("score");
            assert_eq!(scores.len(), got.len());
            for (s, (t, lp)) in scores.iter().zip(&got) {
                assert_eq!(s.token, *t);
                if temperature == 0.0 {
                    assert_eq!(s.rank, 0, "greedy picks the most likely token");
                }
                worst = worst.max((s.logprob - lp).abs());
            }
        }
    }
    // Decode steps against one prefill, on the same CPU backend.
    assert!(worst < 0.05, "logprobs differ by {worst}");
    eprintln!("largest logprob difference, decode against scoring prefill: {worst}");
    // Another model's continuation scores far lower.
    let prompt = e
        .tokenizer()
        .encode_prompt("The capital of France is")
        .expect("encode");
    let mut all = prompt.clone();
    all.extend([1000u32, 2000, 3000, 4000]);
    let scores = e.score(all, prompt.len()).await.expect("score");
    assert!(
        scores.iter().all(|s| s.rank > 10 && s.logprob < -5.0),
        "{scores:?}"
    );
    assert!(
        e.score(prompt.clone(), prompt.len()).await.is_err(),
        "nothing to score"
    );
}
