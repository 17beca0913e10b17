//! `GET /`: the front door. A browser gets a short page linking to the
//! console, the API reference and the health and metrics routes; any other
//! client gets the same links as JSON, so a newcomer who opens the address
//! the server printed never meets a bare 404.

use axum::Router;
use axum::http::{HeaderMap, header};
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::json;

use crate::http::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/", get(home))
}

/// Where to go from here: (path, what it is).
const LINKS: [(&str, &str); 7] = [
    (
        "/v1",
        "the OpenAI-compatible API (base URL for the OpenAI SDK)",
    ),
    ("/docs", "the API reference (OpenAPI, browsable)"),
    ("/console", "the admin console (needs the admin token)"),
    (
        "/console/provider",
        "a provider's earnings and payouts (needs a worker token)",
    ),
    ("/v1/models", "the models served (needs an API key)"),
    ("/health", "liveness and each model's engine"),
    ("/metrics", "Prometheus metrics"),
];

async fn home(headers: HeaderMap) -> Response {
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if wants_html {
        return Html(page()).into_response();
    }
    let links: serde_json::Map<String, serde_json::Value> = LINKS
        .iter()
        .map(|(path, what)| ((*path).to_string(), json!(what)))
        .collect();
    Json(json!({
        "object": "server",
        "name": "synor",
        "version": env!("CARGO_PKG_VERSION"),
        "links": links,
    }))
    .into_response()
}

fn page() -> String {
    let items: String = LINKS
        .iter()
        .map(|(path, what)| format!("<li><a href=\"{path}\">{path}</a>: {what}</li>"))
        .collect();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Synor Compute</title></head>\
         <body><h1>Synor Compute {}</h1><p>An OpenAI-compatible inference server.</p><ul>{items}</ul></body></html>",
        env!("CARGO_PKG_VERSION")
    )
}
