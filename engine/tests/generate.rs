//! End-to-end generation through `EngineHandle` with real weights.

mod common;

use engine::{
    ChatMessage, EngineConfig, EngineHandle, FinishReason, GenerateRequest, SamplingParams,
    TokenEvent,
};
use tokio_stream::StreamExt;

/// Everything one finished request produced.
struct Run {
    text: String,
    ids: Vec<u32>,
    reason: FinishReason,
    usage: engine::Usage,
}

/// Submits one request and drains its stream.
async fn run(handle: &EngineHandle, prompt: Vec<u32>, params: SamplingParams) -> Run {
    let req = GenerateRequest {
        prompt_tokens: prompt,
        params,
    };
    let mut stream = handle
        .validate(req)
        .and_then(|r| handle.submit(r))
        .expect("submit");
    let (mut text, mut ids) = (String::new(), Vec::new());
    while let Some(ev) = stream.next().await {
        match ev {
            TokenEvent::Delta {
                text: t, token_ids, ..
            } => {
                text.push_str(&t);
                ids.extend(token_ids);
            }
            TokenEvent::Finished { reason, usage } => {
                return Run {
                    text,
                    ids,
                    reason,
                    usage,
                };
            }
            TokenEvent::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("stream ended without Finished");
}

async fn collect(
    handle: &EngineHandle,
    prompt: Vec<u32>,
    params: SamplingParams,
) -> (String, FinishReason, usize) {
    let r = run(handle, prompt, params).await;
    (r.text, r.reason, r.usage.completion_tokens)
}

fn smollm2(config: EngineConfig) -> EngineHandle {
    EngineHandle::start_gguf(
        &common::model_path(common::SMOLLM2),
        &Default::default(),
        config,
    )
    .expect("load SmolLM2")
}

fn chat_prompt(handle: &EngineHandle, question: &str) -> Vec<u32> {
    let text = handle
        .render_chat(&[ChatMessage::new("user", question)])
        .expect("template");
    handle.tokenizer().encode_prompt(&text).expect("tokenize")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_answers_the_capital_of_france_greedily() {
    let handle = smollm2(EngineConfig::default());
    let prompt = chat_prompt(&handle, "What is the capital of France?");
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 40,
        ..Default::default()
    };
    let (text, reason, n) = collect(&handle, prompt.clone(), params.clone()).await;
    eprintln!("answer ({n} tokens, {reason:?}): {text:?}");
    assert!(text.contains("Paris"), "answer was {text:?}");
    assert_eq!(reason, FinishReason::Stop);
    // Greedy decoding is deterministic, also when two requests share a batch.
    let (a, b) = tokio::join!(
        collect(&handle, prompt.clone(), params.clone()),
        collect(&handle, prompt, params)
    );
    assert_eq!(a.0, text);
    assert_eq!(b.0, text);
    handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_cuts_the_answer_before_it() {
    let handle = smollm2(EngineConfig::default());
    let prompt = chat_prompt(&handle, "What is the capital of France?");
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 40,
        stop: vec![" Paris".into()],
        ..Default::default()
    };
    let (text, reason, _) = collect(&handle, prompt, params).await;
    assert_eq!(text, "The capital of France is");
    assert_eq!(reason, FinishReason::Stop);
    handle.shutdown();
}

#[test]
fn the_gguf_tokenizer_matches_smollm2s_reference_ids() {
    let loaded =
        engine::loader::load_gguf(&common::model_path(common::SMOLLM2), &Default::default())
            .expect("load");
    let tok = &loaded.tokenizer;
    // Pinned ids: the ChatML markers are vocab specials (1 <|im_start|>, 2 <|im_end|>, 198 "\n").
    let ids = tok
        .encode_prompt("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n")
        .expect("encode");
    assert_eq!(
        ids,
        [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198]
    );
    // The `smollm` pre-tokenizer splits digits one by one.
    assert_eq!(tok.encode_prompt("12345").expect("encode").len(), 5);
    assert!(tok.eog_ids().contains(&2));
}

#[test]
fn incremental_detokenization_reassembles_text_without_broken_characters() {
    use engine::tokenizer::detok::IncrementalDetokenizer;
    let loaded =
        engine::loader::load_gguf(&common::model_path(common::SMOLLM2), &Default::default())
            .expect("load");
    let tok = &loaded.tokenizer;
    let text = "Grüße, 世界! 🦀 naïve café — ½ ∑ 12345\n\ttabs";
    let ids = tok.encode_prompt(text).expect("encode");
    let prompt = tok.encode_prompt("Say:").expect("encode");
    let mut detok = IncrementalDetokenizer::new(&prompt);
    let mut out = String::new();
    for &id in &ids {
        let delta = detok.push(tok, id).expect("push");
        assert!(
            !delta.contains('\u{FFFD}'),
            "broken character in delta {delta:?}"
        );
        out.push_str(&delta);
    }
    out.push_str(&detok.flush(tok).expect("flush"));
    assert_eq!(out, text);
}

async fn greedy_ids(
    handle: &EngineHandle,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> (Vec<u32>, usize) {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..Default::default()
    };
    let r = run(handle, prompt, params).await;
    (r.ids, r.usage.cached_tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_decoded_together_match_each_decoded_alone() {
    let handle = smollm2(EngineConfig::default());
    let questions = [
        "What is the capital of France?",
        "Name three colours.",
        "Write a haiku about the sea, please, with vivid imagery and a twist at the end.",
        "What is 12 times 12?",
        "Who wrote Hamlet?",
        "Explain photosynthesis in one sentence.",
        "List the days of the week.",
        "Why is the sky blue? Answer briefly but precisely, like a physics teacher would.",
    ];
    let prompts: Vec<Vec<u32>> = questions.iter().map(|q| chat_prompt(&handle, q)).collect();
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(greedy_ids(&handle, p.clone(), 24).await.0);
    }
    // Arrive at different times, so prefills and decodes share steps.
    let tasks: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (h, p) = (handle.clone(), p.clone());
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(15 * i as u64)).await;
                greedy_ids(&h, p, 24).await.0
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(
            t.await.expect("join"),
            alone[i],
            "prompt {i} changed when batched"
        );
    }
    assert!(
        handle.stats().batched_tokens > handle.stats().steps,
        "nothing was batched"
    );
    handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_200_token_prefix_is_computed_once_and_gives_the_same_answer() {
    let handle = smollm2(EngineConfig::default());
    let system = "You are a meticulous assistant. ".repeat(36);
    let ask = |q: &str| {
        let msgs = [
            ChatMessage::new("system", system.as_str()),
            ChatMessage::new("user", q),
        ];
        handle
            .tokenizer()
            .encode_prompt(&handle.render_chat(&msgs).expect("template"))
            .expect("tokenize")
    };
    let (a, b) = (
        ask("What is the capital of France?"),
        ask("What is the capital of Italy?"),
    );
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared >= 200, "prefix only {shared} tokens");
    let (_, cached_a) = greedy_ids(&handle, a, 8).await;
    assert_eq!(cached_a, 0);
    let before = handle.stats();
    let (ids_b, cached_b) = greedy_ids(&handle, b.clone(), 8).await;
    let computed = handle.stats().batched_tokens - before.batched_tokens;
    assert_eq!(
        cached_b,
        shared / 16 * 16,
        "whole shared blocks come from the cache"
    );
    // Only the uncached suffix is prefilled (plus at most 7 decode steps).
    let suffix = (b.len() - cached_b) as u64;
    assert!(
        (suffix..=suffix + 7).contains(&computed),
        "computed {computed} tokens, suffix {suffix}"
    );
    handle.shutdown();
    // The cached prefix gives exactly what a cold engine computes.
    let cold = smollm2(EngineConfig::default());
    assert_eq!(greedy_ids(&cold, b, 8).await.0, ids_b);
    cold.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_identical_with_prompt_lookup_speculation() {
    let mut spec = EngineConfig::default();
    spec.scheduler.num_speculative_tokens = 4;
    let with = smollm2(spec);
    let without = smollm2(EngineConfig::default());
    let q = "Repeat this list exactly, twice: apple, banana, cherry, date, elderberry, fig, grape.";
    let prompt = chat_prompt(&with, q);
    let (a, _) = greedy_ids(&with, prompt.clone(), 48).await;
    let (b, _) = greedy_ids(&without, prompt, 48).await;
    assert_eq!(a, b);
    let s = with.stats();
    assert!(s.spec_accepted > 0, "no draft accepted: {s:?}");
    assert!(
        s.steps < without.stats().steps,
        "speculation saved no steps"
    );
    with.shutdown();
    without.shutdown();
}

/// Structured output: a JSON schema with seeded random sampling (so the
/// constraint, not greedy luck, keeps it valid), then any JSON object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_outputs_parse_and_match_their_schema() {
    let handle = smollm2(EngineConfig::default());
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "population": {"type": "integer", "minimum": 0},
            "capital": {"type": "boolean"}
        },
        "required": ["city", "population", "capital"],
        "additionalProperties": false
    });
    for seed in 0..3 {
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            max_tokens: 120,
            grammar: Some(engine::Grammar::JsonSchema(schema.clone())),
            ..Default::default()
        };
        let prompt = chat_prompt(&handle, "Describe Paris as JSON.");
        let r = run(&handle, prompt, params).await;
        assert_eq!(r.reason, FinishReason::Stop, "seed {seed}: {}", r.text);
        let v: serde_json::Value = serde_json::from_str(&r.text)
            .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {}", r.text));
        let obj = v.as_object().expect("an object");
        assert_eq!(obj.len(), 3, "{v}");
        assert!(
            obj["city"]
                .as_str()
                .is_some_and(|c| c.chars().count() <= 24)
        );
        assert!(obj["population"].as_u64().is_some(), "{v}");
        assert!(obj["capital"].is_boolean(), "{v}");
    }
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 400,
        grammar: Some(engine::Grammar::JsonObject),
        ..Default::default()
    };
    let r = run(
        &handle,
        chat_prompt(
            &handle,
            "Reply with a JSON object whose only key is \"answer\": what is 2 + 2?",
        ),
        params,
    )
    .await;
    assert_eq!(r.reason, FinishReason::Stop, "{}", r.text);
    let v: serde_json::Value = serde_json::from_str(&r.text).expect("JSON");
    assert!(v.is_object(), "{}", r.text);
    let bad = SamplingParams {
        grammar: Some(engine::Grammar::JsonSchema(
            serde_json::json!({"type": "no-such-type"}),
        )),
        ..Default::default()
    };
    let req = GenerateRequest {
        prompt_tokens: vec![1, 2],
        params: bad,
    };
    assert!(matches!(
        handle.validate(req).and_then(|r| handle.submit(r)),
        Err(engine::EngineError::Validation {
            field: "response_format",
            ..
        })
    ));
}
