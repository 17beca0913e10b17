//! all-MiniLM-L6-v2 through `EmbeddingHandle` against published values.

mod common;

use engine::EmbeddingHandle;

/// sentence-transformers' reference embedding of "This is an example sentence".
const REFERENCE: [f32; 6] = [
    0.06765693, 0.06349593, 0.04871314, 0.07930495, 0.03744806, 0.00265273,
];

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test]
async fn minilm_matches_the_reference_embedding() {
    let h = EmbeddingHandle::start(&common::model_path(common::MINILM)).expect("load");
    let out = h
        .embed(vec!["This is an example sentence".into()])
        .await
        .expect("embed");
    let v = &out.vectors[0];
    assert_eq!(v.len(), 384);
    for (got, want) in v.iter().zip(REFERENCE) {
        assert!((got - want).abs() < 1e-4, "{:?} vs {REFERENCE:?}", &v[..6]);
    }
    assert!((dot(v, v) - 1.0).abs() < 1e-4, "not unit length");
}

#[tokio::test]
async fn padding_in_a_batch_does_not_change_an_embedding() {
    let h = EmbeddingHandle::start(&common::model_path(common::MINILM)).expect("load");
    let short = "This is an example sentence".to_string();
    let long =
        "A much longer sentence that forces the short one in the same batch to be padded a lot"
            .to_string();
    let alone = h.embed(vec![short.clone()]).await.expect("embed");
    let batch = h.embed(vec![long, short]).await.expect("embed");
    let d = alone.vectors[0]
        .iter()
        .zip(&batch.vectors[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(d < 1e-5, "padding changed the embedding by {d}");
    // Similar sentences are closer than unrelated ones.
    let s = h
        .embed(vec![
            "A cat sits on the mat".into(),
            "A kitten is sitting on a rug".into(),
            "Quarterly revenue grew".into(),
        ])
        .await
        .expect("embed");
    assert!(dot(&s.vectors[0], &s.vectors[1]) > dot(&s.vectors[0], &s.vectors[2]) + 0.2);
}

#[tokio::test]
async fn inputs_past_the_position_limit_are_truncated_not_fatal() {
    let h = EmbeddingHandle::start(&common::model_path(common::MINILM)).expect("load");
    let long = "word ".repeat(3000);
    let out = h.embed(vec![long]).await.expect("embed");
    assert_eq!(out.prompt_tokens, h.max_tokens);
}

#[tokio::test]
async fn concurrent_requests_merged_into_one_pass_get_their_own_vectors_and_counts() {
    let h = EmbeddingHandle::start(&common::model_path(common::MINILM)).expect("load");
    let texts: Vec<Vec<String>> = (0..12)
        .map(|i| {
            (0..1 + i % 3)
                .map(|j| format!("request {i} sentence {j} {}", "word ".repeat(i + j)))
                .collect()
        })
        .collect();
    let mut alone = Vec::new();
    for t in &texts {
        alone.push(h.embed(t.clone()).await.expect("alone"));
    }
    let together = futures_util::future::join_all(texts.iter().map(|t| h.embed(t.clone()))).await;
    for (a, b) in alone.iter().zip(together) {
        let b = b.expect("together");
        assert_eq!(
            (a.vectors.len(), a.prompt_tokens),
            (b.vectors.len(), b.prompt_tokens)
        );
        for (x, y) in a.vectors.iter().zip(&b.vectors) {
            let d = x
                .iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f32::max);
            assert!(d < 1e-5, "merged embedding differs by {d}");
        }
    }
}

#[test]
fn the_int8_encoder_agrees_with_the_f32_model() {
    use engine::model::bert::BertEmbedder;
    use engine::model::bert_encoder::{BertEncoder, Precision};
    let dir = common::model_path(common::MINILM);
    let f32m = BertEmbedder::load(&dir).expect("f32");
    let q8 = BertEncoder::load(&dir, Precision::Q8).expect("q8");
    let mut tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer");
    tok.with_padding(None); // the shipped tokenizer pads to 128
    let texts = [
        "What is the capital of France?",
        "Which city is the capital of France?",
        "Convert 25 degrees Celsius to Fahrenheit.",
        "How do I reverse a list in Python?",
        "A much longer sentence about the weather, the sea, and the small boats in the harbour at dawn.",
    ];
    let (want, _) = f32m.embed(&texts.map(String::from)).expect("embed");
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    for text in texts {
        let ids = tok.encode(text, true).expect("encode").get_ids().to_vec();
        got.push(q8.embed_ids(&ids).expect("q8 embed"));
    }
    let per = t.elapsed().as_secs_f64() * 1e3 / texts.len() as f64;
    eprintln!("int8 encoder: {per:.2} ms per sentence");
    for (g, w) in got.iter().zip(&want) {
        assert!(
            dot(g, w) > 0.995,
            "cosine to the f32 embedding {}",
            dot(g, w)
        );
        assert!((dot(g, g) - 1.0).abs() < 1e-4);
    }
    // Similarities keep their order and nearly their values.
    let sim = |v: &[Vec<f32>], a: usize, b: usize| dot(&v[a], &v[b]);
    for (a, b) in [(0, 1), (0, 2), (1, 3), (2, 4)] {
        assert!(
            (sim(&got, a, b) - sim(&want, a, b)).abs() < 0.01,
            "pair {a},{b}"
        );
    }
}

/// candle's BERT (the f32 path the embeddings API used before the compute
/// backend) as the reference: padded, masked, one batch.
fn candle_reference(dir: &std::path::Path, texts: &[&str]) -> Vec<Vec<f32>> {
    use candle_core::{DType, Device, Tensor};
    use candle_transformers::models::bert::{BertModel, Config};
    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("config");
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("weights");
    let vb = candle_nn::VarBuilder::from_buffered_safetensors(bytes, DType::F32, &Device::Cpu)
        .expect("weights");
    let model = BertModel::load(vb, &config).expect("model");
    let mut tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer");
    tok.with_padding(Some(tokenizers::PaddingParams::default()));
    let enc = tok
        .encode_batch(texts.iter().map(|t| t.to_string()).collect(), true)
        .expect("encode");
    let (rows, len) = (enc.len(), enc[0].len());
    let flat = |f: &dyn Fn(&tokenizers::Encoding) -> &[u32]| -> Vec<u32> {
        enc.iter().flat_map(|e| f(e).iter().copied()).collect()
    };
    let t = |v: Vec<u32>| Tensor::from_vec(v, (rows, len), &Device::Cpu).expect("tensor");
    let mask = t(flat(&|e| e.get_attention_mask()));
    let hidden = model
        .forward(
            &t(flat(&|e| e.get_ids())),
            &t(flat(&|e| e.get_type_ids())),
            Some(&mask),
        )
        .expect("forward");
    let maskf = mask
        .to_dtype(DType::F32)
        .expect("f32")
        .unsqueeze(2)
        .expect("2d");
    let mean = hidden
        .broadcast_mul(&maskf)
        .and_then(|h| h.sum(1))
        .and_then(|s| s.broadcast_div(&maskf.sum(1).expect("count")))
        .expect("mean");
    let norm = mean
        .sqr()
        .and_then(|m| m.sum_keepdim(1))
        .and_then(|m| m.sqrt())
        .expect("norm");
    mean.broadcast_div(&norm)
        .and_then(|u| u.to_vec2::<f32>())
        .expect("unit")
}

#[test]
fn the_backend_encoder_matches_candles_bert_in_a_mixed_batch() {
    use engine::model::bert::BertEmbedder;
    let dir = common::model_path(common::MINILM);
    let texts = [
        "This is an example sentence",
        "A much longer sentence about the weather, the sea, and the small boats in the harbour at dawn, and the gulls.",
        "Hi",
        "Convert 25 degrees Celsius to Fahrenheit.",
    ];
    let want = candle_reference(&dir, &texts);
    let model = BertEmbedder::load(&dir).expect("load");
    let (got, counts) = model.embed_each(&texts.map(String::from)).expect("embed");
    assert_eq!(counts[2], 3, "[CLS] hi [SEP], unpadded");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let err = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 2e-5, "input {i}: {err}");
    }
}

#[tokio::test]
async fn counting_tokens_agrees_with_embedding_them() {
    let h = EmbeddingHandle::start(&common::model_path(common::MINILM)).expect("load");
    let texts = vec![
        "This is an example sentence".to_string(),
        "word ".repeat(700),
        "A cat".to_string(),
    ];
    let inputs = engine::EmbedInput::Texts(texts.clone());
    let counted = h.count_tokens(&inputs).expect("count");
    let embedded = h.embed(texts).await.expect("embed").prompt_tokens;
    assert_eq!(counted, embedded);
    assert!(
        counted > h.max_tokens,
        "the long one is truncated, not dropped"
    );
    let ids = engine::EmbedInput::Tokens(vec![vec![101, 7592, 102], vec![101; 900]]);
    assert_eq!(h.count_tokens(&ids).expect("count"), 3 + h.max_tokens);
}
