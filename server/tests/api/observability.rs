//! `/metrics`, `/ready` and `x-request-id`, in process.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;

use crate::helpers::{TINY, app, get, post};

/// The value of the first sample line of `name` with all of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.split(['{', ' ']).next() == Some(name) && labels.iter().all(|lb| l.contains(lb))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_requests_tokens_and_latencies_per_model() {
    let model = format!("model_name=\"{TINY}\"");
    let before = get("/metrics").await.text();
    let body = json!({"model": TINY, "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4, "ignore_eos": true});
    let r = post("/v1/chat/completions", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let m = get("/metrics").await;
    assert_eq!(m.status, StatusCode::OK);
    assert!(
        m.content_type.starts_with("text/plain"),
        "{}",
        m.content_type
    );
    let after = m.text();
    let delta = |name: &str, labels: &[&str]| {
        sample(&after, name, labels).unwrap_or(0.0) - sample(&before, name, labels).unwrap_or(0.0)
    };
    // Other tests share the engine, so compare at least what this one did.
    assert!(delta("synor:generation_tokens_total", &[&model]) >= 4.0);
    assert!(
        delta(
            "synor:request_success_total",
            &[&model, "finished_reason=\"length\""]
        ) >= 1.0
    );
    assert!(delta("synor:time_to_first_token_seconds_count", &[&model]) >= 1.0);
    assert!(delta("synor:inter_token_latency_seconds_count", &[&model]) >= 3.0);
    assert!(delta("synor:e2e_request_latency_seconds_count", &[&model]) >= 1.0);
    assert!(delta("synor:request_queue_time_seconds_count", &[&model]) >= 1.0);
    assert!(sample(&after, "synor:num_requests_running", &[&model]).is_some());
    assert!(sample(&after, "synor:kv_cache_usage_perc", &[&model]).is_some());
    // The request wrote KV blocks: the CPU executor holds their memory.
    let kv_bytes = sample(&after, "synor:kv_cache_bytes", &[&model]).expect("kv bytes");
    assert!(kv_bytes > 0.0, "{kv_bytes}");
    let http = [
        "route=\"/v1/chat/completions\"",
        "method=\"POST\"",
        "status=\"200\"",
    ];
    assert!(delta("synor:http_requests_total", &http) >= 1.0);
    let _ = get("/no/such/route").await;
    let after404 = get("/metrics").await.text();
    assert!(
        sample(
            &after404,
            "synor:http_requests_total",
            &["route=\"unmatched\"", "status=\"404\""]
        )
        .is_some()
    );
}

#[tokio::test]
async fn ready_answers_once_models_are_loaded() {
    let r = get("/ready").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["status"], "ready");
}

#[tokio::test]
async fn request_ids_are_honoured_or_made() {
    let call = |id: Option<&str>| {
        let mut req = Request::get("/v1/models");
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        app().oneshot(req.body(Body::empty()).expect("request"))
    };
    let resp = call(Some("abc-123")).await.expect("response");
    assert_eq!(resp.headers()["x-request-id"], "abc-123");
    let resp = call(None).await.expect("response");
    let made = resp.headers()["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert_eq!(made.len(), 36, "a UUID: {made}");
    // An unprintable id is replaced, not echoed.
    let resp = call(Some("bad id")).await.expect("response");
    assert_ne!(resp.headers()["x-request-id"], "bad id");
    let _ = resp.into_body().collect().await;
}

#[tokio::test]
async fn the_openapi_document_and_its_docs_page_are_served_without_a_key() {
    let doc = get("/openapi.json").await;
    assert_eq!(doc.status, StatusCode::OK);
    let v = doc.json();
    assert!(v["openapi"].as_str().is_some_and(|s| s.starts_with('3')));
    assert!(v["paths"]["/v1/chat/completions"]["post"].is_object());
    let page = get("/docs/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text().contains("swagger"), "{}", page.text());
}
