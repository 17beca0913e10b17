//! What the engine's benches share: which model they time.

use std::path::PathBuf;

/// The default model, or the GGUF at `SYNOR_BENCH_MODEL` (a
/// `synor-genmodel` shape, say).
pub fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SYNOR_BENCH_MODEL") {
        return PathBuf::from(p);
    }
    std::env::var_os("SYNOR_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"))
        .join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
}
