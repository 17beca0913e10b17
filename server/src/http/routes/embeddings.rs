//! `POST /v1/embeddings`: sentence embeddings as float arrays or base64
//! (little-endian f32, as OpenAI encodes them).

use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Json, Router};
use base64::Engine as _;
use engine::EmbedInput;

use crate::http::api::json::ApiJson;
use crate::http::api::types::{
    EmbeddingData, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage,
    EmbeddingVector,
};
use crate::http::error::ApiError;
use crate::http::state::AppState;
use money::store::keys::KeyRecord;

/// OpenAI's limit on inputs per request.
const MAX_INPUTS: usize = 2048;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/embeddings", post(embeddings))
}

/// Embeddings of texts or token-id lists.
#[utoipa::path(post, path = "/v1/embeddings", tag = "embeddings",
    request_body = EmbeddingRequest,
    responses((status = 200, description = "One vector per input", body = EmbeddingResponse), (status = 400, description = "Invalid request", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or invalid API key", body = crate::http::error::ErrorResponse), (status = 429, description = "A per-key limit is reached (see Retry-After)", body = crate::http::error::ErrorResponse), (status = 503, description = "Overloaded (see Retry-After)", body = crate::http::error::ErrorResponse)),
    security(("api_key" = [])))]
pub(crate) async fn embeddings(
    State(state): State<AppState>,
    key: Option<Extension<KeyRecord>>,
    ApiJson(req): ApiJson<EmbeddingRequest>,
) -> Result<Json<EmbeddingResponse>, ApiError> {
    let model = &state.models.embedding(&req.model)?;
    if let Some(name) = req.unknown.keys().next() {
        return Err(ApiError::invalid(
            name,
            format!("unrecognized request argument supplied: {name}"),
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format must be float or base64, not `{other}`"),
            ));
        }
    };
    if let Some(d) = req.dimensions
        && d as usize != model.dimensions
    {
        return Err(ApiError::invalid(
            "dimensions",
            format!("this model only produces {} dimensions", model.dimensions),
        ));
    }
    let input = inputs(req.input)?;
    // Everything that can be refused is refused before billing.
    model.validate(&input)?;
    let out = state
        .generation()
        .embed(key.as_deref(), &req.model, model, input)
        .await?;
    let data = out
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingData {
            object: "embedding",
            index,
            embedding: encode(v, base64),
        })
        .collect();
    Ok(Json(EmbeddingResponse {
        object: "list",
        data,
        model: req.model,
        usage: EmbeddingUsage {
            prompt_tokens: out.prompt_tokens,
            total_tokens: out.prompt_tokens,
        },
    }))
}

/// The inputs as the engine takes them: texts, or token ids used as given;
/// at least one, at most `MAX_INPUTS`, none empty.
fn inputs(input: EmbeddingInput) -> Result<EmbedInput, ApiError> {
    let (n, empty) = match &input {
        EmbeddingInput::Text(t) => (1, t.is_empty().then_some(0)),
        EmbeddingInput::Texts(ts) => (ts.len(), ts.iter().position(String::is_empty)),
        EmbeddingInput::Tokens(ids) => (1, ids.is_empty().then_some(0)),
        EmbeddingInput::TokenLists(ls) => (ls.len(), ls.iter().position(Vec::is_empty)),
    };
    if n == 0 {
        return Err(ApiError::invalid("input", "input must not be empty"));
    }
    if n > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("at most {MAX_INPUTS} inputs per request"),
        ));
    }
    if let Some(i) = empty {
        return Err(ApiError::invalid(
            format!("input[{i}]"),
            "inputs must not be empty",
        ));
    }
    Ok(match input {
        EmbeddingInput::Text(t) => EmbedInput::Texts(vec![t]),
        EmbeddingInput::Texts(ts) => EmbedInput::Texts(ts),
        EmbeddingInput::Tokens(ids) => EmbedInput::Tokens(vec![ids]),
        EmbeddingInput::TokenLists(ls) => EmbedInput::Tokens(ls),
    })
}

fn encode(v: Vec<f32>, base64: bool) -> EmbeddingVector {
    if !base64 {
        return EmbeddingVector::Float(v);
    }
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_little_endian_f32() {
        let EmbeddingVector::Base64(s) = encode(vec![1.0, -2.5], true) else {
            panic!("expected base64")
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .expect("valid base64");
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
        );
    }
}
