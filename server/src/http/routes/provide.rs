//! `/provide`: the page that makes a browser tab a provider's worker. Its
//! page and scripts are embedded with the console's (`web/provide*.js`);
//! the engine it runs (`tab.js`, `tab_bg.wasm`: the `tab` crate built for
//! WebAssembly by `make tab`) is read from the directory
//! `SYNOR_TAB_DIR` names, by default `tab/` beside the server's binary
//! or one level up,
//! once, when first asked for. The policy lets the page compile
//! WebAssembly and start its own worker script, and nothing else: no
//! other origin, no inline script, no eval.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use super::web::{content_type, hex16, respond, serve_with};
use crate::http::error::ApiError;
use crate::http::state::AppState;

/// What the page and its worker may do.
const CSP: &str = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; \
                   style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The engine's files, as built.
pub(super) const BUILT: [&str; 2] = ["tab.js", "tab_bg.wasm"];

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/provide", get(page))
        .route("/provide/{file}", get(file))
}

async fn page(headers: HeaderMap) -> Response {
    serve_with("provide.html", &headers, CSP)
}

async fn file(Path(file): Path<String>, headers: HeaderMap) -> Response {
    match file.as_str() {
        "provide.js" | "provide-worker.js" | "provide-engine.js" | "provide-jspi.js" => {
            serve_with(&file, &headers, CSP)
        }
        built if BUILT.contains(&built) => match engine_file(built) {
            Ok((body, etag)) => respond(body, content_type(built), &etag, &headers, CSP),
            Err(e) => e.into_response(),
        },
        _ => ApiError::RouteNotFound(format!("/provide/{file}")).into_response(),
    }
}

/// The built engine's files with their ETags, read once.
type Built = Arc<Vec<(Bytes, String)>>;
static ENGINE: Mutex<Option<Built>> = Mutex::new(None);

/// Where the built engine lives: `SYNOR_TAB_DIR`, else `tab/` beside
/// the binary or one level up (`make tab` writes `target/tab/`, beside
/// `target/debug/` and `target/release/`).
fn engine_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SYNOR_TAB_DIR") {
        return Some(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    [bin.join("tab"), bin.parent()?.join("tab")]
        .into_iter()
        .find(|d| d.join(BUILT[1]).is_file())
}

/// One of the built engine's files: read on first use (until then a
/// clear 404 says how to build it).
fn engine_file(name: &str) -> Result<(Bytes, String), ApiError> {
    let mut kept = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if kept.is_none() {
        let missing = |why: String| ApiError::NotFound {
            what: "browser worker build",
            id: format!("{name} ({why}; build it with `make tab`, or set SYNOR_TAB_DIR)"),
        };
        let dir = engine_dir().ok_or_else(|| missing("no directory".into()))?;
        let mut files = Vec::new();
        for f in BUILT {
            let path = dir.join(f);
            let body =
                std::fs::read(&path).map_err(|e| missing(format!("{}: {e}", path.display())))?;
            let etag = format!("\"{}\"", hex16(&Sha256::digest(&body)));
            files.push((Bytes::from(body), etag));
        }
        *kept = Some(Arc::new(files));
    }
    let files = kept.clone().unwrap_or_default();
    let i = BUILT.iter().position(|f| *f == name).unwrap_or(0);
    files
        .get(i)
        .cloned()
        .ok_or_else(|| ApiError::RouteNotFound(format!("/provide/{name}")))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use tower::ServiceExt;

    use super::*;

    fn app() -> axum::Router {
        crate::http::app(AppState::new(std::sync::Arc::default()), 1 << 20)
    }

    async fn get(url: &str) -> axum::response::Response {
        app()
            .oneshot(Request::get(url).body(Body::empty()).expect("request"))
            .await
            .expect("response")
    }

    #[tokio::test]
    async fn the_page_and_its_worker_may_run_webassembly_and_nothing_from_elsewhere() {
        for (url, kind) in [
            ("/provide", "text/html"),
            ("/provide/provide.js", "text/javascript"),
            ("/provide/provide-worker.js", "text/javascript"),
            ("/provide/provide-engine.js", "text/javascript"),
            ("/provide/provide-jspi.js", "text/javascript"),
        ] {
            let resp = get(url).await;
            assert_eq!(resp.status(), StatusCode::OK, "{url}");
            let h = resp.headers();
            let kind_of = h[header::CONTENT_TYPE].to_str().expect("ascii");
            assert!(kind_of.starts_with(kind), "{url}: {kind_of}");
            let csp = h[header::CONTENT_SECURITY_POLICY].to_str().expect("ascii");
            assert_eq!(csp, CSP);
            assert!(!csp.contains("unsafe-inline") && !csp.contains("'unsafe-eval'"));
        }
        // Only the page's own files; nothing else is reachable here.
        for url in [
            "/provide/console.css",
            "/provide/../Cargo.toml",
            "/provide/x.wasm",
        ] {
            assert_eq!(get(url).await.status(), StatusCode::NOT_FOUND, "{url}");
        }
    }
}
