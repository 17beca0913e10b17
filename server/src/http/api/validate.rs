//! Parse, don't validate: turns wire DTOs into engine requests. Every check
//! names the field it refuses; parameters we cannot honour yet are refused
//! with a 400 rather than silently ignored.

use engine::generation::DEFAULT_MAX_TOKENS;
use engine::{
    ChatMessage, EngineHandle, GenerateRequest, GenerationDefaults, Grammar, SamplingParams,
    ValidRequest,
};

use super::tools;
use super::types::{
    ChatCompletionRequest, ChatMessageDto, CommonParams, CompletionRequest, MessageContent, Prompt,
};
use crate::http::error::ApiError;

/// OpenAI's default `max_tokens` for legacy completions.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;
/// Most prompts one completions request may batch.
const MAX_PROMPTS: usize = 64;

/// A generation request ready for the engine, plus how to answer it.
#[derive(Debug)]
pub struct ValidGeneration {
    /// One engine request per prompt (each with its `n`), checked by the
    /// model's engine: the one validation on the request's way.
    pub requests: Vec<ValidRequest>,
    pub stream: bool,
    pub include_usage: bool,
    /// Prompt text to prepend to each choice (`echo`), one per choice.
    pub echo: Vec<Option<String>>,
    /// Whether choices report log-probabilities.
    pub logprobs: bool,
    /// Whether the output is a tool-call envelope (`api::tools`).
    pub tools: bool,
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
    if c.stream_options.is_some() && !c.stream {
        return Err(refuse(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    Ok(())
}

/// `logit_bias` keys are token ids written as strings.
fn logit_bias(c: &CommonParams) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &c.logit_bias else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(k, &v)| {
            k.parse::<u32>().map(|t| (t, v)).map_err(|_| {
                refuse(
                    "logit_bias",
                    format!("logit_bias keys must be token ids, got `{k}`"),
                )
            })
        })
        .collect()
}

/// Sampling parameters from the shared fields, the model's defaults
/// (`model`) for the fields left out; `max_tokens` and `logprobs` already
/// resolved.
fn sampling(
    c: &CommonParams,
    model: &GenerationDefaults,
    max_tokens: usize,
    logprobs: Option<usize>,
) -> Result<SamplingParams, ApiError> {
    let top_k = match c.top_k.or(model.top_k.map(i64::from)) {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(_) => return Err(refuse("top_k", "top_k must be -1 (disabled) or positive")),
    };
    let n = match c.n {
        None => 1,
        Some(n) => n as usize,
    };
    let params = SamplingParams {
        temperature: c.temperature.or(model.temperature).unwrap_or(1.0),
        top_p: c.top_p.or(model.top_p).unwrap_or(1.0),
        top_k,
        seed: c.seed.map(|s| s as u64),
        max_tokens,
        stop: c.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        stop_token_ids: c.stop_token_ids.clone(),
        ignore_eos: c.ignore_eos,
        min_p: c.min_p.or(model.min_p).unwrap_or(0.0),
        repetition_penalty: c
            .repetition_penalty
            .or(model.repetition_penalty)
            .unwrap_or(1.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        logit_bias: logit_bias(c)?,
        logprobs,
        n,
        priority: c.priority.unwrap_or(0),
        // Set from the caller's key by the generation service.
        tenant: 0,
        grammar: None,
    };
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
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (Some(true), k) => Some(k.unwrap_or(0) as usize),
        (_, Some(_)) => {
            return Err(refuse(
                "top_logprobs",
                "top_logprobs requires logprobs: true",
            ));
        }
        (_, None) => None,
    };
    let mut grammar = response_format(req.response_format.as_ref())?;
    let tool_plan = tools::plan(
        req.tools.as_deref().unwrap_or_default(),
        req.tool_choice.as_ref(),
    )?;
    if let Some(p) = &tool_plan {
        if grammar.is_some() {
            return Err(refuse(
                "response_format",
                "response_format cannot be combined with tools",
            ));
        }
        if logprobs.is_some() {
            return Err(refuse("logprobs", "logprobs cannot be combined with tools"));
        }
        grammar = Some(p.grammar.clone());
    }
    // The sampling parameters are cheap to check: refuse bad ones before
    // rendering the template and tokenizing (the expensive part); the
    // engine's check below is the request's one validation.
    let model = engine.info().generation;
    sampling(&common, &model, 1, logprobs)?.validate()?;
    let messages = chat_messages(
        &req.messages,
        tool_plan.as_ref().map(|p| p.preamble.as_str()),
    )?;
    let text = engine.render_chat(&messages)?;
    let prompt_tokens = engine.tokenizer().encode_prompt(&text)?;
    let (field, given) = match req.max_completion_tokens {
        Some(n) => ("max_completion_tokens", Some(n)),
        None => ("max_tokens", req.max_tokens),
    };
    // Without `max_tokens`: the model's default length, capped so that
    // a request cannot ramble for minutes, and by the context left.
    let room = engine
        .info()
        .context_length
        .saturating_sub(prompt_tokens.len())
        .max(1);
    let default = model.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room);
    let mut params = sampling(
        &common,
        &model,
        max_tokens(field, given, default)?,
        logprobs,
    )?;
    params.grammar = grammar;
    let request = GenerateRequest {
        prompt_tokens,
        params,
    };
    // Everything the engine would refuse is refused here, before any
    // quote, hold or rate-limit charge, and nowhere again.
    let request = engine.validate(request)?;
    Ok(ValidGeneration {
        requests: vec![request],
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        echo: vec![None; params_n(&common)],
        logprobs: logprobs.is_some(),
        tools: tool_plan.is_some(),
    })
}

/// The conversation as the template gets it: roles normalized, tool
/// exchanges written out as text, and the tools' `preamble` in the system
/// message.
fn chat_messages(
    dtos: &[ChatMessageDto],
    preamble: Option<&str>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::with_capacity(dtos.len() + 1);
    for (i, m) in dtos.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" | "tool" => "user",
            "assistant" => "assistant",
            other => {
                return Err(refuse(
                    &format!("messages[{i}].role"),
                    format!("unknown role `{other}`"),
                ));
            }
        };
        let is_call = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
        let content = match (&m.content, is_call) {
            (None, true) => None,
            (c, _) => Some(message_text(i, c)?),
        };
        let text = match tools::exchange_text(m, content.clone()) {
            Some(t) => t,
            None => content.unwrap_or_default(),
        };
        messages.push(ChatMessage::new(role, text));
    }
    if let Some(pre) = preamble {
        match messages.first_mut().filter(|m| m.role == "system") {
            Some(sys) => sys.content = format!("{}\n\n{pre}", sys.content),
            None => messages.insert(0, ChatMessage::new("system", pre.to_string())),
        }
    }
    Ok(messages)
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object`, or
/// `json_schema` with a `name` and a `schema`.
fn response_format(rf: Option<&serde_json::Value>) -> Result<Option<Grammar>, ApiError> {
    let Some(rf) = rf else { return Ok(None) };
    match rf.get("type").and_then(|t| t.as_str()) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::JsonObject)),
        Some("json_schema") => {
            let js = rf.get("json_schema").ok_or_else(|| {
                refuse(
                    "response_format.json_schema",
                    "json_schema is required for this type",
                )
            })?;
            if !js.get("name").is_some_and(|n| n.is_string()) {
                return Err(refuse(
                    "response_format.json_schema.name",
                    "the schema needs a `name`",
                ));
            }
            match js.get("schema") {
                Some(schema) if schema.is_object() => Ok(Some(Grammar::JsonSchema(schema.clone()))),
                _ => Err(refuse(
                    "response_format.json_schema.schema",
                    "`schema` must be a JSON Schema object",
                )),
            }
        }
        Some(other) => Err(refuse(
            "response_format.type",
            format!("unknown response_format type `{other}` (text, json_object or json_schema)"),
        )),
        None => Err(refuse(
            "response_format.type",
            "response_format needs a `type`",
        )),
    }
}

/// Choices per prompt (validated later by the engine).
fn params_n(c: &CommonParams) -> usize {
    c.n.map_or(1, |n| n as usize)
}

/// Validates a completions request; each prompt becomes `n` choices.
pub fn completion(
    req: &CompletionRequest,
    engine: &EngineHandle,
) -> Result<ValidGeneration, ApiError> {
    let common = req.common();
    check_common(&common)?;
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(refuse("suffix", "suffix is not supported"));
    }
    let logprobs = req.logprobs.map(|k| k as usize);
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
    let params = sampling(&common, &engine.info().generation, max, logprobs)?;
    // One entry per choice: prompt i's n choices come together.
    let mut echo = Vec::with_capacity(prompts.len() * params.n);
    for p in &prompts {
        let text = if req.echo {
            Some(engine.tokenizer().decode(p)?)
        } else {
            None
        };
        echo.extend(std::iter::repeat_n(text, params.n));
    }
    let requests = prompts
        .into_iter()
        .map(|prompt_tokens| {
            engine.validate(GenerateRequest {
                prompt_tokens,
                params: params.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ValidGeneration {
        requests,
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        echo,
        logprobs: logprobs.is_some(),
        tools: false,
    })
}
