//! Incremental detokenization and stop strings.
//!
//! `IncrementalDetokenizer` follows the prefix/read-offset scheme of TGI and
//! vLLM: decode a short window before and after the new token and emit only
//! the difference, holding text back while it ends in an incomplete UTF-8
//! sequence (U+FFFD), so a multi-byte character is never split.
//! `StopMatcher` cuts the text before the first stop string and, while
//! streaming, holds back any tail that could still become one.

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

/// Result of feeding text to a `StopMatcher`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to emit now.
    pub emit: String,
    /// A stop string matched; `emit` ends right before it.
    pub stopped: bool,
}

/// Finds stop strings across delta boundaries.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            pending: String::new(),
        }
    }

    /// Feeds a text delta.
    pub fn push(&mut self, delta: &str) -> StopStep {
        if self.stops.is_empty() {
            return StopStep {
                emit: delta.to_string(),
                stopped: false,
            };
        }
        self.pending.push_str(delta);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(pos) = first {
            let emit = self.pending[..pos].to_string();
            self.pending.clear();
            return StopStep {
                emit,
                stopped: true,
            };
        }
        let hold = self.held_tail_len();
        let cut = self.pending.len() - hold;
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopStep {
            emit,
            stopped: false,
        }
    }

    /// Releases held-back text when generation ends without a match.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest tail of `pending` that is a proper prefix of a
    /// stop string (and so might still complete into one).
    fn held_tail_len(&self) -> usize {
        let p = &self.pending;
        p.char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                self.stops
                    .iter()
                    .any(|s| s.len() > p.len() - i && s.starts_with(&p[i..]))
            })
            .map_or(0, |i| p.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for d in deltas {
            let step = m.push(d);
            out.push_str(&step.emit);
            if step.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stop_string_split_across_deltas_is_found() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".to_string(), true)
        );
    }

    #[test]
    fn partial_stop_prefix_is_released_when_it_does_not_complete() {
        assert_eq!(
            run(&["END"], &["abc E", "x"]),
            ("abc Ex".to_string(), false)
        );
        assert_eq!(run(&["END"], &["abc EN"]), ("abc EN".to_string(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["zz", "b"], &["a b zz"]), ("a ".to_string(), true));
    }

    #[test]
    fn held_text_respects_multibyte_characters() {
        assert_eq!(
            run(&["éx"], &["caf", "é", "!"]),
            ("café!".to_string(), false)
        );
        assert_eq!(run(&["éx"], &["café", "x"]), ("caf".to_string(), true));
    }

    #[test]
    fn no_stops_passes_text_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), false));
    }
}
