//! Token replay, the fleet's recovery from a lost executor: a sequence
//! submitted with the tokens another executor already generated continues
//! exactly where that one would have, greedy and seeded with penalties
//! alike (draws depend on the seed and the output position; penalties see
//! the replayed tokens as output), and finishes at the same `max_tokens`.

mod common;

use engine::core::CoreEvent;
use engine::{EngineConfig, EngineHandle, FinishReason, GenerateRequest, SamplingParams};

fn engine() -> EngineHandle {
    EngineHandle::start_gguf(
        &common::model_path(common::SMOLLM2),
        &Default::default(),
        EngineConfig::default(),
    )
    .expect("load")
}

/// Every token of a raw run, and how it finished.
async fn run(
    e: &EngineHandle,
    req: &GenerateRequest,
    resume: Vec<u32>,
) -> (Vec<u32>, FinishReason) {
    let mut s = e
        .validate(req.clone())
        .and_then(|r| e.submit_raw(r, resume))
        .expect("submit");
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        match ev {
            CoreEvent::Accepted => {}
            CoreEvent::Token { id, .. } => out.push(id),
            CoreEvent::Finished { reason, .. } => return (out, reason),
            CoreEvent::Failed(e) => panic!("failed: {e}"),
        }
    }
    panic!("no end")
}

#[tokio::test]
async fn a_replayed_sequence_continues_with_the_same_tokens() {
    let e = engine();
    let prompt = e
        .tokenizer()
        .encode_prompt("The three primary colours are")
        .expect("encode");
    let cases = [
        SamplingParams {
            temperature: 0.0,
            max_tokens: 24,
            ignore_eos: true,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(7),
            frequency_penalty: 0.8,
            presence_penalty: 0.4,
            repetition_penalty: 1.2,
            max_tokens: 24,
            ignore_eos: true,
            ..Default::default()
        },
    ];
    for params in cases {
        let req = GenerateRequest {
            prompt_tokens: prompt.clone(),
            params,
        };
        let (whole, reason) = run(&e, &req, Vec::new()).await;
        assert_eq!((whole.len(), reason), (24, FinishReason::Length));
        for k in [1, 5, 13, 23] {
            let (rest, reason) = run(&e, &req, whole[..k].to_vec()).await;
            assert_eq!(rest, whole[k..], "resumed after {k} of {:?}", req.params);
            assert_eq!(reason, FinishReason::Length);
        }
    }
}

#[tokio::test]
async fn impossible_replays_are_refused() {
    let e = engine();
    let req = GenerateRequest {
        prompt_tokens: vec![1, 2, 3],
        params: SamplingParams {
            max_tokens: 4,
            ..Default::default()
        },
    };
    assert!(
        e.validate(req.clone())
            .and_then(|r| e.submit_raw(r, vec![5; 4]))
            .is_err(),
        "nothing left"
    );
    assert!(
        e.validate(req.clone())
            .and_then(|r| e.submit_raw(r, vec![u32::MAX]))
            .is_err(),
        "outside the vocabulary"
    );
    let two = GenerateRequest {
        params: SamplingParams {
            n: 2,
            ..req.params.clone()
        },
        ..req
    };
    assert!(
        e.validate(two)
            .and_then(|r| e.submit_raw(r, Vec::new()))
            .is_err(),
        "one choice"
    );
}
