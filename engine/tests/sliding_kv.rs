//! Sliding-window layers in blocks of their own (`KvManager::with_sliding`):
//! the engine generates exactly what it generates when every layer keeps
//! every position (`swa_full`), through chunked prefill, decoding far past
//! the window, concurrent sequences and prefix-cache hits, while a sliding
//! layer holds only the window's blocks.

mod common;

use engine::{
    EngineConfig, EngineHandle, GenerateRequest, SamplingParams, SchedulerConfig, TemplateChoice,
    TokenEvent,
};
use tokio_stream::StreamExt;

/// Gemma 3's block at parity size: five layers sliding over 8 positions,
/// then one global.
const GEMMA3: &str = "synthetic/parity-gemma3.Q8_0.gguf";

fn start(swa_full: bool, block_size: usize) -> EngineHandle {
    start_with(config(swa_full, block_size))
}

fn config(swa_full: bool, block_size: usize) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            // Prompts arrive in several chunks.
            max_num_batched_tokens: 24,
            ..SchedulerConfig::default()
        },
        block_size,
        swa_full,
        ..Default::default()
    }
}

fn start_with(config: EngineConfig) -> EngineHandle {
    EngineHandle::start_gguf(&common::model_path(GEMMA3), &TemplateChoice::Auto, config)
        .expect("load parity-gemma3")
}

fn req(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_tokens: prompt,
        params: SamplingParams {
            temperature: 0.0,
            max_tokens,
            ignore_eos: true,
            logprobs: Some(0),
            ..Default::default()
        },
    }
}

/// Greedy tokens and their log-probabilities.
async fn run(h: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let mut s = h
        .validate(req(prompt, max_tokens))
        .and_then(|r| h.submit(r))
        .expect("submit");
    let (mut ids, mut lps) = (Vec::new(), Vec::new());
    while let Some(ev) = s.next().await {
        match ev {
            TokenEvent::Delta {
                token_ids,
                logprobs,
                ..
            } => {
                ids.extend(token_ids);
                lps.extend(logprobs.iter().map(|l| l.logprob));
            }
            TokenEvent::Finished { .. } => return (ids, lps),
            TokenEvent::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("stream ended without a final event");
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + seed * 101) % 250 + 3)
        .collect()
}

#[tokio::test]
async fn sliding_blocks_generate_what_full_tables_generate() {
    for block_size in [4, 16] {
        let (full, swa) = (start(true, block_size), start(false, block_size));
        assert_eq!(full.info().sliding_kv_blocks, 0);
        assert!(swa.info().sliding_kv_blocks > 0, "no sliding group");
        // Alone, far past the window (prompt 50, 40 decoded).
        let a = prompt(1, 50);
        let want = run(&full, a.clone(), 40).await;
        assert_eq!(run(&swa, a.clone(), 40).await, want, "bs {block_size}");
        // The same prompt again starts from the prefix cache.
        let queries = swa.stats().prefix_hits;
        assert_eq!(
            run(&swa, a.clone(), 40).await,
            want,
            "bs {block_size}: cached"
        );
        assert!(swa.stats().prefix_hits > queries, "no prefix hit");
        // Four at once, sharing a prefix, of different lengths.
        let prompts: Vec<Vec<u32>> = (0..4)
            .map(|i| {
                let mut p = a[..20 + 7 * i].to_vec();
                p.extend(prompt(10 + i as u32, 9 + 5 * i));
                p
            })
            .collect();
        let wants = futures_join(&full, &prompts).await;
        assert_eq!(futures_join(&swa, &prompts).await, wants, "bs {block_size}");
        full.shutdown();
        swa.shutdown();
    }
}

async fn futures_join(h: &EngineHandle, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<f32>)> {
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (h, p) = (h.clone(), p.clone());
            tokio::spawn(async move { run(&h, p, 30).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

#[tokio::test]
async fn a_long_sequence_holds_the_window_not_the_context_in_sliding_layers() {
    // One sequence of 1000 positions in blocks of 4: the global layer
    // holds 250 blocks either way; the five sliding layers hold 250 each
    // with full tables, and at most their pool (every running sequence's
    // window and a step: 4 * (2 + 2) + 6 = 22 blocks) without.
    let (full, swa) = (start(true, 4), start(false, 4));
    assert_eq!(swa.info().sliding_kv_blocks, 22);
    let p = prompt(3, 900);
    let want = run(&full, p.clone(), 100).await;
    assert_eq!(run(&swa, p, 100).await, want);
    let (f, s) = (full.stats().kv_bytes, swa.stats().kv_bytes);
    let block = f / (250 * 6);
    assert_eq!(f, 250 * 6 * block, "full tables: every layer's 250 blocks");
    assert!(
        s <= (250 + 22 * 5) * block,
        "{s} bytes for 250 + 22 * 5 blocks of {block}"
    );
    eprintln!(
        "KV bytes of one 1000-position sequence: {f} full, {s} sliding ({:.2}x)",
        f as f64 / s as f64
    );
    full.shutdown();
    swa.shutdown();
}

async fn run_handoff(
    e: &EngineHandle,
    prompt: &[u32],
    max_tokens: usize,
    resume: Vec<u32>,
    h: engine::core::Handoff,
) -> Vec<u32> {
    let mut r = req(prompt.to_vec(), max_tokens);
    r.params.logprobs = None;
    let mut s = e
        .validate(r)
        .and_then(|r| e.submit_handoff(r, resume, h))
        .expect("submit");
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        match ev {
            engine::core::CoreEvent::Token { id, .. } => out.push(id),
            engine::core::CoreEvent::Finished { .. } => return out,
            engine::core::CoreEvent::Failed(e) => panic!("failed: {e}"),
            engine::core::CoreEvent::Accepted => {}
        }
    }
    panic!("no end")
}

/// Prefill on one engine, decode on another, both keeping sliding blocks
/// of their own: the prefill engine starts from its prefix cache (whose
/// sliding blocks behind the window were released) yet streams every
/// layer's rows from where the decode engine's cache ends; the decode
/// engine's check of the rows passes and it answers as one engine would.
#[tokio::test]
async fn rows_stream_whole_between_engines_that_release_sliding_blocks() {
    let (p, d) = (start(false, 4), start(false, 4));
    let prompt = prompt(5, 90);
    let whole = run_handoff(&p, &prompt, 12, Vec::new(), Default::default()).await;
    run_handoff(&d, &prompt[..40], 1, Vec::new(), Default::default()).await;
    let from = d.cached_prefix(prompt.clone()).await.expect("probe");
    assert_eq!(from, 40, "the decode engine's own blocks of the prompt");
    // `p` holds the whole prompt in its prefix cache: it samples the first
    // token from there and streams the cached rows.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let export = engine::core::Handoff {
        export: Some((from, tx)),
        ..Default::default()
    };
    let first = run_handoff(&p, &prompt, 1, Vec::new(), export).await;
    assert_eq!(first, whole[..1]);
    let mut parts = Vec::new();
    while let Some(rows) = rx.recv().await {
        parts.push(rows);
    }
    let rows = engine::kv_cache::transfer::KvRows::concat(&parts).expect("contiguous");
    assert_eq!((rows.first, rows.end()), (40, 90));
    // No layer's row is missing (a released one would read as zeros).
    let width = rows.layers[0].len() / rows.count / 2;
    let rows_layers = rows.layers.len();
    for (l, bytes) in rows.layers.iter().enumerate() {
        for (i, row) in bytes.chunks(width).enumerate() {
            assert!(row.iter().any(|&b| b != 0), "layer {l}, row {i} is zeros");
        }
    }
    let (tx, verdict) = tokio::sync::oneshot::channel();
    let import = engine::core::Handoff {
        import: Some(rows),
        verdict: Some(tx),
        ..Default::default()
    };
    let rest = run_handoff(&d, &prompt, 12, first.clone(), import).await;
    assert_eq!(rest, whole[1..]);
    assert_eq!(verdict.await.expect("told"), Ok(()));
    // A hostile prefill worker's rows (zeroed): on an engine holding the
    // first 40 positions, the check refuses them and the prompt is
    // recomputed; rows of the whole prompt, more than the sliding pool
    // could hold until checked, are not taken at all. Both answers right.
    let forge = |first: usize| {
        let count = 90 - first;
        let zeroed = engine::kv_cache::transfer::KvRows {
            first,
            count,
            layers: vec![vec![0; count * width * 2]; rows_layers],
        };
        let (tx, verdict) = tokio::sync::oneshot::channel();
        let h = engine::core::Handoff {
            import: Some(zeroed),
            verdict: Some(tx),
            ..Default::default()
        };
        (h, verdict)
    };
    let warm = start(false, 4);
    run_handoff(&warm, &prompt[..40], 1, Vec::new(), Default::default()).await;
    let (h, verdict) = forge(40);
    assert_eq!(
        run_handoff(&warm, &prompt, 12, first.clone(), h).await,
        whole[1..]
    );
    let why = verdict
        .await
        .expect("told")
        .expect_err("forged rows refused");
    assert!(why.contains("differs from its recomputation"), "{why}");
    let fresh = start(false, 4);
    let (h, verdict) = forge(0);
    assert_eq!(run_handoff(&fresh, &prompt, 12, first, h).await, whole[1..]);
    let why = verdict
        .await
        .expect("told")
        .expect_err("rows past the pool taken");
    assert!(why.contains("sliding-window layers cannot hold"), "{why}");
    warm.shutdown();
    fresh.shutdown();
    p.shutdown();
    d.shutdown();
}

/// On the wgpu backend (lavapipe in CI) the sliding layers keep a pool of
/// their own too: the GPU sizes each layer's buffers by its pool, so the
/// same memory buys the global layer more blocks, and the engine generates
/// exactly what it generates there with full tables, alone far past the
/// window and four at once.
#[cfg(feature = "wgpu")]
#[tokio::test]
async fn on_wgpu_sliding_layers_keep_their_own_pool_and_generate_what_full_tables_generate() {
    let memory = 2 << 20;
    let on = |swa_full| {
        start_with(EngineConfig {
            device: engine::Device::Wgpu,
            kv_cache_memory: memory,
            ..config(swa_full, 4)
        })
    };
    let (full, swa) = (on(true), on(false));
    assert_eq!(full.info().sliding_kv_blocks, 0);
    assert_eq!(swa.info().sliding_kv_blocks, 22);
    assert!(
        swa.info().kv_blocks > 2 * full.info().kv_blocks,
        "the global layer's pool: {} blocks, {} with full tables",
        swa.info().kv_blocks,
        full.info().kv_blocks
    );
    let a = prompt(1, 50);
    assert_eq!(
        run(&swa, a.clone(), 40).await,
        run(&full, a.clone(), 40).await
    );
    for h in [&full, &swa] {
        let bytes = h.stats().kv_bytes as usize;
        assert!(
            bytes <= memory && bytes > memory * 9 / 10,
            "{bytes} of {memory}"
        );
    }
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let mut p = a[..20 + 7 * i].to_vec();
            p.extend(prompt(10 + i as u32, 9 + 5 * i));
            p
        })
        .collect();
    let wants = futures_join(&full, &prompts).await;
    assert_eq!(futures_join(&swa, &prompts).await, wants);
    full.shutdown();
    swa.shutdown();
}

/// A step whose tables cross the pools is refused before it touches the
/// KV: a GPU layer's buffers hold only its own pool's blocks, so a full
/// layer's id in the sliding pool (or a sliding layer's in the other, or
/// no sliding table at all) would read or write outside them.
#[test]
fn tables_that_cross_the_pools_are_refused() {
    use engine::kv_cache::{KvLayout, SlidingBlocks};
    use engine::model::{ModelBatch, SeqChunk};
    let loaded = engine::loader::load_gguf(&common::model_path(GEMMA3), &TemplateChoice::Auto)
        .expect("load");
    let mc = &loaded.model.config;
    let layout = KvLayout {
        sliding: Some(SlidingBlocks {
            layers: SlidingBlocks::mask(mc.n_layer, |l| mc.window(l) > 0).expect("mask"),
            first: 8,
        }),
        ..mc.kv_layout(4, 12)
    };
    let mut kv = kernels::cpu::kv::KvStorage::new(layout);
    let mut step = |block_table: Vec<u32>, swa_table: Vec<u32>| {
        let chunk = SeqChunk {
            seq: engine::RequestId(1),
            tokens: vec![5, 6, 7, 8, 9],
            start_pos: 0,
            want_logits: true,
            block_table,
            swa_table,
            draft: Vec::new(),
        };
        let batch = ModelBatch {
            chunks: vec![chunk],
        };
        loaded.model.forward(&batch, &mut kv).map(|_| ())
    };
    step(vec![0, 1], vec![8, 9]).expect("each table in its pool");
    for (full, swa, why) in [
        (vec![0, 9], vec![8, 10], "block 9 is outside"),
        (vec![0, 1], vec![8, 2], "sliding-window block 2"),
        (vec![0, 1], vec![], "no sliding-window block table"),
    ] {
        let err = step(full, swa).expect_err(why).to_string();
        assert!(err.contains(why), "{err}");
    }
}
