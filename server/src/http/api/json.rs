//! `ApiJson<T>`: a JSON body extractor whose failures are OpenAI errors that
//! name the offending field (via `serde_path_to_error`), instead of axum's
//! plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use crate::http::error::ApiError;

/// A request body parsed as JSON into `T`.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge
            } else {
                ApiError::InvalidJson {
                    message: format!("could not read the body: {e}"),
                    param: None,
                }
            }
        })?;
        // Like OpenAI's own API, parse the body as JSON whatever the header
        // says (curl -d sends form encoding), but say so when that fails.
        parse(&bytes).map(ApiJson).map_err(|e| match (e, content_type) {
            (ApiError::InvalidJson { message, param }, Some(ct)) if !is_json(&ct) => ApiError::InvalidJson {
                message: format!("{message} (the request was sent as `{ct}`; send JSON with Content-Type: application/json)"),
                param,
            },
            (e, _) => e,
        })
    }
}

fn is_json(content_type: &str) -> bool {
    content_type.starts_with("application/json") || content_type.contains("+json")
}

/// Parses `bytes` as `T`, naming the field that failed.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if matches!(
            inner.classify(),
            Category::Syntax | Category::Eof | Category::Io
        ) {
            let message = format!("the body is not valid JSON: {inner}");
            return ApiError::InvalidJson {
                message,
                param: None,
            };
        }
        match (path != ".").then_some(path) {
            Some(p) => ApiError::InvalidJson {
                message: format!("invalid value for `{p}`: {inner}"),
                param: Some(p),
            },
            None => ApiError::InvalidJson {
                message: format!("invalid request: {inner}"),
                param: None,
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct T {
        a: u32,
        b: Vec<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        c: String,
    }

    fn err(body: &str) -> (String, Option<String>) {
        match parse::<T>(body.as_bytes()) {
            Err(ApiError::InvalidJson { message, param }) => (message, param),
            other => panic!("expected InvalidJson, got {other:?}"),
        }
    }

    #[test]
    fn malformed_json_is_reported_as_such() {
        let (msg, param) = err("{\"a\": 1,");
        assert!(msg.contains("not valid JSON"), "{msg}");
        assert_eq!(param, None);
    }

    #[test]
    fn wrong_types_name_the_field_path() {
        let (msg, param) = err(r#"{"a": 1, "b": [{"c": 5}]}"#);
        assert_eq!(param.as_deref(), Some("b[0].c"));
        assert!(msg.contains("b[0].c"), "{msg}");
        let (msg, _) = err(r#"{"b": []}"#);
        assert!(msg.contains("missing field `a`"), "{msg}");
    }
}
