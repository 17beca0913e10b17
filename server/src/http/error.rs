//! `ApiError`: the server's one error type, rendered in the OpenAI shape
//! `{"error":{"message","type","param","code"}}` with the right status.
//! Engine errors are mapped here, once, exhaustively.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::EngineError;
use serde::Serialize;
use utoipa::ToSchema;

/// Every error a request can end with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON or does not match the request schema.
    #[error("{message}")]
    InvalidJson {
        message: String,
        param: Option<String>,
    },
    /// A field has a value we refuse; `param` names it.
    #[error("{message}")]
    InvalidParam { param: String, message: String },
    /// The requested model is not served.
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// The model exists but cannot serve this endpoint.
    #[error("the model `{model}` does not support {endpoint}")]
    WrongModelKind {
        model: String,
        endpoint: &'static str,
    },
    /// No route matches the path.
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// The route exists but not for this method.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// The request body is larger than the configured limit.
    #[error("the request body is larger than this server accepts")]
    PayloadTooLarge,
    /// No API key, or one that is wrong or revoked.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// The admin token is missing or wrong, or no admin token is set.
    #[error("this route needs the admin token")]
    AdminOnly,
    /// No admin token is set: the admin API and the console are off.
    #[error("the admin API is off: start the server with --admin-token (or SYNOR_ADMIN_TOKEN)")]
    AdminOff,
    /// A console session's mutating request without its CSRF token.
    #[error("this request needs the console session's x-csrf-token header")]
    CsrfMissing,
    /// A per-key limit is reached; retry after this many seconds.
    #[error("rate limit reached for this key ({what}); retry in {retry_after} s")]
    RateLimited {
        what: &'static str,
        retry_after: u64,
    },
    /// No such (active) API key.
    #[error("no active key `{0}`")]
    KeyNotFound(String),
    /// The account or key cannot cover the request's worst case (402).
    #[error("{0}")]
    InsufficientQuota(String),
    /// No such account, order or provider (404).
    #[error("{what} `{id}` not found")]
    NotFound { what: &'static str, id: String },
    /// The thing exists but its state forbids the change (409).
    #[error("{0}")]
    Conflict(String),
    /// A `Range` header no part of a file of this many bytes satisfies,
    /// or more than one range (416).
    #[error("{why} (the file has {len} bytes)")]
    RangeNotSatisfiable { len: u64, why: &'static str },
    /// The database failed (details are logged, not sent).
    #[error("storage: {0}")]
    Storage(String),
    /// Anything the engine refused or failed with.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// OpenAI's error type for requests the client must fix.
const INVALID: &str = "invalid_request_error";

/// Status, OpenAI error type, param and code of one error.
type Parts = (
    StatusCode,
    &'static str,
    Option<String>,
    Option<&'static str>,
);

#[derive(Serialize)]
struct Body<'a> {
    error: ErrorObject<'a>,
}

/// The `error` object of an OpenAI error response.
#[derive(Debug, Serialize, PartialEq)]
pub struct ErrorObject<'a> {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub param: Option<String>,
    pub code: Option<&'a str>,
}

impl ApiError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidParam {
            param: param.into(),
            message: message.into(),
        }
    }

    /// Status, OpenAI error type, param and code.
    fn parts(&self) -> Parts {
        use StatusCode as S;
        match self {
            Self::InvalidJson { param, .. } => (S::BAD_REQUEST, INVALID, param.clone(), None),
            Self::InvalidParam { param, .. } => {
                (S::BAD_REQUEST, INVALID, Some(param.clone()), None)
            }
            Self::ModelNotFound(_) => (
                S::NOT_FOUND,
                INVALID,
                Some("model".into()),
                Some("model_not_found"),
            ),
            Self::WrongModelKind { .. } => (S::BAD_REQUEST, INVALID, Some("model".into()), None),
            Self::RouteNotFound(_) => (S::NOT_FOUND, INVALID, None, Some("not_found")),
            Self::MethodNotAllowed => (
                S::METHOD_NOT_ALLOWED,
                INVALID,
                None,
                Some("method_not_allowed"),
            ),
            Self::PayloadTooLarge => (
                S::PAYLOAD_TOO_LARGE,
                INVALID,
                None,
                Some("payload_too_large"),
            ),
            Self::Unauthorized(_) => (S::UNAUTHORIZED, INVALID, None, Some("invalid_api_key")),
            Self::AdminOnly => (S::UNAUTHORIZED, INVALID, None, Some("invalid_admin_token")),
            Self::AdminOff => (S::FORBIDDEN, INVALID, None, Some("admin_disabled")),
            Self::CsrfMissing => (S::FORBIDDEN, INVALID, None, Some("csrf_token_missing")),
            Self::RateLimited { .. } => (
                S::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                Some("rate_limit_exceeded"),
            ),
            Self::KeyNotFound(_) => (
                S::NOT_FOUND,
                INVALID,
                Some("id".into()),
                Some("key_not_found"),
            ),
            Self::InsufficientQuota(_) => (
                S::PAYMENT_REQUIRED,
                "insufficient_quota",
                None,
                Some("insufficient_quota"),
            ),
            Self::NotFound { what, .. } => {
                (S::NOT_FOUND, INVALID, None, Some(not_found_code(what)))
            }
            Self::Conflict(_) => (S::CONFLICT, INVALID, None, Some("conflict")),
            Self::RangeNotSatisfiable { .. } => (
                S::RANGE_NOT_SATISFIABLE,
                INVALID,
                Some("range".into()),
                Some("range_not_satisfiable"),
            ),
            Self::Storage(_) => (S::INTERNAL_SERVER_ERROR, "server_error", None, None),
            Self::Engine(e) => engine_parts(e),
        }
    }

    /// The OpenAI error object (also sent as an SSE event mid-stream).
    pub fn to_object(&self) -> ErrorObject<'static> {
        let (status, kind, param, code) = self.parts();
        let message = if status.is_server_error()
            && !matches!(
                self,
                Self::Engine(EngineError::Overloaded { .. } | EngineError::Unavailable(_))
            ) {
            "the server had an error while processing your request".to_string()
        } else {
            self.to_string()
        };
        ErrorObject {
            message,
            kind,
            param,
            code,
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }
}

fn not_found_code(what: &str) -> &'static str {
    match what {
        "account" => "account_not_found",
        "order" => "order_not_found",
        "provider" => "provider_not_found",
        _ => "not_found",
    }
}

impl From<engine::registry::RegistryError> for ApiError {
    fn from(e: engine::registry::RegistryError) -> Self {
        crate::services::ServiceError::from(e).into()
    }
}

impl From<money::ledger::LedgerError> for ApiError {
    fn from(e: money::ledger::LedgerError) -> Self {
        use money::ledger::LedgerError as L;
        match e {
            L::InsufficientQuota { .. } | L::BudgetExceeded { .. } => {
                Self::InsufficientQuota(e.to_string())
            }
            L::UnknownAccount(id) => Self::NotFound {
                what: "account",
                id,
            },
            L::InvalidAmount(m) => Self::invalid("amount", m),
            L::InvalidLimit(m) => Self::invalid("credit_limit", m),
            L::WrongAccount(m) => Self::invalid("id", m),
            L::Closed => Self::Engine(EngineError::Shutdown),
            L::DuplicateHold(_) | L::Sql(_) => Self::Storage(e.to_string()),
        }
    }
}

impl From<crate::services::ServiceError> for ApiError {
    fn from(e: crate::services::ServiceError) -> Self {
        use crate::services::ServiceError as S;
        match e {
            S::ModelNotFound(m) => Self::ModelNotFound(m),
            S::WrongModelKind { model, endpoint } => Self::WrongModelKind { model, endpoint },
            S::NameTaken(_) => Self::invalid("name", e.to_string()),
            S::RateLimited { what, retry_after } => Self::RateLimited { what, retry_after },
            S::OverLimit { param, .. } => Self::invalid(param, e.to_string()),
            S::Engine(e) => Self::Engine(e),
            S::Ledger(e) => e.into(),
            S::Market(e) => e.into(),
        }
    }
}

impl From<money::market::MarketError> for ApiError {
    fn from(e: money::market::MarketError) -> Self {
        use money::market::MarketError as M;
        match e {
            M::UnknownRegion(r) => {
                Self::invalid("region", format!("no electricity price for region `{r}`"))
            }
            M::UnknownProvider(id) => Self::NotFound {
                what: "provider",
                id,
            },
            M::Invalid(field, m) => Self::invalid(field, m),
            M::OrderNotFound(id) => Self::NotFound { what: "order", id },
            M::Ledger(e) => e.into(),
            M::Sql(_) => Self::Storage(e.to_string()),
        }
    }
}

fn engine_parts(e: &EngineError) -> Parts {
    use StatusCode as S;
    match e {
        EngineError::Validation { field, .. } => {
            (S::BAD_REQUEST, INVALID, Some((*field).into()), None)
        }
        EngineError::ContextLength { .. } => (
            S::BAD_REQUEST,
            INVALID,
            Some("messages".into()),
            Some("context_length_exceeded"),
        ),
        EngineError::Template(_) => (S::BAD_REQUEST, INVALID, Some("messages".into()), None),
        EngineError::Overloaded { .. } => (
            S::SERVICE_UNAVAILABLE,
            "server_error",
            None,
            Some("overloaded"),
        ),
        EngineError::Unavailable(_) => (
            S::SERVICE_UNAVAILABLE,
            "server_error",
            None,
            Some("model_unavailable"),
        ),
        EngineError::Shutdown => (
            S::SERVICE_UNAVAILABLE,
            "server_error",
            None,
            Some("unavailable"),
        ),
        EngineError::Load(_)
        | EngineError::Tokenizer(_)
        | EngineError::Execution(_)
        | EngineError::Recompute(_) => (S::INTERNAL_SERVER_ERROR, "server_error", None, None),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, kind = "api_error", "request failed");
        } else {
            tracing::debug!(error = %self, "request rejected");
        }
        let mut resp = (
            status,
            Json(Body {
                error: self.to_object(),
            }),
        )
            .into_response();
        if let Self::RangeNotSatisfiable { len, .. } = self
            && let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}"))
        {
            resp.headers_mut().insert(header::CONTENT_RANGE, v);
        }
        if let Self::RateLimited { retry_after, .. } = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after.max(1)));
        } else if status == StatusCode::SERVICE_UNAVAILABLE
            || status == StatusCode::TOO_MANY_REQUESTS
        {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// The OpenAI error shape, as sent with every error status.
#[derive(ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    #[schema(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_openai_statuses_and_codes() {
        let ctx = ApiError::from(EngineError::ContextLength {
            max_context: 10,
            prompt_tokens: 8,
            max_tokens: 5,
        });
        assert_eq!(ctx.status(), StatusCode::BAD_REQUEST);
        assert_eq!(ctx.to_object().code, Some("context_length_exceeded"));
        let v = ApiError::from(EngineError::Validation {
            field: "top_p",
            message: "bad".into(),
        });
        assert_eq!(v.to_object().param.as_deref(), Some("top_p"));
        assert_eq!(
            ApiError::from(EngineError::Overloaded { waiting: 3 }).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ApiError::ModelNotFound("x".into()).status(),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn internal_errors_do_not_leak_details() {
        let e = ApiError::from(EngineError::Execution("tensor shape secret".into()));
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.to_object().message.contains("secret"));
    }

    #[test]
    fn overload_answers_carry_retry_after() {
        let resp = ApiError::from(EngineError::Overloaded { waiting: 1 }).into_response();
        assert_eq!(
            resp.headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
    }
}
