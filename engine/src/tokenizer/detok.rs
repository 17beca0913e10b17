//! Incremental detokenization.
//!
//! `IncrementalDetokenizer` follows the prefix/read-offset scheme of TGI and
//! vLLM: decode a short window before and after the new token and emit only
//! the difference, holding text back while it ends in an incomplete UTF-8
//! sequence (U+FFFD), so a multi-byte character is never split.

use super::TextTokenizer;
use crate::error::Result;

/// How many prompt tokens seed the window, so the first generated token
/// decodes with its leading space (SentencePiece strips it otherwise).
const PROMPT_CONTEXT: usize = 5;

/// Turns a stream of token ids into a stream of valid UTF-8 text deltas.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDetokenizer {
    /// Starts after `prompt`, using its last few tokens as decoding context.
    pub fn new(prompt: &[u32]) -> Self {
        let ids = prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..].to_vec();
        let read_offset = ids.len();
        Self {
            ids,
            prefix_offset: 0,
            read_offset,
        }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Text still held back at the end of generation (an incomplete
    /// character decodes to U+FFFD rather than being lost).
    pub fn flush(&mut self, tok: &TextTokenizer) -> Result<String> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full
            .get(prefix.len()..)
            .map(str::to_string)
            .unwrap_or_default())
    }
}
