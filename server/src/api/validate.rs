//! Parse, don't validate: turns wire DTOs into engine requests. Every check
//! names the field it refuses; parameters we cannot honour yet are refused
//! with a 400 rather than silently ignored.

use engine::{ChatMessage, EngineHandle, GenerateRequest, SamplingParams};

use super::types::{
    ChatCompletionRequest, CommonParams, CompletionRequest, MessageContent, Prompt,
};
use crate::error::ApiError;

/// OpenAI's default `max_tokens` for legacy completions.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;
/// Most prompts one completions request may batch.
const MAX_PROMPTS: usize = 64;

/// A generation request ready for the engine, plus how to answer it.
#[derive(Debug)]
pub struct ValidGeneration {
    /// One engine request per choice.
    pub requests: Vec<GenerateRequest>,
    pub stream: bool,
    pub include_usage: bool,
    /// Prompt text to prepend to each choice (`echo`).
    pub echo: Vec<Option<String>>,
}

fn refuse(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

/// Checks the shared fields and refuses what we do not support.
fn check_common(c: &CommonParams) -> Result<(), ApiError> {
    if let Some(name) = c.unknown.first() {
        return Err(refuse(
            name,
            format!("unrecognized request argument supplied: {name}"),
        ));
    }
    match c.n {
        None | Some(1) => {}
        Some(0) => return Err(refuse("n", "n must be at least 1")),
        Some(_) => return Err(refuse("n", "n > 1 is not supported yet")),
    }
    for (name, v) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        match v {
            Some(x) if !(-2.0..=2.0).contains(&x) => {
                return Err(refuse(name, format!("{name} must be between -2 and 2")));
            }
            Some(x) if x != 0.0 => {
                return Err(refuse(name, format!("{name} is not supported yet")));
            }
            _ => {}
        }
    }
    if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(refuse("logit_bias", "logit_bias is not supported yet"));
    }
    if c.stream_options.is_some() && !c.stream {
        return Err(refuse(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    Ok(())
}

/// Sampling parameters from the shared fields; `max_tokens` already resolved.
fn sampling(c: &CommonParams, max_tokens: usize) -> Result<SamplingParams, ApiError> {
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(_) => return Err(refuse("top_k", "top_k must be -1 (disabled) or positive")),
    };
    let params = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_p: c.top_p.unwrap_or(1.0),
        top_k,
        seed: c.seed.map(|s| s as u64),
        max_tokens,
        stop: c.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        stop_token_ids: c.stop_token_ids.clone(),
        ignore_eos: c.ignore_eos,
    };
    params.validate()?;
    Ok(params)
}

/// `max_tokens` as given (must be >= 1), or the default.
fn max_tokens(field: &str, given: Option<i64>, default: usize) -> Result<usize, ApiError> {
    match given {
        None => Ok(default),
        Some(n) if n >= 1 => Ok(n as usize),
        Some(n) => Err(refuse(
            field,
            format!("{field} must be at least 1, got {n}"),
        )),
    }
}

/// Reduces message content to text; only text parts are supported.
fn message_text(i: usize, content: &Option<MessageContent>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        None => Err(refuse(&param, "message content is required")),
        Some(MessageContent::Text(t)) => Ok(t.clone()),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .map(|p| match (p.kind.as_str(), &p.text) {
                ("text", Some(t)) => Ok(t.as_str()),
                ("text", None) => Err(refuse(&param, "a text part needs `text`")),
                (other, _) => Err(refuse(
                    &param,
                    format!("content parts of type `{other}` are not supported"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.concat()),
    }
}

/// Validates a chat request and renders its prompt with `engine`'s template.
pub fn chat(
    req: &ChatCompletionRequest,
    engine: &EngineHandle,
) -> Result<ValidGeneration, ApiError> {
    let common = req.common();
    check_common(&common)?;
    if req.messages.is_empty() {
        return Err(refuse(
            "messages",
            "messages must contain at least one message",
        ));
    }
    if req.logprobs == Some(true) || req.top_logprobs.is_some() {
        return Err(refuse("logprobs", "logprobs are not supported yet"));
    }
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) || req.tool_choice.is_some() {
        return Err(refuse("tools", "tools are not supported yet"));
    }
    if let Some(rf) = &req.response_format
        && rf.get("type").and_then(|t| t.as_str()) != Some("text")
    {
        return Err(refuse(
            "response_format",
            "only response_format {\"type\": \"text\"} is supported yet",
        ));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => {
                return Err(refuse(
                    &format!("messages[{i}].role"),
                    "tool messages are not supported yet",
                ));
            }
            other => {
                return Err(refuse(
                    &format!("messages[{i}].role"),
                    format!("unknown role `{other}`"),
                ));
            }
        };
        messages.push(ChatMessage::new(role, message_text(i, &m.content)?));
    }
    let text = engine.render_chat(&messages)?;
    let prompt_tokens = engine.tokenizer().encode_prompt(&text)?;
    let (field, given) = match req.max_completion_tokens {
        Some(n) => ("max_completion_tokens", Some(n)),
        None => ("max_tokens", req.max_tokens),
    };
    let room = engine
        .info()
        .context_length
        .saturating_sub(prompt_tokens.len())
        .max(1);
    let params = sampling(&common, max_tokens(field, given, room)?)?;
    Ok(ValidGeneration {
        requests: vec![GenerateRequest {
            prompt_tokens,
            params,
        }],
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        echo: vec![None],
    })
}

/// Validates a completions request; each prompt becomes one choice.
pub fn completion(
    req: &CompletionRequest,
    engine: &EngineHandle,
) -> Result<ValidGeneration, ApiError> {
    let common = req.common();
    check_common(&common)?;
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(refuse("suffix", "suffix is not supported"));
    }
    if req.logprobs.is_some() {
        return Err(refuse("logprobs", "logprobs are not supported yet"));
    }
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(refuse("best_of", "best_of other than 1 is not supported"));
    }
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        Prompt::Text(t) => vec![engine.tokenizer().encode_prompt(t)?],
        Prompt::Texts(ts) => ts
            .iter()
            .map(|t| engine.tokenizer().encode_prompt(t))
            .collect::<Result<_, _>>()?,
        Prompt::Tokens(ids) => vec![ids.clone()],
        Prompt::TokenLists(lists) => lists.clone(),
    };
    if prompts.is_empty() {
        return Err(refuse("prompt", "prompt must not be empty"));
    }
    if prompts.len() > MAX_PROMPTS {
        return Err(refuse(
            "prompt",
            format!("at most {MAX_PROMPTS} prompts per request"),
        ));
    }
    let max = max_tokens("max_tokens", req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)?;
    let params = sampling(&common, max)?;
    let echo = prompts
        .iter()
        .map(|p| {
            if req.echo {
                engine.tokenizer().decode(p).map(Some)
            } else {
                Ok(None)
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ValidGeneration {
        requests: prompts
            .into_iter()
            .map(|prompt_tokens| GenerateRequest {
                prompt_tokens,
                params: params.clone(),
            })
            .collect(),
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        echo,
    })
}
