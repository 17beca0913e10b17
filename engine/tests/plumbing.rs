//! Engine plumbing on the 1M-parameter random-weight fixture (`tiny.gguf`):
//! lengths, aborts, overload, seeds and limits, where the text is noise.

mod common;

use std::time::{Duration, Instant};

use engine::{
    Device, EngineConfig, EngineError, EngineHandle, FinishReason, GenerateRequest, KvDtype,
    RequestStream, SamplingParams, SchedulerConfig, TemplateChoice, TokenEvent,
};
use tokio_stream::StreamExt;

/// The engine on a test model (`common::TINY`, `common::SMOLLM2`).
fn start(model: &str, config: EngineConfig) -> Result<EngineHandle, EngineError> {
    EngineHandle::start_gguf(&common::model_path(model), &TemplateChoice::Auto, config)
}

fn tiny(scheduler: SchedulerConfig) -> EngineHandle {
    let config = EngineConfig {
        scheduler,
        ..Default::default()
    };
    start(common::TINY, config).expect("load tiny")
}

fn req(prompt: Vec<u32>, max_tokens: usize, seed: Option<u64>) -> GenerateRequest {
    let params = SamplingParams {
        temperature: 1.0,
        seed,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    };
    GenerateRequest {
        prompt_tokens: prompt,
        params,
    }
}

/// Drains a stream: (token ids, finish reason or error).
async fn drain(mut s: RequestStream) -> (Vec<u32>, Result<(FinishReason, usize), EngineError>) {
    let mut ids = Vec::new();
    while let Some(ev) = s.next().await {
        match ev {
            TokenEvent::Delta { token_ids, .. } => ids.extend(token_ids),
            TokenEvent::Finished { reason, usage } => {
                return (ids, Ok((reason, usage.completion_tokens)));
            }
            TokenEvent::Failed(e) => return (ids, Err(e)),
        }
    }
    panic!("stream ended without a final event");
}

async fn wait_idle(h: &EngineHandle) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.stats().num_running + h.stats().num_waiting > 0 {
        assert!(
            Instant::now() < deadline,
            "engine still busy: {:?}",
            h.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn max_tokens_ends_the_sequence_with_length() {
    let h = tiny(SchedulerConfig::default());
    let (ids, end) = drain(
        h.validate(req(vec![1, 100, 200], 7, Some(1)))
            .and_then(|r| h.submit(r))
            .expect("submit"),
    )
    .await;
    assert_eq!(end, Ok((FinishReason::Length, 7)));
    assert_eq!(ids.len(), 7);
    h.shutdown();
}

#[tokio::test]
async fn the_same_seed_gives_the_same_tokens_alone_or_in_a_batch() {
    let h = tiny(SchedulerConfig::default());
    let alone = drain(
        h.validate(req(vec![1, 5, 6, 7], 20, Some(42)))
            .and_then(|r| h.submit(r))
            .expect("submit"),
    )
    .await;
    let batch = futures_join(
        &h,
        vec![
            req(vec![1, 9, 9, 9, 9, 9, 9], 30, Some(1)),
            req(vec![1, 5, 6, 7], 20, Some(42)),
            req(vec![1, 300], 25, None),
        ],
    )
    .await;
    assert_eq!(batch[1].0, alone.0);
    assert!(
        batch
            .iter()
            .all(|(_, end)| matches!(end, Ok((FinishReason::Length, _))))
    );
    h.shutdown();
}

async fn futures_join(
    h: &EngineHandle,
    reqs: Vec<GenerateRequest>,
) -> Vec<(Vec<u32>, Result<(FinishReason, usize), EngineError>)> {
    let streams: Vec<_> = reqs
        .into_iter()
        .map(|r| h.validate(r).and_then(|r| h.submit(r)).expect("submit"))
        .collect();
    let mut out = Vec::new();
    let handles: Vec<_> = streams
        .into_iter()
        .map(|s| tokio::spawn(drain(s)))
        .collect();
    for j in handles {
        out.push(j.await.expect("join"));
    }
    out
}

#[tokio::test]
async fn dropping_a_stream_aborts_its_sequence() {
    let h = tiny(SchedulerConfig::default());
    let mut s = h
        .validate(req(vec![1, 2, 3], 1500, None))
        .and_then(|r| h.submit(r))
        .expect("submit");
    for _ in 0..3 {
        assert!(matches!(s.next().await, Some(TokenEvent::Delta { .. })));
    }
    drop(s);
    wait_idle(&h).await;
    let steps = h.stats().steps;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        h.stats().steps,
        steps,
        "the engine kept stepping after the abort"
    );
    h.shutdown();
}

#[tokio::test]
async fn a_full_waiting_queue_refuses_at_once() {
    let h = tiny(SchedulerConfig {
        max_num_seqs: 1,
        max_waiting: 1,
        ..Default::default()
    });
    let results = futures_join(
        &h,
        (0..4).map(|i| req(vec![1, 10 + i], 200, None)).collect(),
    )
    .await;
    let overloaded = results
        .iter()
        .filter(|(_, e)| matches!(e, Err(EngineError::Overloaded { .. })))
        .count();
    let done = results
        .iter()
        .filter(|(_, e)| matches!(e, Ok((FinishReason::Length, 200))))
        .count();
    assert!(overloaded >= 1, "{results:?}");
    assert_eq!(overloaded + done, 4);
    wait_idle(&h).await;
    h.shutdown();
}

#[tokio::test]
async fn invalid_requests_are_refused_before_queueing() {
    let h = tiny(SchedulerConfig::default());
    let ctx = h.info().context_length;
    let too_long = req(vec![1; ctx - 5], 10, None);
    assert!(matches!(
        h.validate(too_long).and_then(|r| h.submit(r)),
        Err(EngineError::ContextLength { .. })
    ));
    assert!(matches!(
        h.validate(req(vec![], 5, None)).and_then(|r| h.submit(r)),
        Err(EngineError::Validation {
            field: "prompt",
            ..
        })
    ));
    assert!(matches!(
        h.validate(req(vec![1, 999_999], 5, None))
            .and_then(|r| h.submit(r)),
        Err(EngineError::Validation {
            field: "prompt",
            ..
        })
    ));
    let mut bad = req(vec![1, 2], 5, None);
    bad.params.top_p = 1.5;
    assert!(matches!(
        h.validate(bad).and_then(|r| h.submit(r)),
        Err(EngineError::Validation { field: "top_p", .. })
    ));
    assert_eq!(h.stats().steps, 0);
    h.shutdown();
}

#[tokio::test]
async fn a_prompt_longer_than_the_step_budget_is_prefilled_in_chunks() {
    let h = tiny(SchedulerConfig {
        max_num_batched_tokens: 16,
        ..Default::default()
    });
    let prompt: Vec<u32> = (0..100).map(|i| 1 + i % 500).collect();
    let chunked = drain(
        h.validate(req(prompt.clone(), 5, Some(3)))
            .and_then(|r| h.submit(r))
            .expect("submit"),
    )
    .await;
    h.shutdown();
    let whole = tiny(SchedulerConfig::default());
    let single = drain(
        whole
            .validate(req(prompt, 5, Some(3)))
            .and_then(|r| whole.submit(r))
            .expect("submit"),
    )
    .await;
    assert_eq!(chunked.0, single.0, "chunked prefill changed the output");
    whole.shutdown();
}

#[tokio::test]
async fn shutdown_fails_queued_requests_instead_of_hanging() {
    let h = tiny(SchedulerConfig::default());
    let s = h
        .validate(req(vec![1, 2], 1800, None))
        .and_then(|r| h.submit(r))
        .expect("submit");
    let task = tokio::spawn(drain(s));
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.shutdown();
    let (_, end) = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("no hang")
        .expect("join");
    assert_eq!(end, Err(EngineError::Shutdown));
}

#[tokio::test]
async fn a_tiny_kv_cache_preempts_and_every_request_still_completes_correctly() {
    // 16 blocks of 16 positions = 256 positions for six 90-position requests.
    let small = EngineConfig {
        kv_cache_memory: 16 * 16 * 128,
        ..Default::default()
    };
    let h = start(common::TINY, small).expect("load tiny");
    assert_eq!(h.info().kv_blocks, 16);
    let reqs: Vec<GenerateRequest> = (0..6)
        .map(|i| req((0..30).map(|t| 1 + t * 7 + i).collect(), 60, Some(i as u64)))
        .collect();
    let together = futures_join(&h, reqs.clone()).await;
    assert!(h.stats().preemptions > 0, "no preemption: {:?}", h.stats());
    wait_idle(&h).await;
    assert_eq!(
        h.stats().kv_usage(),
        0.0,
        "blocks still held after every request finished"
    );
    h.shutdown();
    // Recomputed sequences continue exactly as uninterrupted ones.
    let roomy = tiny(SchedulerConfig::default());
    for (r, got) in reqs.into_iter().zip(together) {
        let alone = drain(
            roomy
                .validate(r)
                .and_then(|r| roomy.submit(r))
                .expect("submit"),
        )
        .await;
        assert_eq!(got, alone);
    }
    roomy.shutdown();
}

#[tokio::test]
async fn aborting_frees_blocks_at_once() {
    let h = tiny(SchedulerConfig::default());
    let mut s = h
        .validate(req((1..200).collect(), 500, None))
        .and_then(|r| h.submit(r))
        .expect("submit");
    s.next().await;
    // Stats are published at the end of the step that sent the token.
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.stats().kv_usage() == 0.0 {
        assert!(Instant::now() < deadline, "KV usage never rose");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(s);
    wait_idle(&h).await;
    assert_eq!(h.stats().kv_usage(), 0.0);
    h.shutdown();
}

#[tokio::test]
async fn n_choices_share_the_prompt_blocks_and_sample_independently() {
    let h = tiny(SchedulerConfig::default());
    let prompt: Vec<u32> = (1..101).collect();
    let mut r = req(prompt, 8, Some(5));
    r.params.n = 4;
    let streams = h.validate(r).and_then(|r| h.submit_n(r)).expect("submit");
    assert_eq!(streams.len(), 4);
    let mut outs = Vec::new();
    for s in streams {
        outs.push(drain(s).await);
    }
    let distinct: std::collections::HashSet<_> = outs.iter().map(|o| o.0.clone()).collect();
    assert!(distinct.len() > 1, "choices are identical");
    // The first choice computes 100 prompt tokens; the others reuse 96.
    let stats = h.stats();
    assert_eq!(stats.prefix_hits, 3 * 96, "{stats:?}");
    assert!(stats.batched_tokens <= 100 + 3 * 4 + 4 * 7, "{stats:?}");
    // A single-choice submit refuses n > 1 with a clear field.
    let mut bad = req(vec![1], 2, None);
    bad.params.n = 2;
    assert!(matches!(
        h.validate(bad).and_then(|r| h.submit(r)),
        Err(EngineError::Validation { field: "n", .. })
    ));
    let mut bias = req(vec![1], 2, None);
    bias.params.logit_bias = vec![(999_999, 1.0)];
    assert!(matches!(
        h.validate(bias).and_then(|r| h.submit(r)),
        Err(EngineError::Validation {
            field: "logit_bias",
            ..
        })
    ));
    h.shutdown();
}

#[tokio::test]
async fn prompt_lookup_speculation_never_changes_seeded_outputs() {
    let spec = SchedulerConfig {
        num_speculative_tokens: 4,
        ..Default::default()
    };
    let with = tiny(spec);
    let without = tiny(SchedulerConfig::default());
    // Repetitive prompts, and a bias that keeps the random model's samples
    // inside the prompt's alphabet, so the n-gram lookup finds drafts.
    let reqs: Vec<GenerateRequest> = (0..4u32)
        .map(|i| {
            let mut r = req(
                (0..60).map(|t| 1 + (t % (3 + i))).collect(),
                40,
                Some(u64::from(i)),
            );
            r.params.logit_bias = (1..4).map(|t| (t, 100.0)).collect();
            r
        })
        .collect();
    let a = futures_join(&with, reqs.clone()).await;
    let b = futures_join(&without, reqs).await;
    assert_eq!(a, b);
    let s = with.stats();
    assert!(
        s.spec_proposed > 0 && s.spec_accepted > 0,
        "no drafts proposed or accepted: {s:?}"
    );
    with.shutdown();
    without.shutdown();
}

#[tokio::test]
async fn a_regex_grammar_shapes_the_output_of_a_sentencepiece_model() {
    let h = tiny(SchedulerConfig::default());
    for seed in 0..4 {
        let mut r = req(vec![1, 100, 200], 40, Some(seed));
        r.params.grammar = Some(engine::Grammar::Regex("[0-9]{3}-[a-z]{2}".into()));
        let (ids, end) = drain(h.validate(r).and_then(|r| h.submit(r)).expect("submit")).await;
        let (reason, _) = end.expect("finished");
        assert_eq!(reason, FinishReason::Stop, "seed {seed}");
        let text = h.tokenizer().decode(&ids[..ids.len() - 1]).expect("decode");
        let ok = text.len() == 6
            && text[..3].bytes().all(|b| b.is_ascii_digit())
            && &text[3..4] == "-"
            && text[4..].bytes().all(|b| b.is_ascii_lowercase());
        assert!(ok, "seed {seed}: {text:?}");
    }
    h.shutdown();
}

#[tokio::test]
async fn a_q8_kv_cache_holds_more_positions_in_the_same_memory_and_serves() {
    let start = |kv_cache_dtype| {
        // SmolLM2: 30 layers, 3 KV heads of 64: 23,040 bytes a position
        // in f16, 12,960 in Q8_0 (64 quants and two scales a row).
        let config = EngineConfig {
            kv_cache_memory: 16 * 16 * 23_040,
            kv_cache_dtype,
            ..Default::default()
        };
        start(common::SMOLLM2, config).expect("load SmolLM2")
    };
    let (f16, q8) = (start(KvDtype::F16), start(KvDtype::Q8_0));
    assert_eq!(f16.info().kv_blocks, 16);
    assert_eq!(q8.info().kv_blocks, 16 * 23_040 / 12_960);
    f16.shutdown();
    // Past what f16 would hold at once: six 90-position requests.
    let reqs: Vec<GenerateRequest> = (0..6)
        .map(|i| req((0..30).map(|t| 1 + t * 7 + i).collect(), 60, Some(i as u64)))
        .collect();
    for (tokens, end) in futures_join(&q8, reqs).await {
        assert_eq!(end.expect("completes").1, 60);
        assert_eq!(tokens.len(), 60);
    }
    wait_idle(&q8).await;
    assert_eq!(q8.stats().kv_usage(), 0.0, "blocks held after the requests");
    q8.shutdown();
}

#[test]
fn a_q8_kv_cache_on_a_gpu_device_is_refused_with_a_clear_error() {
    let config = EngineConfig {
        kv_cache_dtype: KvDtype::Q8_0,
        device: Device::Wgpu,
        ..Default::default()
    };
    let err = start(common::TINY, config).expect_err("q8 KV on a GPU");
    assert!(err.to_string().contains("CPU backend only"), "{err}");
}

/// A software Vulkan adapter (lavapipe in CI) ends a shader invocation's
/// loops after 65,535 iterations in all, so its attention shader is wrong
/// past a few thousand positions: the engine serves no longer context
/// there (SmolLM2's own is 8,192), and refuses a longer request with the
/// usual context-length error.
#[cfg(feature = "wgpu")]
#[tokio::test]
async fn a_software_adapter_caps_the_context_to_what_it_computes_correctly() {
    let adapter = engine::gpu_executor::adapter().expect("a wgpu adapter");
    let config = EngineConfig {
        device: Device::Wgpu,
        scheduler: SchedulerConfig {
            max_model_len: 1 << 20,
            ..Default::default()
        },
        ..Default::default()
    };
    let h = start(common::SMOLLM2, config).expect("SmolLM2 on wgpu");
    let info = h.info();
    match adapter.max_attention_positions(info.head_dim) {
        Some(cap) => {
            assert!(cap < 8192, "{cap}: under the model's own context");
            assert_eq!(info.context_length, cap);
            let over = req(vec![1; cap - 5], 10, None);
            assert!(matches!(
                h.validate(over).and_then(|r| h.submit(r)),
                Err(EngineError::ContextLength { max_context, .. }) if max_context == cap
            ));
        }
        None => assert_eq!(info.context_length, 8192, "{} has no cap", adapter.name),
    }
    h.shutdown();
}
