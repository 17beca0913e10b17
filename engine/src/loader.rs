//! Loading a generative model from a GGUF file: weights, the tokenizer
//! rebuilt from metadata, and the chat template stored beside them.

use std::path::Path;

use candle_core::quantized::gguf_file;

use crate::chat::{ChatTemplate, TemplateChoice};
use crate::error::{EngineError, Result};
use crate::model::llama::Llama;
use crate::tokenizer::TextTokenizer;
use crate::tokenizer::gguf::tokenizer_from_gguf;

/// Everything a text engine needs from one model file.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
}

/// Loads `path` (a llama-family GGUF).
pub fn load_gguf(path: &Path, template: &TemplateChoice) -> Result<LoadedModel> {
    let file = std::fs::File::open(path)
        .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?;
    let mut reader = std::io::BufReader::new(file);
    let ct = gguf_file::Content::read(&mut reader).map_err(|e| {
        if let Some((name, ty)) = crate::gguf_types::unreadable_tensor(path) {
            return EngineError::Load(format!(
                "{}: tensor `{name}` is {}, a type this engine does not read \
                 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K)",
                path.display(),
                crate::gguf_types::type_name(ty)
            ));
        }
        EngineError::Load(format!(
            "{} is not a readable GGUF file: {e}",
            path.display()
        ))
    })?;
    let model = Llama::load(&ct, &mut reader)?;
    let (tok, special) = tokenizer_from_gguf(&ct.metadata)?;
    let tokenizer = TextTokenizer::new(tok, special);
    let stored = ct
        .metadata
        .get("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok());
    let source = template.resolve(stored.map(String::as_str))?;
    let template = ChatTemplate::new(&source, tokenizer.bos_text(), tokenizer.eos_text())?;
    tracing::info!(
        path = %path.display(),
        arch = %model.config.architecture,
        layers = model.config.n_layer,
        vocab = model.config.vocab_size,
        "loaded GGUF model"
    );
    Ok(LoadedModel {
        model,
        tokenizer,
        template,
    })
}
