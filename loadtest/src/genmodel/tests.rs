//! A small model of the generator's layout: its tensors, types and
//! metadata read back, and the engine loads it and runs a forward pass.

use super::*;

fn models_dir() -> std::path::PathBuf {
    std::env::var_os("SYNOR_MODELS_DIR").map_or_else(
        || std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")),
        std::path::PathBuf::from,
    )
}

const SMALL: Shape = Shape {
    name: "small",
    arch: "qwen2",
    hidden: 256,
    layers: 8,
    heads: 4,
    kv_heads: 2,
    ffn: 512,
    vocab: 49_160,
    qkv_bias: true,
    ..PARITY
};

#[test]
fn a_q4_k_m_model_reads_back_with_llama_cpp_s_layout_and_the_engine_loads_it() {
    let tok = models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = std::env::temp_dir().join(format!("synor-genmodel-{}.gguf", std::process::id()));
    generate(&SMALL, Quant::Q4KM, &tok, &out, 7).expect("generate");
    let mut f = std::fs::File::open(&out).expect("open");
    let ct = Gguf::read(&mut f).expect("read");
    let ty = types(&ct);
    // 1 embedding, 12 per layer (with the three biases), the norm, the output.
    assert_eq!(ty.len(), 1 + 12 * SMALL.layers + 2);
    assert_eq!(ty["token_embd.weight"], TensorType::Q4K);
    assert_eq!(ty["output.weight"], TensorType::Q6K);
    assert_eq!(ty["blk.0.attn_q.bias"], TensorType::F32);
    // More bits on layers 0, 3, 6 and 7 of 8, as llama.cpp gives them.
    for i in 0..SMALL.layers {
        let want = if [0, 3, 6, 7].contains(&i) {
            TensorType::Q6K
        } else {
            TensorType::Q4K
        };
        assert_eq!(ty[&format!("blk.{i}.attn_v.weight")], want, "layer {i}");
        assert_eq!(ty[&format!("blk.{i}.ffn_down.weight")], want, "layer {i}");
        assert_eq!(
            ty[&format!("blk.{i}.ffn_up.weight")],
            TensorType::Q4K,
            "layer {i}"
        );
    }
    let dims = ct.tensors["blk.0.attn_k.weight"].dims.clone();
    assert_eq!(dims, [128, 256], "kv_heads * head_dim rows");
    let Value::Array(tokens) = &ct.metadata["tokenizer.ggml.tokens"] else {
        panic!("the tokens are not a list");
    };
    assert_eq!(tokens.len(), SMALL.vocab, "padded to the vocabulary");
    let loaded = engine::loader::load_gguf(&out, &engine::TemplateChoice::ChatMl).expect("load");
    let c = &loaded.model.config;
    assert_eq!(
        (c.n_layer, c.hidden, c.n_head, c.n_kv_head, c.vocab_size),
        (8, 256, 4, 2, 49_160)
    );
    assert!(c.rope.neox, "qwen2 pairs RoPE halves");
    let _ = std::fs::remove_file(out);
}

#[test]
fn a_llama_3_model_carries_its_rope_factors_and_the_engine_reads_them() {
    let tok = models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = std::env::temp_dir().join(format!("synor-genmodel-l3-{}.gguf", std::process::id()));
    let shape = Shape {
        name: "small-llama3",
        arch: "llama",
        qkv_bias: false,
        rope_theta: 500_000.0,
        llama3_rope: Some((32.0, 1.0, 4.0, 8192.0)),
        layers: 2,
        ..SMALL
    };
    generate(&shape, Quant::Q4_0, &tok, &out, 7).expect("generate");
    let loaded = engine::loader::load_gguf(&out, &engine::TemplateChoice::ChatMl).expect("load");
    let _ = std::fs::remove_file(out);
    let rope = &loaded.model.config.rope;
    let got = rope.freq_factors.as_ref().expect("rope_freqs.weight read");
    assert_eq!(got.len(), 32, "one per rotary pair of a 64-wide head");
    // Fast pairs untouched, slow ones divided by the factor, a ramp between.
    assert_eq!((got[0], got[31]), (1.0, 32.0), "{got:?}");
    assert!(got.windows(2).all(|w| w[0] <= w[1]), "{got:?}");
    assert!(got.iter().any(|f| *f > 1.0 && *f < 32.0), "{got:?}");
}

#[test]
fn a_qwen3_moe_model_carries_its_experts_and_the_engine_routes_them() {
    let tok = models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = std::env::temp_dir().join(format!("synor-genmodel-moe-{}.gguf", std::process::id()));
    let shape = Shape {
        name: "small-moe",
        layers: 2,
        ..PARITY_QWEN3MOE
    };
    generate(&shape, Quant::Q4KM, &tok, &out, 9).expect("generate");
    let ct = Gguf::read(&mut std::io::BufReader::new(
        std::fs::File::open(&out).expect("open"),
    ))
    .expect("read back");
    let ty = types(&ct);
    assert_eq!(
        ct.tensors["blk.0.ffn_gate_exps.weight"].dims,
        [16, 256, 256]
    );
    assert_eq!(
        ct.tensors["blk.1.ffn_down_exps.weight"].dims,
        [16, 256, 256]
    );
    assert_eq!(
        ct.tensors["blk.0.attn_q.weight"].dims,
        [512, 256],
        "128-wide heads"
    );
    assert_eq!(ct.tensors["blk.0.attn_q_norm.weight"].dims, [128]);
    assert_eq!(
        ty["blk.0.ffn_gate_inp.weight"],
        TensorType::F32,
        "the router"
    );
    assert_eq!(ty["blk.0.ffn_up_exps.weight"], TensorType::Q4K);
    assert_eq!(
        ty["blk.1.ffn_down_exps.weight"],
        TensorType::Q6K,
        "more bits in the last layer"
    );
    let loaded = engine::loader::load_gguf(&out, &engine::TemplateChoice::ChatMl).expect("load");
    let _ = std::fs::remove_file(out);
    let c = &loaded.model.config;
    assert_eq!((c.head_dim, c.q_dim(), c.hidden), (128, 512, 256));
    assert!(c.qk_norm && c.rope.neox);
    let moe = c.moe.expect("experts");
    assert_eq!((moe.n_expert, moe.n_used), (16, 4));
}

#[test]
fn a_gemma3_model_slides_five_layers_of_six_with_their_own_rope() {
    let tok = models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = std::env::temp_dir().join(format!("synor-genmodel-g3-{}.gguf", std::process::id()));
    generate(&PARITY_GEMMA3, Quant::Q4_0, &tok, &out, 5).expect("generate");
    let loaded = engine::loader::load_gguf(&out, &engine::TemplateChoice::ChatMl).expect("load");
    let _ = std::fs::remove_file(out);
    let c = &loaded.model.config;
    let windows: Vec<usize> = (0..6).map(|i| c.window(i)).collect();
    assert_eq!(windows, [8, 8, 8, 8, 8, 0], "llama.cpp's pattern of six");
    assert!(c.gemma && c.qk_norm && c.rope.neox);
    assert_eq!(c.rope.base, 1_000_000.0, "the global layers'");
    let local = c.rope_local.as_ref().expect("the sliding layers' RoPE");
    assert_eq!(local.base, 10_000.0);
    assert_eq!(c.q_scale, 1.0);
    assert!(c.final_softcap.is_none());
}

#[test]
fn shapes_are_consistent_and_quantizations_parse() {
    for s in SHAPES {
        assert_eq!(s.hidden % s.heads, 0, "{}", s.name);
        assert_eq!(s.heads % s.kv_heads, 0, "{}", s.name);
        assert_eq!(shape(s.name).expect("named"), s);
    }
    for s in PARITY_SHAPES {
        assert_eq!(shape(s.name).expect("named"), s);
    }
    assert!(shape("llama-70b").is_err());
    assert_eq!("Q4_K_M".parse::<Quant>(), Ok(Quant::Q4KM));
    assert!("q3".parse::<Quant>().is_err());
}

#[test]
fn a_gemma2_model_slides_every_other_layer_and_caps_its_scores_and_logits() {
    let tok = models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = std::env::temp_dir().join(format!("synor-genmodel-g2-{}.gguf", std::process::id()));
    generate(&PARITY_GEMMA2, Quant::Q4_0, &tok, &out, 5).expect("generate");
    let loaded = engine::loader::load_gguf(&out, &engine::TemplateChoice::ChatMl).expect("load");
    let _ = std::fs::remove_file(out);
    let c = &loaded.model.config;
    let windows: Vec<usize> = (0..4).map(|i| c.window(i)).collect();
    assert_eq!(windows, [8, 0, 8, 0], "llama.cpp's pattern of two");
    assert!(c.gemma && !c.qk_norm);
    assert!(
        c.rope_local.is_none(),
        "Gemma 2's sliding layers turn as the rest"
    );
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(1.0), Some(8.0)));
}

#[test]
fn a_phi3_model_stacks_its_projections_and_turns_by_the_longrope_set_its_context_needs() {
    let tok = models_dir().join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let [long, short] = longrope_factors(48);
    // 8192 positions past an original 1024: the long set; within an
    // original 8192: the short one.
    for (original, want) in [(1024, &long), (8192, &short)] {
        let out = std::env::temp_dir().join(format!(
            "synor-genmodel-phi-{original}-{}.gguf",
            std::process::id()
        ));
        let shape = Shape {
            longrope: Some(original),
            ..PARITY_PHI
        };
        generate(&shape, Quant::Q4_0, &tok, &out, 5).expect("generate");
        let ct = Gguf::read(&mut std::io::BufReader::new(
            std::fs::File::open(&out).expect("open"),
        ))
        .expect("read back");
        assert_eq!(ct.tensors["blk.0.attn_qkv.weight"].dims, [512, 256]);
        assert_eq!(ct.tensors["blk.1.ffn_up.weight"].dims, [1536, 256]);
        assert!(!ct.tensors.contains_key("blk.0.ffn_gate.weight"));
        let loaded =
            engine::loader::load_gguf(&out, &engine::TemplateChoice::ChatMl).expect("load");
        let _ = std::fs::remove_file(out);
        let rope = &loaded.model.config.rope;
        assert_eq!(rope.rot_dim, Some(48), "three quarters of each head turn");
        assert_eq!(
            rope.freq_factors.as_ref(),
            Some(want),
            "original {original}"
        );
        let factor = (1.0 + (8192.0 / original as f32).ln() / (original as f32).ln()).sqrt();
        assert_eq!(rope.attn_factor, factor);
    }
}
