//! `POST /v1/embeddings`: sentence embeddings as float arrays or base64
//! (little-endian f32, as OpenAI encodes them).

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;

use crate::api::json::ApiJson;
use crate::api::types::{
    EmbeddingData, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage,
    EmbeddingVector,
};
use crate::error::ApiError;
use crate::state::AppState;

/// OpenAI's limit on inputs per request.
const MAX_INPUTS: usize = 2048;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/embeddings", post(embeddings))
}

async fn embeddings(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<EmbeddingRequest>,
) -> Result<Json<EmbeddingResponse>, ApiError> {
    let model = state.models.embedding(&req.model)?;
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
    let inputs = match req.input {
        EmbeddingInput::Text(t) => vec![t],
        EmbeddingInput::Texts(ts) => ts,
        EmbeddingInput::Tokens(_) | EmbeddingInput::TokenLists(_) => {
            return Err(ApiError::invalid(
                "input",
                "token-id inputs are not supported for this model yet",
            ));
        }
    };
    if inputs.is_empty() {
        return Err(ApiError::invalid("input", "input must not be empty"));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("at most {MAX_INPUTS} inputs per request"),
        ));
    }
    if let Some(i) = inputs.iter().position(String::is_empty) {
        return Err(ApiError::invalid(
            format!("input[{i}]"),
            "inputs must not be empty strings",
        ));
    }
    let out = model.embed(inputs).await?;
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
