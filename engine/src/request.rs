//! Validated generation requests and the events a request's stream yields.
//!
//! `GenerateRequest` is the engine's own type, built by the server from the
//! wire DTO (parse, don't validate): by the time the engine sees it, the
//! prompt is tokenized and every sampling parameter is in range.

use crate::error::{EngineError, Result};

/// Engine-assigned identifier of one request (one sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// Per-request sampling and stopping parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy decoding.
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1].
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Seed of this request's own RNG: the same seed gives the same output.
    pub seed: Option<u64>,
    /// Maximum number of generated tokens.
    pub max_tokens: usize,
    /// Stop strings; the output is cut before the first match.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (besides the model's EOS ids).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS (benchmarks with fixed output lengths).
    pub ignore_eos: bool,
    /// Drop tokens below `min_p` times the top token's probability; 0 disables.
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of every token seen
    /// in the prompt or output; 1 disables (as in vLLM and transformers).
    pub repetition_penalty: f32,
    /// Subtracted once per occurrence of a token in the output (OpenAI).
    pub frequency_penalty: f32,
    /// Subtracted once if a token occurs in the output at all (OpenAI).
    pub presence_penalty: f32,
    /// Added to the logits of the given tokens, before everything else.
    pub logit_bias: Vec<(u32, f32)>,
    /// Report the sampled token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// Number of completions (choices) generated for the prompt.
    pub n: usize,
    /// Scheduling priority: lower values are admitted first and preempted
    /// last (vLLM's convention); ties go to the earlier request.
    pub priority: i32,
    /// Who is asking (the server gives each API key its own): within a
    /// priority, admission and prefill tokens are shared fairly between
    /// tenants, so one cannot hold the others back with long prompts.
    pub tenant: u64,
    /// Structured output: what every completion must match.
    pub grammar: Option<crate::constraint::Grammar>,
}

/// The most alternatives `logprobs` may ask for (OpenAI allows 20).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// The most choices one request may ask for.
pub const MAX_N: usize = 16;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            max_tokens: 16,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
            n: 1,
            priority: 0,
            tenant: 0,
            grammar: None,
        }
    }
}

/// The most stop strings a request may carry (OpenAI allows 4).
pub const MAX_STOP_STRINGS: usize = 4;
/// The longest stop string, in characters (real ones are a few: `"\n\n"`,
/// `"</answer>"`); the matcher's cost per token does not depend on it,
/// but its memory does.
pub const MAX_STOP_CHARS: usize = 256;
/// The most stop token ids a request may carry.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// The most `logit_bias` entries (OpenAI's limit is 300).
pub const MAX_LOGIT_BIAS: usize = 300;

impl SamplingParams {
    /// Checks every field's range; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=2.0).contains(&self.temperature) || self.temperature.is_nan() {
            return Err(EngineError::validation(
                "temperature",
                format!(
                    "temperature must be between 0 and 2, got {}",
                    self.temperature
                ),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::validation(
                "top_p",
                format!("top_p must be in (0, 1], got {}", self.top_p),
            ));
        }
        if self.max_tokens == 0 {
            return Err(EngineError::validation(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(EngineError::validation(
                "stop",
                format!("at most {MAX_STOP_STRINGS} stop sequences are allowed"),
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(EngineError::validation(
                "stop",
                "stop sequences must not be empty",
            ));
        }
        if self
            .stop
            .iter()
            .any(|s| s.chars().nth(MAX_STOP_CHARS).is_some())
        {
            return Err(EngineError::validation(
                "stop",
                format!("a stop sequence is at most {MAX_STOP_CHARS} characters"),
            ));
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(EngineError::validation(
                "stop_token_ids",
                format!("at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed"),
            ));
        }
        self.validate_processors()
    }

    fn validate_processors(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(EngineError::validation(
                "min_p",
                format!("min_p must be in [0, 1], got {}", self.min_p),
            ));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0) {
            return Err(EngineError::validation(
                "repetition_penalty",
                format!(
                    "repetition_penalty must be in (0, 2], got {}",
                    self.repetition_penalty
                ),
            ));
        }
        for (field, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(EngineError::validation(
                    field,
                    format!("{field} must be between -2 and 2, got {v}"),
                ));
            }
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(EngineError::validation(
                "logit_bias",
                format!("logit_bias has at most {MAX_LOGIT_BIAS} entries"),
            ));
        }
        if let Some(&(_, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return Err(EngineError::validation(
                "logit_bias",
                format!("logit_bias values must be between -100 and 100, got {b}"),
            ));
        }
        if self.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(EngineError::validation(
                "top_logprobs",
                format!("at most {MAX_TOP_LOGPROBS} top logprobs"),
            ));
        }
        if !(1..=MAX_N).contains(&self.n) {
            return Err(EngineError::validation(
                "n",
                format!("n must be between 1 and {MAX_N}"),
            ));
        }
        Ok(())
    }
}

/// A request for the engine: a tokenized prompt and its parameters.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_tokens: Vec<u32>,
    pub params: SamplingParams,
}

/// A request an engine checked (`EngineHandle::validate`: its parameters,
/// vocabulary and context length, against the engine of its model). The
/// submit calls take only these, so a request is checked once, where it
/// enters (the HTTP layer before anything is quoted or held; a worker
/// when an assignment arrives), and not again on its way. It reads as the
/// request it wraps; the changes it allows cannot make it invalid.
#[derive(Debug, Clone)]
pub struct ValidRequest(GenerateRequest);

impl std::ops::Deref for ValidRequest {
    type Target = GenerateRequest;

    fn deref(&self) -> &GenerateRequest {
        &self.0
    }
}

impl ValidRequest {
    /// Only an engine's check makes one.
    pub(crate) fn checked(req: GenerateRequest) -> Self {
        Self(req)
    }

    pub fn into_inner(self) -> GenerateRequest {
        self.0
    }

    /// Whose request it is (fair scheduling between tenants).
    pub fn set_tenant(&mut self, tenant: u64) {
        self.0.params.tenant = tenant;
    }

    /// Choice `i` of the request as one of its own: `n` 1, the seed
    /// resolved (`seed + i` when seeded, `drawn` otherwise), and its stop
    /// strings taken out, for a caller that matches them on its own text.
    pub fn choice(&self, i: usize, drawn: u64) -> (Self, Vec<String>) {
        let mut c = self.0.clone();
        c.params.n = 1;
        c.params.seed = Some(match self.0.params.seed {
            Some(s) => s.wrapping_add(i as u64),
            None => drawn,
        });
        let stop = std::mem::take(&mut c.params.stop);
        (Self(c), stop)
    }
}

/// Why a sequence stopped. Finished states only; the API maps them to
/// OpenAI's `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the model's context length was reached.
    Length,
    /// The caller aborted (client disconnect).
    Abort,
}

impl FinishReason {
    /// OpenAI's name for this reason.
    pub fn as_openai(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// Token counts of one finished (or cut) request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache instead of recomputed.
    pub cached_tokens: usize,
}

/// The log-probability of a sampled token and of the most likely tokens
/// at that step (from the model's raw distribution, before sampling
/// parameters are applied, as vLLM reports them).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The top alternatives, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What a request's stream yields, in order: zero or more `Delta`s, then
/// exactly one `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    /// Newly decoded text (possibly empty while a multi-byte character or a
    /// possible stop string is held back), the token ids behind it, and
    /// their log-probabilities when requested.
    Delta {
        text: String,
        token_ids: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(EngineError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_params_are_valid() {
        assert!(SamplingParams::default().validate().is_ok());
    }

    #[test]
    fn out_of_range_fields_are_named() {
        let cases: [(SamplingParams, &str); 8] = [
            (
                SamplingParams {
                    temperature: 5.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    max_tokens: 0,
                    ..Default::default()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    stop: vec![String::new()],
                    ..Default::default()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop: vec!["é".repeat(MAX_STOP_CHARS + 1)],
                    ..Default::default()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![1; MAX_STOP_TOKEN_IDS + 1],
                    ..Default::default()
                },
                "stop_token_ids",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(1, 1.0); MAX_LOGIT_BIAS + 1],
                    ..Default::default()
                },
                "logit_bias",
            ),
        ];
        for (params, want) in cases {
            match params.validate() {
                Err(EngineError::Validation { field, .. }) => assert_eq!(field, want),
                other => panic!("expected a validation error on {want}, got {other:?}"),
            }
        }
    }
}
