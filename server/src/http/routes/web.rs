//! The admin console's static files (`web/`), embedded in the binary and
//! served at `/console` (the page), `/console/provider` (a provider's page,
//! signed in with a worker token) and `/console/<file>`: no build step, no
//! request leaves the server (a strict Content-Security-Policy says so to
//! the browser), and an ETag lets a reload revalidate instead of refetch.

use axum::Router;
use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::http::error::ApiError;
use crate::http::state::AppState;

/// What the console may load: its own files, and nothing else.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; \
                   frame-ancestors 'none'";

macro_rules! assets {
    ($($path:literal),* $(,)?) => {
        /// Every file of `web/` the console loads: (path under `/console/`, bytes).
        pub const ASSETS: &[(&str, &str)] = &[
            $(($path, include_str!(concat!("../../../../web/", $path)))),*
        ];
    };
}

assets!(
    "index.html",
    "provider.html",
    "provider.js",
    "console.css",
    "app.js",
    "api.js",
    "ui.js",
    "charts.js",
    "pages/overview.js",
    "pages/fleet.js",
    "pages/market.js",
    "pages/money.js",
    "pages/keys.js",
    "pages/caches.js",
    "pages/models.js",
    "provide.html",
    "provide.js",
    "provide-worker.js",
    "provide-engine.js",
    "provide-jspi.js",
);

/// Each asset's ETag (a digest of its bytes), computed once.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|(_, body)| format!("\"{}\"", hex16(&Sha256::digest(body.as_bytes()))))
        .collect()
});

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(page))
        .route("/console/", get(page))
        .route("/console/provider", get(provider_page))
        .route("/console/{*path}", get(asset))
}

async fn page(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// A file with the console's policy.
fn serve(path: &str, headers: &HeaderMap) -> Response {
    serve_with(path, headers, CSP)
}

/// The provider's page: signed in with a worker token.
async fn provider_page(headers: HeaderMap) -> Response {
    serve("provider.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

pub(super) fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    }
}

/// An embedded file with `csp` and its caching headers, or 304 when the
/// browser's copy is current.
pub(super) fn serve_with(path: &str, headers: &HeaderMap, csp: &'static str) -> Response {
    let Some(i) = ASSETS.iter().position(|(p, _)| *p == path) else {
        return ApiError::RouteNotFound(format!("/console/{path}")).into_response();
    };
    let body = axum::body::Bytes::from_static(ASSETS[i].1.as_bytes());
    respond(body, content_type(path), &ETAGS[i], headers, csp)
}

/// `body` with its security and caching headers, or 304 when the
/// browser's copy (`If-None-Match`) is `etag`.
pub(super) fn respond(
    body: axum::body::Bytes,
    kind: &'static str,
    etag: &str,
    headers: &HeaderMap,
    csp: &'static str,
) -> Response {
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, kind)], body).into_response()
    };
    let h = resp.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, csp),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    resp
}

/// The first 16 hex digits of a digest.
pub(super) fn hex16(d: &[u8]) -> String {
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    fn app() -> axum::Router {
        crate::http::app(AppState::new(std::sync::Arc::default()), 1 << 20)
    }

    #[tokio::test]
    async fn the_page_and_its_files_are_served_with_a_strict_policy() {
        for (url, kind) in [
            ("/console", "text/html"),
            ("/console/app.js", "text/javascript"),
            ("/console/pages/keys.js", "text/javascript"),
            ("/console/console.css", "text/css"),
        ] {
            let resp = app()
                .oneshot(Request::get(url).body(Body::empty()).expect("request"))
                .await
                .expect("response");
            assert_eq!(resp.status(), StatusCode::OK, "{url}");
            let h = resp.headers();
            assert!(
                h[header::CONTENT_TYPE]
                    .to_str()
                    .expect("ascii")
                    .starts_with(kind)
            );
            assert!(
                h[header::CONTENT_SECURITY_POLICY]
                    .to_str()
                    .expect("ascii")
                    .contains("default-src 'none'")
            );
            let etag = h[header::ETAG].clone();
            let again = app()
                .oneshot(
                    Request::get(url)
                        .header(header::IF_NONE_MATCH, etag)
                        .body(Body::empty())
                        .expect("request"),
                )
                .await
                .expect("response");
            assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{url}");
        }
        let missing = app()
            .oneshot(
                Request::get("/console/../Cargo.toml")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("response");
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }

    /// Every page the console loads is one of the embedded files, and
    /// no file names a host: no request leaves the server.
    #[test]
    fn the_console_loads_only_its_own_files() {
        for (path, body) in ASSETS {
            // SVG's namespace is a name, not a request.
            let body = body.replace("http://www.w3.org/2000/svg", "");
            for needle in ["http://", "https://", "//cdn", "@import url("] {
                assert!(
                    !body.contains(needle),
                    "{path} names an outside address: {needle}"
                );
            }
            if path.ends_with(".js") {
                for import in body
                    .lines()
                    .filter_map(|l| l.trim().strip_prefix("import "))
                {
                    let Some(from) = import.split(['\'', '"']).nth(1) else {
                        continue;
                    };
                    // The browser worker's engine is built, not embedded.
                    if from
                        .strip_prefix("/provide/")
                        .is_some_and(|f| super::super::provide::BUILT.contains(&f))
                    {
                        continue;
                    }
                    let target = from
                        .trim_start_matches("./")
                        .trim_start_matches("/console/")
                        .trim_start_matches("/provide/");
                    let base = path.rsplit_once('/').map_or("", |(d, _)| d);
                    let resolved = if let Some(up) = target.strip_prefix("../") {
                        up.to_string()
                    } else if base.is_empty() || from.starts_with('/') {
                        target.to_string()
                    } else {
                        format!("{base}/{target}")
                    };
                    assert!(
                        ASSETS.iter().any(|(p, _)| *p == resolved),
                        "{path} imports {from}, which is not embedded"
                    );
                }
            }
        }
    }
}
