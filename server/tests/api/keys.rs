//! API keys in process, on a fresh SQLite file: 401 without a valid key,
//! admin routes behind the admin token, limits that trip (429 with
//! `Retry-After`) and recover, revocation.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use money::store::Db;
use serde_json::{Value, json};
use server::http::auth::Auth;
use tower::ServiceExt;

use crate::helpers::{MINILM, TINY, app_with_auth};

pub const ADMIN: &str = "admin-secret-for-tests";

pub async fn keyed_db() -> Db {
    let dir =
        std::env::temp_dir().join(format!("synor-api-keys-{}", uuid::Uuid::new_v4().simple()));
    Db::connect(&format!("sqlite://{}/k.db", dir.display()))
        .await
        .expect("sqlite")
}

async fn keyed_app() -> Router {
    app_with_auth(Auth::with_keys(keyed_db().await, Some(ADMIN.into())))
}

pub async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    bearer: Option<&str>,
    body: Option<Value>,
) -> Response<Body> {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(b) = bearer {
        req = req.header("authorization", format!("Bearer {b}"));
    }
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    app.clone()
        .oneshot(req.body(body).expect("request"))
        .await
        .expect("response")
}

async fn status_of(app: &Router, method: &str, uri: &str, bearer: Option<&str>) -> StatusCode {
    call(app, method, uri, bearer, None).await.status()
}

pub async fn json_of(resp: Response<Body>) -> Value {
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

async fn create(app: &Router, body: Value) -> String {
    let r = call(app, "POST", "/admin/keys", Some(ADMIN), Some(body)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    json_of(r).await["key"]
        .as_str()
        .expect("secret")
        .to_string()
}

async fn chat_as(app: &Router, key: &str, body: Value) -> Response<Body> {
    call(app, "POST", "/v1/chat/completions", Some(key), Some(body)).await
}

fn chat(max_tokens: u32, stream: bool) -> Value {
    json!({"model": TINY, "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens, "ignore_eos": true, "stream": stream})
}

#[tokio::test]
async fn keys_gate_the_api_and_admin_routes_need_the_admin_token() {
    let app = keyed_app().await;
    let r = call(&app, "GET", "/v1/models", None, None).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(json_of(r).await["error"]["code"], "invalid_api_key");
    assert_eq!(
        status_of(&app, "GET", "/health", None).await,
        StatusCode::OK
    );
    // Admin routes refuse no token and a user key alike.
    let anon = call(
        &app,
        "POST",
        "/admin/keys",
        None,
        Some(json!({"name": "x"})),
    )
    .await;
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    let secret = create(&app, json!({"name": "tenant-a"})).await;
    let as_user = call(&app, "GET", "/admin/keys", Some(&secret), None).await;
    assert_eq!(as_user.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        status_of(&app, "GET", "/v1/models", Some(&secret)).await,
        StatusCode::OK
    );
    let wrong = format!("{secret}x");
    assert_eq!(
        status_of(&app, "GET", "/v1/models", Some(&wrong)).await,
        StatusCode::UNAUTHORIZED
    );
    // Listing never shows secrets; revoking locks the key out at once.
    let list = json_of(call(&app, "GET", "/admin/keys", Some(ADMIN), None).await).await;
    let id = list["data"][0]["id"].as_str().expect("id").to_string();
    assert!(!list.to_string().contains(&secret));
    let del = call(
        &app,
        "DELETE",
        &format!("/admin/keys/{id}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(del.status(), StatusCode::OK);
    assert_eq!(
        status_of(&app, "GET", "/v1/models", Some(&secret)).await,
        StatusCode::UNAUTHORIZED
    );
    let again = call(
        &app,
        "DELETE",
        &format!("/admin/keys/{id}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
    let bad = call(
        &app,
        "POST",
        "/admin/keys",
        Some(ADMIN),
        Some(json!({"name": "x", "rpm_limit": 0})),
    )
    .await;
    assert_eq!(json_of(bad).await["error"]["param"], "rpm_limit");
}

#[tokio::test]
async fn limits_trip_with_retry_after_and_recover() {
    let app = keyed_app().await;
    let rpm = create(&app, json!({"name": "rpm", "rpm_limit": 2})).await;
    for _ in 0..2 {
        assert_eq!(
            status_of(&app, "GET", "/v1/models", Some(&rpm)).await,
            StatusCode::OK
        );
    }
    let r = call(&app, "GET", "/v1/models", Some(&rpm), None).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(json_of(r).await["error"]["code"], "rate_limit_exceeded");

    // One stream in flight holds the only slot until its body ends.
    let one = create(&app, json!({"name": "one", "max_concurrent": 1})).await;
    let first = chat_as(&app, &one, chat(4, true)).await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = chat_as(&app, &one, chat(4, false)).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let _ = first.into_body().collect().await.expect("stream");
    let third = chat_as(&app, &one, chat(4, false)).await;
    assert_eq!(third.status(), StatusCode::OK);

    // Tokens per minute are charged at admission: prompt plus max_tokens.
    // A request that alone is over the limit can never run: a 400 that
    // says so (a 429 would make the OpenAI SDK wait and retry for ever).
    let tpm = create(&app, json!({"name": "tpm", "tpm_limit": 200})).await;
    let big = chat_as(&app, &tpm, chat(300, false)).await;
    assert_eq!(big.status(), StatusCode::BAD_REQUEST);
    let err = json_of(big).await["error"].clone();
    assert_eq!(err["param"], "max_tokens", "{err}");
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("200 tokens per minute")),
        "{err}"
    );
    let small = chat_as(&app, &tpm, chat(4, false)).await;
    assert_eq!(small.status(), StatusCode::OK);
    let prompt = json_of(small).await["usage"]["prompt_tokens"]
        .as_u64()
        .expect("usage");
    // What is left of the minute is less than this one, which would fit
    // an empty minute: a 429, retry later.
    let rest = 200 - (prompt + 4);
    let later = chat_as(&app, &tpm, chat((rest + 1 - prompt) as u32, false)).await;
    assert_eq!(later.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn embeddings_count_against_tokens_per_minute_like_generations() {
    let app = keyed_app().await;
    let tpm = create(&app, json!({"name": "tpm-embed", "tpm_limit": 60})).await;
    let embed = |text: String| {
        let body = json!({"model": MINILM, "input": text});
        call(&app, "POST", "/v1/embeddings", Some(&tpm), Some(body))
    };
    // Worst case: one token per character plus the two special tokens;
    // more than the whole limit can never run.
    let big = embed("word ".repeat(20)).await;
    assert_eq!(big.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(big).await["error"]["param"], "input");
    for _ in 0..2 {
        let small = embed("hello world".into()).await;
        assert_eq!(small.status(), StatusCode::OK);
    }
    // 2 x 13 charged: a third 13 fits, then a 30-token one does not.
    let third = embed("hello world".into()).await;
    assert_eq!(third.status(), StatusCode::OK);
    let over = embed("x".repeat(28)).await;
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn admins_load_and_unload_models_without_a_restart() {
    let app = keyed_app().await;
    let key = create(&app, json!({"name": "models"})).await;
    let spec = json!({"name": "tiny-extra", "path": "tiny/tiny.gguf"});
    let anon = call(
        &app,
        "POST",
        "/admin/models",
        Some(&key),
        Some(spec.clone()),
    )
    .await;
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    let loaded = call(
        &app,
        "POST",
        "/admin/models",
        Some(ADMIN),
        Some(spec.clone()),
    )
    .await;
    assert_eq!(loaded.status(), StatusCode::CREATED);
    let list = json_of(call(&app, "GET", "/v1/models", Some(&key), None).await).await;
    assert!(list.to_string().contains("tiny-extra"), "{list}");
    let mut body = chat(3, false);
    body["model"] = json!("tiny-extra");
    assert_eq!(
        chat_as(&app, &key, body.clone()).await.status(),
        StatusCode::OK
    );
    let twice = call(&app, "POST", "/admin/models", Some(ADMIN), Some(spec)).await;
    assert_eq!(json_of(twice).await["error"]["param"], "name");
    let bad = json!({"name": "nope", "path": "no/such.gguf"});
    let bad = call(&app, "POST", "/admin/models", Some(ADMIN), Some(bad)).await;
    assert_eq!(json_of(bad).await["error"]["param"], "path");
    let gone = call(
        &app,
        "DELETE",
        "/admin/models/tiny-extra",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(gone.status(), StatusCode::OK);
    let r = chat_as(&app, &key, body).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let again = call(
        &app,
        "DELETE",
        "/admin/models/tiny-extra",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_model_loaded_with_sampling_defaults_uses_them_where_a_request_is_silent() {
    let app = keyed_app().await;
    let key = create(&app, json!({"name": "defaults"})).await;
    let bad = json!({"name": "tiny-bad", "path": "tiny/tiny.gguf",
        "generation_config": {"temperature": 7}});
    let bad = call(&app, "POST", "/admin/models", Some(ADMIN), Some(bad)).await;
    assert_eq!(json_of(bad).await["error"]["param"], "generation_config");
    let spec = json!({"name": "tiny-greedy", "path": "tiny/tiny.gguf",
        "generation_config": {"temperature": 0, "max_tokens": 3}});
    let loaded = call(&app, "POST", "/admin/models", Some(ADMIN), Some(spec)).await;
    assert_eq!(loaded.status(), StatusCode::CREATED);
    let ask = |extra: Value| {
        let mut body = json!({"model": "tiny-greedy", "ignore_eos": true,
            "messages": [{"role": "user", "content": "tell me a story"}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        let (app, key) = (app.clone(), key.clone());
        async move { json_of(chat_as(&app, &key, body).await).await }
    };
    // No max_tokens: the model's 3, not the rest of the context.
    let silent = ask(json!({})).await;
    assert_eq!(silent["usage"]["completion_tokens"], 3, "{silent}");
    assert_eq!(silent["choices"][0]["finish_reason"], "length");
    // No temperature: the model's greedy default, whatever the seed.
    let greedy = ask(json!({"temperature": 0, "max_tokens": 3})).await;
    for seed in [1, 2] {
        let seeded = ask(json!({"seed": seed})).await;
        assert_eq!(
            seeded["choices"][0]["message"]["content"],
            greedy["choices"][0]["message"]["content"]
        );
    }
    // A request's own value wins.
    let long = ask(json!({"max_tokens": 5})).await;
    assert_eq!(long["usage"]["completion_tokens"], 5, "{long}");
}

#[tokio::test]
async fn the_front_door_points_to_the_api_docs_and_console() {
    let app = keyed_app().await;
    let r = call(&app, "GET", "/", None, None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body = json_of(r).await;
    for path in ["/v1", "/docs", "/console", "/health", "/metrics"] {
        assert!(body["links"].get(path).is_some(), "{path}: {body}");
    }
    let page = app
        .clone()
        .oneshot(
            Request::get("/")
                .header("accept", "text/html,application/xhtml+xml")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("reply");
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.into_body().collect().await.expect("body").to_bytes();
    let html = String::from_utf8_lossy(&html);
    assert!(
        html.contains("href=\"/console\"") && html.contains("href=\"/docs\""),
        "{html}"
    );
}
