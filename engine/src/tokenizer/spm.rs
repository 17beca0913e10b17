//! SentencePiece vocabularies (`tokenizer.ggml.model = llama`: Llama 2,
//! TinyLlama, Gemma's 262k) tokenized as llama.cpp's SPM tokenizer does:
//! spaces become `▁` (one prepended where `tokenizer.ggml.add_space_prefix`
//! says, the default), then adjacent pieces merge, the pair whose joined
//! piece scores highest first, until no joined piece is in the vocabulary;
//! a character with no piece falls back to its bytes (`<0xXX>`).
//!
//! That is a BPE whose merges are the vocabulary's own pieces ranked by
//! score, so it is rebuilt as one: every way of cutting each piece into
//! two pieces of the vocabulary is a merge, ranked by the whole piece's
//! score. (A Unigram model over the same scores, which are negative merge
//! ranks, prefers several frequent short pieces to one long one: Gemma 3
//! came out at 4.6 times llama.cpp's token count.)

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper, Tokenizer};

use super::gguf::Meta;
use crate::error::{EngineError, Result};

/// A piece of the vocabulary proper (not control, user-defined, unused or
/// byte tokens): only these are made by merging.
const TOKEN_TYPE_NORMAL: i32 = 1;

/// The tokenizer of a SentencePiece vocabulary: `tokens` with their
/// `types` and the metadata's scores.
pub(super) fn sentencepiece_bpe(
    meta: &Meta<'_>,
    tokens: &[String],
    types: &[i32],
) -> Result<Tokenizer> {
    let scores: Vec<f32> = match meta.array("tokenizer.ggml.scores") {
        Ok(v) => v.iter().map(|s| s.to_f32().unwrap_or(0.0)).collect(),
        Err(_) => vec![0.0; tokens.len()],
    };
    let vocab: HashMap<String, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(
            vocab
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect::<Vocab>(),
            merges(tokens, types, &scores, &vocab),
        )
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = meta
        .u32("tokenizer.ggml.unknown_token_id")
        .ok()
        .and_then(|u| tokens.get(u as usize))
    {
        builder = builder.unk_token(unk.clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| EngineError::Load(format!("SentencePiece vocabulary: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let prefix = meta.bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
    spaces(&mut tokenizer, prefix)?;
    Ok(tokenizer)
}

/// Every cut of a normal piece into two pieces of the vocabulary, highest
/// scoring piece first (ties: the lower id, then the shorter left part).
fn merges(
    tokens: &[String],
    types: &[i32],
    scores: &[f32],
    vocab: &HashMap<String, u32>,
) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, u32, usize, &str, &str)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types.get(id).copied().unwrap_or(TOKEN_TYPE_NORMAL) != TOKEN_TYPE_NORMAL {
            continue;
        }
        let score = scores.get(id).copied().unwrap_or(0.0);
        for (cut, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(cut);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                ranked.push((score, id as u32, cut, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}

/// The `▁` convention both ways: spaces to `▁` (and one in front where the
/// vocabulary adds a space prefix) on the way in, back on the way out.
fn spaces(tokenizer: &mut Tokenizer, prefix: bool) -> Result<()> {
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| EngineError::Load(format!("normalizer: {e}")))
    };
    let mut normalizers = Vec::new();
    if prefix {
        normalizers.push(NormalizerWrapper::Prepend(Prepend::new("▁".to_string())));
    }
    normalizers.push(NormalizerWrapper::Replace(replace(" ", "▁")?));
    tokenizer
        .with_normalizer(Some(NormalizerWrapper::Sequence(NormalizerSequence::new(
            normalizers,
        ))))
        .map_err(|e| EngineError::Load(format!("normalizer: {e}")))?;
    let mut decoders = vec![
        DecoderWrapper::Replace(replace("▁", " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tokenizer.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
        decoders,
    ))));
    Ok(())
}
