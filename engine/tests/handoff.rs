//! Prefill on one engine, decode on another (the fleet's disaggregation,
//! engine side): the prefill engine streams its prompt's KV rows as it
//! computes them, from where the decode engine's prefix cache ends; the
//! decode engine starts from those rows and the prefill engine's first
//! token, and generates exactly what one engine alone would have. It
//! checks the rows by recomputing a few positions first: forged ones are
//! refused (and recomputed), and imported rows never enter its prefix
//! cache.

mod common;

use engine::core::{CoreEvent, Handoff};
use engine::kv_cache::transfer::KvRows;
use engine::{
    EngineConfig, EngineHandle, FinishReason, GenerateRequest, SamplingParams, SchedulerConfig,
};

/// An engine whose prefill runs in chunks of at most 32 tokens.
fn engine() -> EngineHandle {
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 32,
            ..Default::default()
        },
        ..Default::default()
    };
    EngineHandle::start_gguf(
        &common::model_path(common::SMOLLM2),
        &Default::default(),
        config,
    )
    .expect("load")
}

async fn run(e: &EngineHandle, req: &GenerateRequest, resume: Vec<u32>, h: Handoff) -> Vec<u32> {
    let mut s = e
        .validate(req.clone())
        .and_then(|r| e.submit_handoff(r, resume, h))
        .expect("submit");
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        match ev {
            CoreEvent::Accepted => {}
            CoreEvent::Token { id, .. } => out.push(id),
            CoreEvent::Finished { reason, .. } => {
                assert_ne!(reason, FinishReason::Abort);
                return out;
            }
            CoreEvent::Failed(e) => panic!("failed: {e}"),
        }
    }
    panic!("no end")
}

#[tokio::test]
async fn a_sequence_prefilled_on_one_engine_decodes_on_another_as_if_it_had_stayed() {
    let (p, d) = (engine(), engine());
    let prompt: Vec<u32> = (0..90).map(|i| 300 + i * 7).collect();
    let req = |max_tokens| GenerateRequest {
        prompt_tokens: prompt.clone(),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens,
            ignore_eos: true,
            ..Default::default()
        },
    };
    let whole = run(&p, &req(12), Vec::new(), Handoff::default()).await;
    // The decode engine ran the first 40 tokens before: it holds two
    // 16-token blocks of the prompt, which are not sent again.
    let warm = GenerateRequest {
        prompt_tokens: prompt[..40].to_vec(),
        params: req(1).params,
    };
    run(&d, &warm, Vec::new(), Handoff::default()).await;
    let from = d.cached_prefix(prompt.clone()).await.expect("probe");
    assert_eq!(from, 32);
    // The prefill engine (which has the whole prompt cached from the
    // reference run: cached rows are streamed too) samples the first token.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let export = Handoff {
        export: Some((from, tx)),
        ..Default::default()
    };
    let fresh = engine();
    let first = run(&fresh, &req(1), Vec::new(), export).await;
    assert_eq!(first, whole[..1]);
    let mut parts = Vec::new();
    while let Some(rows) = rx.recv().await {
        parts.push(rows);
    }
    assert!(
        parts.len() >= 2,
        "streamed as prefill went: {}",
        parts.len()
    );
    let rows = KvRows::concat(&parts).expect("contiguous");
    assert_eq!((rows.first, rows.end()), (32, 90));
    assert_eq!(rows.layers.len(), 30);
    assert_eq!(rows.layers[0].len(), 58 * 2 * 3 * 64 * 2, "f16 K and V");
    let decode = |rows: KvRows| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let h = Handoff {
            import: Some(rows),
            verdict: Some(tx),
            ..Default::default()
        };
        (h, rx)
    };
    let (h, verdict) = decode(rows.clone());
    let rest = run(&d, &req(12), first.clone(), h).await;
    assert_eq!(rest, whole[1..], "the moved sequence went another way");
    assert_eq!(verdict.await.expect("told"), Ok(()));
    // What another worker computed serves this request only: the decode
    // engine's prefix cache still ends where its own blocks do.
    assert_eq!(d.cached_prefix(prompt.clone()).await.expect("probe"), 32);
    // Forged rows (zeroed, of the whole prompt, on a fresh engine) fail
    // the check and are recomputed: the answer is still right.
    let zeroed = KvRows {
        first: 0,
        count: 90,
        layers: vec![vec![0; 90 * 2 * 3 * 64 * 2]; 30],
    };
    let (h, verdict) = decode(zeroed);
    let other = run(&engine(), &req(12), first.clone(), h).await;
    assert_eq!(other, whole[1..]);
    let why = verdict
        .await
        .expect("told")
        .expect_err("forged rows refused");
    assert!(why.contains("differs from its recomputation"), "{why}");
    // Rows that do not start where the cache ends are recomputed: right.
    let late = KvRows::concat(&parts[1..]).expect("contiguous");
    let (h, verdict) = decode(late);
    let again = run(&engine(), &req(12), first, h).await;
    assert_eq!(again, whole[1..]);
    assert!(verdict.await.expect("told").is_err());
}
