//! Shared helpers for the engine integration tests: where the models are.

use std::path::PathBuf;

/// The models directory (`SYNOR_MODELS_DIR`, else `<workspace>/models`).
pub fn models_dir() -> PathBuf {
    std::env::var_os("SYNOR_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"))
}

/// Path of a model file, failing loudly (with the fix) when it is missing.
pub fn model_path(rel: &str) -> PathBuf {
    let p = models_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `make models` first",
        p.display()
    );
    p
}

#[allow(dead_code)]
pub const SMOLLM2: &str = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
#[allow(dead_code)]
pub const TINY: &str = "tiny/tiny.gguf";
/// The small synthetic models of the architectures beyond llama's block
/// (`make synthetic`): Qwen3, Qwen3-MoE, Mixtral, Gemma 3.
#[allow(dead_code)]
pub const ARCH_MODELS: [&str; 6] = [
    "synthetic/parity-qwen3.Q4_K.gguf",
    "synthetic/parity-qwen3moe.Q4_K.gguf",
    "synthetic/parity-mixtral.Q8_0.gguf",
    "synthetic/parity-gemma3.Q8_0.gguf",
    "synthetic/parity-gemma2.Q8_0.gguf",
    "synthetic/parity-phi.Q4_K.gguf",
];
#[allow(dead_code)]
pub const MINILM: &str = "all-minilm-l6-v2";

/// A stream's token ids, to its end (a failure fails the test).
#[allow(dead_code)]
pub async fn drain(mut s: engine::RequestStream) -> Vec<u32> {
    use futures_util::StreamExt;
    let mut ids = Vec::new();
    while let Some(ev) = s.next().await {
        match ev {
            engine::TokenEvent::Delta { token_ids, .. } => ids.extend(token_ids),
            engine::TokenEvent::Finished { .. } => return ids,
            engine::TokenEvent::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("stream ended without a final event")
}
