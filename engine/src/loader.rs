//! Loading a generative model from a GGUF file: weights, the tokenizer
//! rebuilt from metadata, and the chat template stored beside them.

use std::path::Path;

use crate::chat::{ChatTemplate, TemplateChoice};
use crate::error::{EngineError, Result};
use crate::generation::GenerationDefaults;
use crate::model::llama::{Llama, LlamaConfig};
use crate::tokenizer::TextTokenizer;
use crate::tokenizer::gguf::tokenizer_from_gguf;

/// Everything a text engine needs from one model file.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
    /// The model's sampling defaults (its GGUF keys, then a
    /// `generation_config.json` beside the file).
    pub generation: GenerationDefaults,
}

/// Loads `path` (a llama-family GGUF).
pub fn load_gguf(path: &Path, template: &TemplateChoice) -> Result<LoadedModel> {
    let (front, ct, mut reader) = read_front(path, template)?;
    finish(front, &ct, &mut reader, &path.display().to_string())
}

/// Loads a llama-family GGUF held in memory (a browser tab has no files):
/// `name` names it in errors. Sampling defaults come from its metadata
/// alone (there is no directory beside it).
pub fn load_gguf_bytes(bytes: &[u8], name: &str, template: &TemplateChoice) -> Result<LoadedModel> {
    let mut reader = std::io::Cursor::new(bytes);
    let (front, ct) = read_front_from(&mut reader, name, None, template)?;
    finish(front, &ct, &mut reader, name)
}

/// The weights after the front: the whole model.
fn finish<R: std::io::Read + std::io::Seek>(
    front: ModelFront,
    ct: &crate::gguf::Gguf,
    reader: &mut R,
    name: &str,
) -> Result<LoadedModel> {
    let model = Llama::load(ct, reader)?;
    tracing::info!(
        path = %name,
        arch = %model.config.architecture,
        layers = model.config.n_layer,
        vocab = model.config.vocab_size,
        "loaded GGUF model"
    );
    Ok(LoadedModel {
        model,
        tokenizer: front.tokenizer,
        template: front.template,
        generation: front.generation,
    })
}

/// Everything a text engine needs from a model file but the weights: what
/// a server that runs the model as a pipeline of workers reads.
#[derive(Debug)]
pub struct ModelFront {
    pub config: LlamaConfig,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
    pub generation: GenerationDefaults,
}

/// Reads `path`'s metadata alone (no weights).
pub fn load_front(path: &Path, template: &TemplateChoice) -> Result<ModelFront> {
    Ok(read_front(path, template)?.0)
}

fn read_front(
    path: &Path,
    template: &TemplateChoice,
) -> Result<(
    ModelFront,
    crate::gguf::Gguf,
    std::io::BufReader<std::fs::File>,
)> {
    let file = std::fs::File::open(path)
        .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?;
    let mut reader = std::io::BufReader::new(file);
    let name = path.display().to_string();
    let (front, ct) = read_front_from(&mut reader, &name, path.parent(), template)?;
    Ok((front, ct, reader))
}

/// The front of the GGUF `reader` reads (`name` in errors), with the
/// sampling defaults of a `generation_config.json` in `beside` if any.
fn read_front_from<R: std::io::Read + std::io::Seek>(
    reader: &mut R,
    name: &str,
    beside: Option<&Path>,
    template: &TemplateChoice,
) -> Result<(ModelFront, crate::gguf::Gguf)> {
    let ct =
        crate::gguf::Gguf::read(reader).map_err(|e| EngineError::Load(format!("{name}: {e}")))?;
    let config = LlamaConfig::from_gguf(&ct)?;
    let (tok, special) = tokenizer_from_gguf(&ct.metadata)?;
    let tokenizer = TextTokenizer::new(tok, special);
    let stored = ct
        .metadata
        .get("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok());
    let source = template.resolve(stored.map(String::as_str))?;
    let template = ChatTemplate::new(&source, tokenizer.bos_text(), tokenizer.eos_text())?;
    let beside = beside.map_or(Ok(GenerationDefaults::default()), |d| {
        GenerationDefaults::from_dir(d)
    });
    let generation =
        GenerationDefaults::from_gguf(&ct.metadata).then(beside.map_err(EngineError::Load)?);
    let front = ModelFront {
        config,
        tokenizer,
        template,
        generation,
    };
    Ok((front, ct))
}
