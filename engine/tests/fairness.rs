//! No request's parameters may make the shared engine step slower for
//! everyone. A plain request is timed next to four companions with plain
//! parameters (the cost of sharing the batch), then next to four
//! companions carrying one hostile class of parameters at its limits
//! (stop strings, logit_bias, stop token ids, top_logprobs, n, a large
//! JSON schema, a prompt filling the context). The hostile companions may
//! not make it much slower than the plain ones did.
//!
//! A timing test, so its bound is loose (3x plus 250 ms): a parameter
//! whose cost grows with its size (the 900 KB stop strings that made a
//! 0.8 s request take 30 s) breaks it by an order of magnitude.

mod common;

use std::time::{Duration, Instant};

use engine::request::{MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS};
use engine::{
    EngineConfig, EngineHandle, GenerateRequest, Grammar, SamplingParams, TemplateChoice,
    TokenEvent,
};
use serde_json::json;
use tokio_stream::StreamExt;

/// Tokens the timed request generates.
const TIMED_TOKENS: usize = 48;
/// Tokens each companion generates (longer, so they outlive the timed one).
const COMPANION_TOKENS: usize = 160;

fn engine() -> EngineHandle {
    EngineHandle::start_gguf(
        &common::model_path(common::TINY),
        &TemplateChoice::Auto,
        EngineConfig::default(),
    )
    .expect("load tiny")
}

fn plain(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len).map(|i| 10 + (i as u32 * 7) % 200).collect()
}

/// The hostile classes: a name and a companion request.
fn hostile(h: &EngineHandle) -> Vec<(&'static str, GenerateRequest)> {
    let base = |params: SamplingParams| GenerateRequest {
        prompt_tokens: prompt(16),
        params,
    };
    let vocab = h.info().vocab_size as u32;
    let long_stop: String = "ab".repeat(MAX_STOP_CHARS / 2);
    let props: serde_json::Map<String, serde_json::Value> = (0..60)
        .map(|i| {
            (
                format!("field_{i}"),
                json!({"type": "string", "maxLength": 8}),
            )
        })
        .collect();
    let schema = json!({"type": "object", "properties": props});
    let context = h.info().context_length;
    vec![
        (
            "stop strings at their limits",
            base(SamplingParams {
                stop: vec![long_stop; MAX_STOP_STRINGS],
                ..plain(COMPANION_TOKENS)
            }),
        ),
        (
            "logit_bias at its limit",
            base(SamplingParams {
                logit_bias: (0..MAX_LOGIT_BIAS as u32)
                    .map(|t| (t % vocab, 1.5))
                    .collect(),
                ..plain(COMPANION_TOKENS)
            }),
        ),
        (
            "stop token ids at their limit",
            base(SamplingParams {
                stop_token_ids: (0..MAX_STOP_TOKEN_IDS as u32)
                    .map(|t| vocab - 1 - t)
                    .collect(),
                ..plain(COMPANION_TOKENS)
            }),
        ),
        (
            "top_logprobs 20",
            base(SamplingParams {
                logprobs: Some(20),
                ..plain(COMPANION_TOKENS)
            }),
        ),
        (
            "a large JSON schema",
            base(SamplingParams {
                grammar: Some(Grammar::JsonSchema(schema)),
                ..plain(COMPANION_TOKENS)
            }),
        ),
        (
            "a prompt filling the context",
            GenerateRequest {
                prompt_tokens: prompt(context - 8),
                params: plain(8),
            },
        ),
    ]
}

async fn run(h: &EngineHandle, req: GenerateRequest) {
    let mut s = h.validate(req).and_then(|r| h.submit(r)).expect("submit");
    while let Some(ev) = s.next().await {
        match ev {
            TokenEvent::Finished { .. } => return,
            TokenEvent::Failed(e) => panic!("{e}"),
            TokenEvent::Delta { .. } => {}
        }
    }
}

/// Time of the timed request while `companions` run (n choices each).
async fn timed_beside(h: &EngineHandle, companions: Vec<GenerateRequest>) -> Duration {
    let mut tasks = Vec::new();
    for c in companions {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let streams = h.validate(c).and_then(|r| h.submit_n(r)).expect("submit");
            for mut s in streams {
                while let Some(ev) = s.next().await {
                    if matches!(ev, TokenEvent::Finished { .. } | TokenEvent::Failed(_)) {
                        break;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let t0 = Instant::now();
    run(
        h,
        GenerateRequest {
            prompt_tokens: prompt(16),
            params: plain(TIMED_TOKENS),
        },
    )
    .await;
    let took = t0.elapsed();
    for t in tasks {
        t.await.expect("companion");
    }
    took
}

/// The best of three (timing noise only ever adds).
async fn best_of_three(
    h: &EngineHandle,
    companions: impl Fn() -> Vec<GenerateRequest>,
) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        best = best.min(timed_beside(h, companions()).await);
    }
    best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_parameters_slow_a_concurrent_plain_request() {
    let h = engine();
    let plain_companion = || GenerateRequest {
        prompt_tokens: prompt(16),
        params: plain(COMPANION_TOKENS),
    };
    let shared = best_of_three(&h, || (0..4).map(|_| plain_companion()).collect()).await;
    let bound = shared * 3 + Duration::from_millis(250);
    for (name, req) in hostile(&h) {
        let took = best_of_three(&h, || vec![req.clone(); 4]).await;
        assert!(
            took <= bound,
            "{name}: {took:?} beside it, {shared:?} beside plain requests"
        );
    }
    // n choices share the batch like n requests: sixteen choices against
    // sixteen plain companions.
    let n16 = || {
        vec![GenerateRequest {
            prompt_tokens: prompt(16),
            params: SamplingParams {
                n: 16,
                ..plain(COMPANION_TOKENS)
            },
        }]
    };
    let sixteen = best_of_three(&h, || (0..16).map(|_| plain_companion()).collect()).await;
    let took = best_of_three(&h, n16).await;
    assert!(
        took <= sixteen * 3 + Duration::from_millis(250),
        "n=16: {took:?}, beside 16 plain requests {sixteen:?}"
    );
}
