//! Builds a `tokenizers::Tokenizer` from GGUF metadata, as llama.cpp does,
//! so any llama-family GGUF works without a `tokenizer.json`.
//!
//! Two vocabulary kinds are supported (`tokenizer.ggml.model`):
//! - `gpt2`: byte-level BPE from `tokens` + `merges`, with the pre-tokenizer
//!   named by `tokenizer.ggml.pre` (SmolLM2's `smollm` splits digits one by
//!   one, then applies the byte-level regex);
//! - `llama`: SentencePiece vocabularies (`tokens` + `scores`), merged by
//!   score as llama.cpp's SPM tokenizer does (`spm`), with byte fallback,
//!   the `▁` space convention and a BOS.
//!
//! Tokens typed CONTROL (3) or USER_DEFINED (4) become added tokens so chat
//! markers like `<|im_start|>` are matched whole, on the raw text (as
//! llama.cpp splits them out before anything else: Gemma's user-defined
//! runs of spaces and newlines are tokens of their own).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, Tokenizer};

use crate::error::{EngineError, Result};

const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The GPT-4 / Llama-3 style split regex used by `llama-bpe` vocabularies.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex (digits one at a time).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special token ids and flags read alongside the vocabulary.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Prepend BOS when encoding a prompt (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
}

/// Typed read access to GGUF metadata.
pub(crate) struct Meta<'a>(pub &'a HashMap<String, Value>);

impl Meta<'_> {
    fn get(&self, key: &str) -> Result<&Value> {
        self.0
            .get(key)
            .ok_or_else(|| EngineError::Load(format!("GGUF metadata has no `{key}`")))
    }

    pub fn string(&self, key: &str) -> Result<&str> {
        self.get(key)?
            .to_string()
            .map(String::as_str)
            .map_err(|e| EngineError::Load(format!("`{key}`: {e}")))
    }

    pub fn u32(&self, key: &str) -> Result<u32> {
        let v = self.get(key)?;
        v.to_u32()
            .or_else(|_| v.to_i32().map(|x| x as u32))
            .or_else(|_| v.to_u64().map(|x| x as u32))
            .map_err(|e| EngineError::Load(format!("`{key}`: {e}")))
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        self.get(key)?
            .to_f32()
            .map_err(|e| EngineError::Load(format!("`{key}`: {e}")))
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        self.get(key)?
            .to_bool()
            .map_err(|e| EngineError::Load(format!("`{key}`: {e}")))
    }

    pub fn array(&self, key: &str) -> Result<&Vec<Value>> {
        self.get(key)?
            .to_vec()
            .map_err(|e| EngineError::Load(format!("`{key}`: {e}")))
    }

    pub fn strings(&self, key: &str) -> Result<Vec<String>> {
        self.array(key)?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| EngineError::Load(format!("`{key}`: {e}")))
    }
}

/// Builds the tokenizer and reads its special tokens from GGUF metadata.
pub fn tokenizer_from_gguf(
    metadata: &HashMap<String, Value>,
) -> Result<(Tokenizer, SpecialTokens)> {
    let meta = Meta(metadata);
    let kind = meta.string("tokenizer.ggml.model")?;
    let tokens = meta.strings("tokenizer.ggml.tokens")?;
    let types: Vec<i32> = match meta.array("tokenizer.ggml.token_type") {
        Ok(v) => v.iter().map(|x| x.to_i32().unwrap_or(1)).collect(),
        Err(_) => vec![1; tokens.len()],
    };
    let mut tokenizer = match kind {
        "gpt2" => byte_level_bpe(&meta, &tokens)?,
        "llama" => super::spm::sentencepiece_bpe(&meta, &tokens, &types)?,
        other => {
            return Err(EngineError::Load(format!(
                "tokenizer model `{other}` is not supported (expected gpt2 or llama)"
            )));
        }
    };
    let rstrip = phi3_rstrip(&meta);
    let specials: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, t)| matches!(**t, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
        .map(|(tok, t)| {
            AddedToken::from(tok.clone(), *t == TOKEN_TYPE_CONTROL)
                .normalized(false)
                .rstrip(rstrip(tok))
        })
        .collect();
    tokenizer
        .add_special_tokens(specials)
        .map_err(|e| EngineError::Load(format!("special tokens: {e}")))?;
    let special = SpecialTokens {
        bos: meta.u32("tokenizer.ggml.bos_token_id").ok(),
        eos: meta.u32("tokenizer.ggml.eos_token_id").ok(),
        // llama.cpp's default: SentencePiece vocabularies add BOS, BPE ones don't.
        add_bos: meta
            .bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(kind == "llama"),
    };
    Ok((tokenizer, special))
}

/// Which special tokens swallow the whitespace after them: llama.cpp's
/// rule (after Phi-3's own tokenizer) for a model named Phi-3 is all but
/// `<unk>`, `<s>` and `<|endoftext|>`, so that `<|user|>\nHi` is
/// `<|user|>`, `Hi`; for any other model none.
fn phi3_rstrip(meta: &Meta<'_>) -> impl Fn(&str) -> bool {
    let name = meta
        .string("general.name")
        .unwrap_or_default()
        .to_lowercase();
    let phi3 = name.contains("phi-3") || name.contains("phi3");
    move |tok: &str| phi3 && !matches!(tok, "<unk>" | "<s>" | "<|endoftext|>")
}

fn byte_level_bpe(meta: &Meta<'_>, tokens: &[String]) -> Result<Tokenizer> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = meta
        .strings("tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| EngineError::Load(format!("malformed BPE merge `{m}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| EngineError::Load(format!("BPE: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre = meta.string("tokenizer.ggml.pre").unwrap_or("default");
    tokenizer.with_pre_tokenizer(Some(bpe_pre_tokenizer(pre)?));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
    Ok(tokenizer)
}

/// The pre-tokenizer llama.cpp uses for each `tokenizer.ggml.pre` name.
fn bpe_pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let byte_level =
        |use_regex| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, use_regex));
    let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_string()),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| EngineError::Load(format!("pre-tokenizer regex: {e}")))?;
        Ok(PreTokenizerWrapper::Split(split))
    };
    Ok(match pre {
        "smollm" => PreTokenizerWrapper::Sequence(PreSequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level(true),
        ])),
        "llama-bpe" | "llama3" | "dbrx" | "smaug-bpe" => {
            PreTokenizerWrapper::Sequence(PreSequence::new(vec![
                split(LLAMA3_PATTERN)?,
                byte_level(false),
            ]))
        }
        "qwen2" | "deepseek-r1-qwen" => PreTokenizerWrapper::Sequence(PreSequence::new(vec![
            split(QWEN2_PATTERN)?,
            byte_level(false),
        ])),
        other => {
            if other != "default" && other != "gpt-2" && other != "gpt2" {
                tracing::warn!(
                    pre = other,
                    "unknown GGUF pre-tokenizer; using GPT-2 byte-level"
                );
            }
            byte_level(true)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SentencePiece vocabulary of a few pieces, named `name`.
    fn vocab(name: &str) -> HashMap<String, Value> {
        let pieces: [(&str, i32); 10] = [
            ("<unk>", 2),
            ("<s>", 3),
            ("</s>", 3),
            ("<|user|>", 4),
            ("\u{2581}", 1),
            ("h", 1),
            ("i", 1),
            ("hi", 1),
            ("\u{2581}hi", 1),
            ("<0x0A>", 6),
        ];
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        HashMap::from([
            ("general.name".into(), Value::String(name.into())),
            ("tokenizer.ggml.model".into(), Value::String("llama".into())),
            (
                "tokenizer.ggml.tokens".into(),
                strings(pieces.iter().map(|p| p.0.to_string()).collect()),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(pieces.iter().map(|p| Value::I32(p.1)).collect()),
            ),
            (
                "tokenizer.ggml.scores".into(),
                Value::Array((0..10).map(|i| Value::F32(-(i as f32))).collect()),
            ),
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ])
    }

    fn ids(name: &str, text: &str) -> Vec<u32> {
        let (t, _) = tokenizer_from_gguf(&vocab(name)).expect("tokenizer");
        t.encode(text, false).expect("encode").get_ids().to_vec()
    }

    #[test]
    fn a_phi3_models_special_tokens_swallow_the_whitespace_after_them() {
        // <|user|> then "hi" with its space prefix: the newline is gone.
        assert_eq!(ids("Phi-3-mini-4k-instruct", "<|user|>\nhi"), [3, 8]);
        assert_eq!(ids("phi3", "<|user|>  hi"), [3, 8]);
        // Any other model keeps it (a byte token), as does a Phi-3 named
        // otherwise: llama.cpp matches the name as written.
        assert_eq!(ids("SmolLM2", "<|user|>\nhi"), [3, 4, 9, 7]);
        assert_eq!(ids("Phi 3.5 Mini Instruct", "<|user|>\nhi"), [3, 4, 9, 7]);
    }
}
