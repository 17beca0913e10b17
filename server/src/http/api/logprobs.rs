//! Log-probabilities in OpenAI's two wire shapes: chat's
//! `{"content": [{token, logprob, bytes, top_logprobs}]}` and legacy
//! completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.

use engine::{TextTokenizer, TokenLogprob};
use serde_json::{Map, Value, json};

/// The text of one token, as a client sees it on its own.
fn piece(tok: &TextTokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

fn entry(tok: &TextTokenizer, id: u32, logprob: f32) -> Value {
    let text = piece(tok, id);
    json!({ "token": text, "logprob": logprob, "bytes": text.as_bytes() })
}

/// Chat's `logprobs` object for these tokens.
pub fn chat(tok: &TextTokenizer, lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(tok, lp.token, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(tok, t, l)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Completions' `logprobs` object; offsets count from `start_offset`.
pub fn completion(tok: &TextTokenizer, lps: &[TokenLogprob], start_offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    let mut at = start_offset;
    for lp in lps {
        let text = piece(tok, lp.token);
        offsets.push(at);
        at += text.len();
        tokens.push(text);
        token_logprobs.push(lp.logprob);
        let alts: Map<String, Value> = lp
            .top
            .iter()
            .map(|&(t, l)| (piece(tok, t), json!(l)))
            .collect();
        top.push(Value::Object(alts));
    }
    json!({ "tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets })
}
