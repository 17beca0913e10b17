//! The HTTP layer: the OpenAI-compatible wire format (`api`), the routes,
//! the OpenAPI document, the auth and observe middleware, `/metrics`, the
//! handlers' state and the one mapping of every error to an HTTP answer
//! (`error`). Handlers parse, call a service or a domain module, and
//! encode; nothing below this layer knows about HTTP.

pub mod api;
pub mod auth;
pub mod error;
pub mod metrics;
pub mod observe;
pub mod openapi;
pub mod routes;
pub mod sampler;
pub mod state;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;

use state::AppState;

/// The full application router with its middleware.
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    routes::router(&state)
        .merge(openapi::router())
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(CatchPanicLayer::custom(panic_response))
        // Outermost, so it sees (and counts) the answers of the layers
        // inside it, panics included. `Router::layer` runs after routing,
        // so the matched route is known.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            observe::observe,
        ))
        .with_state(state)
}

/// A handler panic (a bug) becomes a generic OpenAI-shaped 500, not a
/// dropped connection; the details go to the log only.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(panic = %msg, "handler panicked");
    error::ApiError::from(engine::EngineError::Execution(msg)).into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn boom() -> &'static str {
        if std::hint::black_box(true) {
            panic!("secret detail");
        }
        "unreachable"
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_500_in_the_openai_shape() {
        let app: Router = Router::new()
            .route("/boom", get(boom))
            .layer(CatchPanicLayer::custom(panic_response));
        let resp = app
            .oneshot(Request::get("/boom").body(Body::empty()).expect("request"))
            .await
            .expect("response");
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(
            !body.windows(6).any(|w| w == b"secret"),
            "panic details leaked"
        );
    }
}
