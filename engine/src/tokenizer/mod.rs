//! The text side of a model: `TextTokenizer` wraps a `tokenizers::Tokenizer`
//! with the model's special tokens; `detok` turns token streams back into
//! text incrementally, and `stop` finds stop strings in that text.

pub mod detok;
pub mod gguf;
mod spm;
pub mod stop;

use std::collections::BTreeSet;

use tokenizers::Tokenizer;

use crate::error::{EngineError, Result};
pub use gguf::SpecialTokens;

/// End-of-generation markers llama.cpp also treats as EOS when present.
const EOG_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "<|endoftext|>",
    "</s>",
    "<end_of_turn>",
];

/// A tokenizer plus the ids that matter to generation.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    special: SpecialTokens,
    eog: BTreeSet<u32>,
    bos_text: String,
    eos_text: String,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.vocab_size())
            .field("special", &self.special)
            .field("eog", &self.eog)
            .finish()
    }
}

impl TextTokenizer {
    pub fn new(inner: Tokenizer, special: SpecialTokens) -> Self {
        let mut eog: BTreeSet<u32> = EOG_TOKENS
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        eog.extend(special.eos);
        let text_of = |id: Option<u32>| id.and_then(|i| inner.id_to_token(i)).unwrap_or_default();
        let bos_text = text_of(special.bos);
        let eos_text = text_of(special.eos);
        Self {
            inner,
            special,
            eog,
            bos_text,
            eos_text,
        }
    }

    /// Encodes a prompt: special tokens in the text (chat markers) are
    /// matched whole, and BOS is prepended when the model asks for it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.special.add_bos
            && let Some(bos) = self.special.bos
            && (self.bos_text.is_empty() || !text.starts_with(&self.bos_text))
        {
            ids.push(bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Decodes ids to text, dropping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// The vocabulary entry of one token (raw, not decoded).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Token ids that end generation.
    /// The model's special tokens (BOS, EOS, whether BOS is added).
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    pub fn eog_ids(&self) -> &BTreeSet<u32> {
        &self.eog
    }

    pub fn bos_text(&self) -> &str {
        &self.bos_text
    }

    pub fn eos_text(&self) -> &str {
        &self.eos_text
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The wrapped Hugging Face tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}
