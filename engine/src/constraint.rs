//! Structured output by constrained decoding, with llguidance (the library
//! llama.cpp and mistral.rs use): a grammar (any JSON object, a JSON
//! schema, a regular expression or a Lark grammar) becomes a matcher that,
//! before each sample, masks every token that could not continue a valid
//! output, and allows only end-of-sequence once the output is complete. So
//! the output parses and validates every time, whatever the sampling
//! parameters.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::sampling::TokenMask;
use crate::tokenizer::TextTokenizer;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A JSON schema (OpenAI's `json_schema`, and forced tool calls).
    JsonSchema(Value),
    Regex(String),
    Lark(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Self::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Self::Regex(r) => TopLevelGrammar::from_regex(r),
            Self::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        }
    }
}

/// Asks for compact JSON (no free whitespace between tokens) unless the
/// schema sets its own `x-guidance` options: free whitespace lets a small
/// model pad forever instead of finishing the object.
fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// The bytes each token stands for, as the token trie needs them: special
/// (added) tokens behind llguidance's marker byte so a grammar never
/// produces them by accident; byte-level BPE pieces mapped back through
/// GPT-2's byte alphabet; SentencePiece pieces with `▁` as a space and
/// `<0xNN>` as a raw byte.
fn token_bytes(tokenizer: &TextTokenizer) -> Vec<Vec<u8>> {
    let inner = tokenizer.inner();
    let byte_level = matches!(
        inner.get_decoder(),
        Some(tokenizers::DecoderWrapper::ByteLevel(_))
    );
    let added = inner.get_added_tokens_decoder();
    let unicode_to_byte = gpt2_unicode_to_byte();
    (0..tokenizer.vocab_size() as u32)
        .map(|id| {
            if let Some(t) = added.get(&id) {
                let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                b.extend_from_slice(t.content.as_bytes());
                return b;
            }
            let Some(piece) = inner.id_to_token(id) else {
                return Vec::new();
            };
            if byte_level {
                return piece
                    .chars()
                    .filter_map(|c| unicode_to_byte.get(&c).copied())
                    .collect();
            }
            if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>'))
                && let Ok(b) = u8::from_str_radix(hex, 16)
            {
                return vec![b];
            }
            piece.replace('\u{2581}', " ").into_bytes()
        })
        .collect()
}

/// GPT-2's reversible byte-to-character table, inverted.
fn gpt2_unicode_to_byte() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('?');
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

/// Builds matchers for one tokenizer (the token trie is built once).
pub struct ConstraintFactory {
    factory: ParserFactory,
}

impl std::fmt::Debug for ConstraintFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintFactory").finish_non_exhaustive()
    }
}

impl ConstraintFactory {
    /// `vocab_size` is the width of the model's logits (at least the
    /// tokenizer's vocabulary); `eos` the token that ends a constrained output.
    pub fn new(tokenizer: &TextTokenizer, vocab_size: usize, eos: u32) -> Result<Self> {
        let unsupported = |e: &dyn std::fmt::Display| {
            EngineError::Load(format!(
                "structured output is unavailable for this tokenizer: {e}"
            ))
        };
        let mut words = token_bytes(tokenizer);
        let n = vocab_size.max(words.len());
        words.resize(n, Vec::new());
        let info = TokRxInfo::new(n as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| unsupported(&e))?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// A fresh matcher for `grammar`; an invalid grammar is a validation
    /// error naming `field`.
    pub fn matcher(&self, grammar: &Grammar, field: &'static str) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(grammar.top_level())
            .map_err(|e| EngineError::Validation {
                field,
                message: format!("invalid grammar: {e}"),
            })?;
        Ok(Constraint {
            matcher: Matcher::new(Ok(parser)),
        })
    }
}

/// One sequence's matcher.
pub struct Constraint {
    matcher: Matcher,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// The tokens allowed next, over a vocabulary of `vocab`. On a
    /// matcher error (which a correct grammar never reaches) only
    /// `fallback` (EOS) is allowed.
    pub fn allowed(&mut self, vocab: usize, fallback: u32) -> TokenMask {
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) => TokenMask::from_fn(vocab, |t| mask.is_allowed(t)),
            Err(e) => {
                tracing::warn!(error = %e, "constraint failed; ending the output");
                TokenMask::from_fn(vocab, |t| t == fallback)
            }
        }
    }

    /// Advances past a sampled token.
    pub fn consume(&mut self, token: u32) {
        if !self.matcher.is_stopped()
            && let Err(e) = self.matcher.consume_token(token)
        {
            tracing::warn!(error = %e, token, "constraint rejected a token");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpt2_byte_alphabet_maps_back_to_bytes() {
        let m = gpt2_unicode_to_byte();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'a'], b'a');
        assert_eq!(m[&'ÿ'], 0xFF);
    }

    #[test]
    fn json_grammars_ask_for_compact_output_unless_told_otherwise() {
        let c = compact(serde_json::json!({"type": "object"}));
        assert_eq!(c["x-guidance"]["whitespace_flexible"], false);
        let own =
            serde_json::json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(compact(own.clone()), own);
    }
}
