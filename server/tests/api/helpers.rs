//! Test helpers: model paths, an in-process app on the tiny fixture plus
//! MiniLM, and request helpers. (The real `synor` process is the `synor`
//! crate's to test: `synor/tests/binary`.)

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use engine::registry::{ModelKind, ModelRegistry, RegisteredModel};
use engine::{EmbeddingHandle, EngineConfig, EngineHandle, TemplateChoice};
use http_body_util::BodyExt;
use serde_json::Value;
use server::http::state::AppState;
use tower::ServiceExt;

pub const TINY: &str = "tiny";
pub const MINILM: &str = "minilm";
pub const BODY_LIMIT: usize = 64 * 1024;

pub fn models_dir() -> PathBuf {
    std::env::var_os("SYNOR_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"))
}

pub fn model_path(rel: &str) -> PathBuf {
    let p = models_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `make models` first",
        p.display()
    );
    p
}

static STATE: LazyLock<AppState> = LazyLock::new(|| {
    let tiny = EngineHandle::start_gguf(
        &model_path("tiny/tiny.gguf"),
        &TemplateChoice::Auto,
        EngineConfig::default(),
    )
    .expect("load tiny");
    let minilm = EmbeddingHandle::start(&model_path("all-minilm-l6-v2")).expect("load minilm");
    let models = vec![
        RegisteredModel {
            name: TINY.into(),
            created: 1,
            version: 1,
            kind: ModelKind::Text(tiny),
            path: None,
        },
        RegisteredModel {
            name: MINILM.into(),
            created: 1,
            version: 2,
            kind: ModelKind::Embedding(minilm),
            path: None,
        },
    ];
    AppState::new(Arc::new(ModelRegistry::new(models)))
});

/// A registry of its own over the shared test models (tiny, MiniLM).
pub fn shared_models() -> Arc<ModelRegistry> {
    Arc::new(ModelRegistry::new(STATE.models.list()))
}

/// The full router over the shared test models.
pub fn app() -> Router {
    server::app(STATE.clone(), BODY_LIMIT)
}

/// The shared test models under another access policy.
pub fn app_with_auth(auth: server::http::auth::Auth) -> Router {
    app_with_models_dir(auth, models_dir())
}

/// The shared test models, loading admin-added models from `dir`.
pub fn app_with_models_dir(auth: server::http::auth::Auth, dir: PathBuf) -> Router {
    let loader = engine::registry::ModelLoader {
        models_dir: dir,
        ..Default::default()
    };
    // Its own registry (over the same engines), so models an admin test
    // loads are not seen by other tests.
    let models = Arc::new(ModelRegistry::new(STATE.models.list()));
    let state = AppState::with_auth(models, auth).with_loader(loader);
    server::app(state, BODY_LIMIT)
}

/// A response: status, headers and body bytes.
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts an OpenAI error body with `status`; returns its `error` object.
    pub fn error(&self, status: StatusCode) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let err = self.json()["error"].clone();
        for key in ["message", "type", "param", "code"] {
            assert!(err.get(key).is_some(), "error lacks `{key}`: {err}");
        }
        err
    }

    /// The `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

pub async fn send(method: &str, uri: &str, content_type: Option<&str>, body: Vec<u8>) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = app()
        .oneshot(req.body(Body::from(body)).expect("request"))
        .await
        .expect("infallible");
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    Reply {
        status,
        content_type,
        body,
    }
}

pub async fn post(uri: &str, body: Value) -> Reply {
    send(
        "POST",
        uri,
        Some("application/json"),
        body.to_string().into_bytes(),
    )
    .await
}

pub async fn get(uri: &str) -> Reply {
    send("GET", uri, None, Vec::new()).await
}
