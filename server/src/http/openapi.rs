//! The OpenAPI description of the HTTP API, generated from the code
//! (utoipa): served at `/openapi.json`, browsable offline at `/docs`
//! (vendored Swagger UI), and written to `openapi/openapi.json` by
//! `synor openapi` (a test fails when that file is stale).

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

pub use crate::http::error::{ErrorDetail, ErrorResponse};
use crate::http::routes;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let bearer =
            || SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build());
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("api_key", bearer());
        components.add_security_scheme("admin_token", bearer());
        components.add_security_scheme("worker_token", bearer());
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Synor Compute",
        description = "OpenAI-compatible inference serving: chat, completions, embeddings; operations and admin routes."
    ),
    paths(
        routes::chat::chat_completions,
        routes::completions::completions,
        routes::embeddings::embeddings,
        routes::models::list,
        routes::models::retrieve,
        routes::health::health,
        routes::health::ready,
        routes::health::metrics,
        routes::admin::create,
        routes::admin::list,
        routes::admin::revoke,
        routes::models_admin::load_model,
        routes::models_admin::files,
        routes::models_admin::unload_model,
        routes::accounts::usage,
        routes::accounts::spend,
        routes::accounts::list,
        routes::accounts::one,
        routes::accounts::create,
        routes::accounts::update,
        routes::accounts::top_up,
        routes::accounts::penalty,
        routes::accounts::journal,
        routes::accounts::audit,
        routes::market::prices,
        routes::market::book,
        routes::market::trades,
        routes::market::history,
        routes::market::post_bid,
        routes::market::cancel,
        routes::market::contracts,
        routes::market::post_ask,
        routes::market::regions,
        routes::market::set_region,
        routes::market::providers,
        routes::market::set_provider,
        routes::cache::stats,
        routes::cache::flush,
        routes::cache::threshold,
        routes::cache::shared,
        routes::providers::create,
        routes::providers::list,
        routes::providers::revoke,
        routes::providers::clear_quarantine,
        routes::fleet::connect,
        routes::earnings::earnings,
        routes::model_files::list,
        routes::model_files::file,
        routes::earnings::payout,
        routes::earnings::history,
        routes::earnings::payouts,
        routes::fleet::list,
        routes::console::sign_in,
        routes::console::sign_out,
        routes::console::current,
        routes::fleet::drain,
        routes::fleet::pause,
        routes::fleet::resume,
        routes::fleet::utilization,
        routes::fleet::spot_checks,
        routes::pipelines::list,
        routes::accounts::admin_usage,
        routes::market_admin::prices,
        routes::market_admin::book,
        routes::market_admin::trades,
        routes::market_admin::history,
        routes::market_admin::orders,
        routes::market_admin::cancel,
        routes::overview::overview,
        routes::overview::stream_overview,
    ),
    modifiers(&Security)
)]
pub struct ApiDoc;

/// The document as pretty JSON (what `openapi/openapi.json` holds).
pub fn json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
        + "\n"
}

/// `/openapi.json` and the Swagger UI at `/docs`.
pub fn router<S: Clone + Send + Sync + 'static>() -> axum::Router<S> {
    axum::Router::new()
        .route("/openapi.json", axum::routing::get(openapi_json))
        .merge(
            utoipa_swagger_ui::SwaggerUi::new("/docs").url("/docs/openapi.json", ApiDoc::openapi()),
        )
}

async fn openapi_json() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json(),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_committed_openapi_file_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == super::json(),
            "openapi/openapi.json is stale: run `cargo run -p synor --bin synor -- openapi`"
        );
    }

    #[test]
    fn every_json_answer_has_a_named_schema() {
        let doc: serde_json::Value = serde_json::from_str(&super::json()).expect("json");
        let mut untyped = Vec::new();
        for (path, ops) in doc["paths"].as_object().expect("paths") {
            for (method, op) in ops.as_object().expect("operations") {
                let responses = op["responses"].as_object().expect("responses");
                for (status, r) in responses {
                    let schema = &r["content"]["application/json"]["schema"];
                    if !schema.is_null() && schema.get("$ref").is_none() {
                        untyped.push(format!("{method} {path} {status}: {schema}"));
                    }
                }
            }
        }
        assert!(untyped.is_empty(), "free-form answers: {untyped:#?}");
    }

    /// The console's endpoint table (`web/api.js`, one `name: ['METHOD',
    /// '/path'],` per line): every call it makes is a documented route,
    /// and every documented admin route has a place in the console.
    #[test]
    fn the_console_calls_only_documented_routes_and_covers_the_admin_api() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../web/api.js");
        let js = std::fs::read_to_string(path).expect("web/api.js");
        let doc: serde_json::Value = serde_json::from_str(&super::json()).expect("json");
        let mut used = std::collections::BTreeSet::new();
        for line in js.lines() {
            let parts: Vec<&str> = line.split('\'').collect();
            if !(line.trim_start().contains(": ['") && parts.len() >= 5) {
                continue;
            }
            let (method, route) = (parts[1].to_ascii_lowercase(), parts[3]);
            assert!(
                doc["paths"][route][&method].is_object(),
                "web/api.js calls {method} {route}, which openapi.json does not describe"
            );
            used.insert((method, route.to_string()));
        }
        assert!(
            used.len() >= 30,
            "the endpoint table was not found: {used:?}"
        );
        // Admin routes the console needs no call of its own for.
        let elsewhere = [
            // One account: the list carries every field of each.
            ("get", "/admin/accounts/{id}"),
        ];
        let mut missing = Vec::new();
        for (route, ops) in doc["paths"].as_object().expect("paths") {
            for method in ops.as_object().expect("operations").keys() {
                let admin = route.starts_with("/admin/") || route.starts_with("/console/");
                let known = used.contains(&(method.clone(), route.clone()))
                    || elsewhere.contains(&(method.as_str(), route.as_str()));
                if admin && !known {
                    missing.push(format!("{method} {route}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "the console has no place for {missing:?}"
        );
    }

    #[test]
    fn every_public_route_is_described() {
        let doc = super::json();
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/models",
            "/admin/keys",
            "/metrics",
        ] {
            assert!(doc.contains(&format!("\"{path}\"")), "{path} is missing");
        }
    }
}
