//! OpenAI wire types: request DTOs as clients send them and the response
//! and chunk shapes we send back. Conversion into engine requests lives in
//! `api::validate`; nothing here knows the engine.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// `string` or `[string]` (the `stop` field).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl StringOrList {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// A content part of a chat message.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// Chat message content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatMessageDto {
    #[schema(schema_with = role_schema)]
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub name: Option<String>,
    /// Calls an assistant turn made (function calling).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields shared by chat and completions requests (a view built
/// from either request; the fields are declared on each request so that
/// type errors name their field, which `#[serde(flatten)]` would hide).
#[derive(Debug, Clone, Default)]
pub struct CommonParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub n: Option<u32>,
    pub stop: Option<StringOrList>,
    pub seed: Option<i64>,
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub priority: Option<i32>,
    pub unknown: Vec<String>,
}

/// Declares a request struct with its own fields plus the shared sampling
/// fields, and `common()` to view the latter as `CommonParams`.
macro_rules! generation_request {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize, ToSchema)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            #[schema(minimum = 0, maximum = 2)]
            pub temperature: Option<f32>,
            #[schema(exclusive_minimum = 0, maximum = 1)]
            pub top_p: Option<f32>,
            /// vLLM extension.
            pub top_k: Option<i64>,
            #[schema(minimum = 1, maximum = 16)]
            pub n: Option<u32>,
            pub stop: Option<StringOrList>,
            pub seed: Option<i64>,
            #[serde(default)]
            pub stream: bool,
            pub stream_options: Option<StreamOptions>,
            #[schema(minimum = -2, maximum = 2)]
            pub presence_penalty: Option<f32>,
            #[schema(minimum = -2, maximum = 2)]
            pub frequency_penalty: Option<f32>,
            pub logit_bias: Option<BTreeMap<String, f32>>,
            /// Accepted; end-user ids are not used yet.
            pub user: Option<String>,
            /// vLLM extension: keep generating past EOS.
            #[serde(default)]
            pub ignore_eos: bool,
            /// vLLM extension: extra token ids that end generation.
            #[serde(default)]
            pub stop_token_ids: Vec<u32>,
            /// vLLM extension: min-p sampling.
            #[schema(minimum = 0, maximum = 1)]
            pub min_p: Option<f32>,
            /// vLLM extension: repetition penalty (1 disables).
            #[schema(exclusive_minimum = 0, maximum = 2)]
            pub repetition_penalty: Option<f32>,
            /// vLLM extension: scheduling priority (lower runs first).
            pub priority: Option<i32>,
            /// Anything else: refused by name rather than silently ignored.
            #[serde(flatten)]
            #[schema(ignore)]
            pub unknown: BTreeMap<String, Value>,
        }

        impl $name {
            /// The shared sampling fields.
            pub fn common(&self) -> CommonParams {
                CommonParams {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    n: self.n,
                    stop: self.stop.clone(),
                    seed: self.seed,
                    stream: self.stream,
                    stream_options: self.stream_options.clone(),
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    logit_bias: self.logit_bias.clone(),
                    ignore_eos: self.ignore_eos,
                    stop_token_ids: self.stop_token_ids.clone(),
                    min_p: self.min_p,
                    repetition_penalty: self.repetition_penalty,
                    priority: self.priority,
                    unknown: self.unknown.keys().cloned().collect(),
                }
            }
        }
    };
}

generation_request! {
    /// `POST /v1/chat/completions`.
    pub struct ChatCompletionRequest {
        pub model: String,
        #[schema(min_items = 1)]
        pub messages: Vec<ChatMessageDto>,
        #[schema(minimum = 1)]
        pub max_tokens: Option<i64>,
        #[schema(minimum = 1)]
        pub max_completion_tokens: Option<i64>,
        pub logprobs: Option<bool>,
        #[schema(maximum = 20)]
        pub top_logprobs: Option<u32>,
        #[schema(value_type = Option<Object>)]
        pub response_format: Option<Value>,
        #[schema(value_type = Option<Vec<Object>>)]
        pub tools: Option<Vec<Value>>,
        #[schema(value_type = Option<Object>)]
        pub tool_choice: Option<Value>,
        /// Accepted: a turn makes at most one tool call, which honours
        /// `false` and is allowed under `true`.
        pub parallel_tool_calls: Option<bool>,
    }
}

/// The `prompt` of a completions request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

generation_request! {
    /// `POST /v1/completions`.
    pub struct CompletionRequest {
        pub model: String,
        pub prompt: Prompt,
        #[schema(minimum = 1)]
        pub max_tokens: Option<i64>,
        #[serde(default)]
        pub echo: bool,
        pub suffix: Option<String>,
        #[schema(maximum = 20)]
        pub logprobs: Option<u32>,
        /// Only 1 (the default) is supported.
        #[schema(minimum = 1, maximum = 1)]
        pub best_of: Option<u32>,
    }
}

/// The `input` of an embeddings request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: EmbeddingInput,
    #[schema(schema_with = encoding_format_schema)]
    pub encoding_format: Option<String>,
    pub dimensions: Option<u32>,
    pub user: Option<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: BTreeMap<String, Value>,
}

/// Token counts, as OpenAI reports them.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, ToSchema)]
pub struct UsageDto {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl UsageDto {
    pub fn add(&mut self, u: &engine::Usage) {
        self.prompt_tokens += u.prompt_tokens;
        self.completion_tokens += u.completion_tokens;
        self.total_tokens = self.prompt_tokens + self.completion_tokens;
        self.prompt_tokens_details.cached_tokens += u.cached_tokens;
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageDto,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: Delta,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageDto>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    pub finish_reason: Option<&'static str>,
}

/// A completions response, or one chunk of a streamed one (same shape).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageDto>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmbeddingData {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingVector,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmbeddingResponse {
    pub object: &'static str,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// `role`: one of the chat roles we accept.
fn role_schema() -> utoipa::openapi::Object {
    string_enum(&["system", "developer", "user", "assistant", "tool"])
}

/// `encoding_format`: `float` (default) or `base64`.
fn encoding_format_schema() -> utoipa::openapi::Object {
    string_enum(&["float", "base64"])
}

fn string_enum(values: &[&str]) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(values.iter().copied()))
        .build()
}
