//! The client's metric arithmetic against a real local HTTP server that
//! streams SSE chunks on a scripted schedule: TTFT, ITL, TPOT and E2E must
//! come out as scripted, with a role-only first chunk and a chunk carrying
//! several tokens; shed load and cancellations are told apart. The
//! `x-synor-cache` request header follows `--cache`, and a run the server
//! answers from its cache (`x-synor-cache: l2`) is counted as cache hits.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::stream;
use loadtest::bench::{self, Plan};
use loadtest::client::{self, CacheMode, Endpoint, Outcome, Target};
use loadtest::dataset::{Message, RequestSpec};
use loadtest::metrics::{self, Slo};
use loadtest::report::{self, BenchResult, RunInfo};

/// (delay before the event in ms, the event's data).
type Script = Vec<(u64, String)>;

fn chat_chunk(content: Option<&str>, role: bool) -> String {
    let mut delta = serde_json::Map::new();
    if role {
        delta.insert("role".into(), "assistant".into());
    }
    if let Some(c) = content {
        delta.insert("content".into(), c.into());
    }
    serde_json::json!({"choices": [{"index": 0, "delta": delta}]}).to_string()
}

fn chat_script() -> Script {
    vec![
        (0, chat_chunk(None, true)),
        (100, chat_chunk(Some("Hel"), false)),
        // One chunk carrying two tokens.
        (50, chat_chunk(Some("lo wor"), false)),
        (100, chat_chunk(Some("ld"), false)),
        (
            0,
            serde_json::json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 3}}})
            .to_string(),
        ),
        (50, "[DONE]".into()),
    ]
}

fn completion_script() -> Script {
    let c = |t: &str| serde_json::json!({"choices": [{"index": 0, "text": t}]}).to_string();
    vec![
        (80, c("a")),
        (40, c("b")),
        (40, c("c")),
        (0, "[DONE]".into()),
    ]
}

fn sse(script: Script) -> Response {
    let events = stream::unfold(script.into_iter(), |mut it| async move {
        let (delay, data) = it.next()?;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        Some((Ok::<_, std::io::Error>(format!("data: {data}\n\n")), it))
    });
    let mut resp = Body::from_stream(events).into_response();
    resp.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// A chat stream with `x-synor-cache: value`.
fn sse_marked(value: &str) -> Response {
    let mut resp = sse(chat_script());
    if let Ok(v) = HeaderValue::from_str(value) {
        resp.headers_mut().insert("x-synor-cache", v);
    }
    resp
}

/// Answers as Synor does without a cached answer: `bypass` when the
/// request asked for it, else `miss`.
async fn like_synor(headers: HeaderMap) -> Response {
    let asked = headers.get("x-synor-cache").and_then(|v| v.to_str().ok());
    sse_marked(if asked == Some("bypass") {
        "bypass"
    } else {
        "miss"
    })
}

async fn server() -> String {
    let app = Router::new()
        .route(
            "/ok/v1/chat/completions",
            post(|| async { sse(chat_script()) }),
        )
        .route(
            "/ok/v1/completions",
            post(|| async { sse(completion_script()) }),
        )
        .route(
            "/busy/v1/chat/completions",
            post(|| async {
                let mut r = (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response();
                r.headers_mut()
                    .insert("retry-after", HeaderValue::from_static("3"));
                r
            }),
        )
        .route(
            "/cached/v1/chat/completions",
            post(|| async { sse_marked("l2") }),
        )
        .route("/synor/v1/chat/completions", post(like_synor))
        .route(
            "/broken/v1/chat/completions",
            post(|| async { sse(vec![(10, chat_chunk(Some("x"), false))]) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn target(base: String, endpoint: Endpoint) -> Target {
    Target {
        base_url: base,
        model: "m".into(),
        endpoint,
        api_key: None,
        ignore_eos: false,
        temperature: 0.0,
        top_p: None,
        cache: CacheMode::Bypass,
        tokenizer: None,
    }
}

fn spec() -> RequestSpec {
    RequestSpec {
        messages: vec![Message {
            role: "user".into(),
            content: "hi".into(),
        }],
        max_tokens: 8,
        group: None,
    }
}

fn near(got: Duration, want_ms: f64, what: &str) {
    let got_ms = got.as_secs_f64() * 1e3;
    assert!(
        (got_ms - want_ms).abs() < 25.0,
        "{what}: {got_ms:.1} ms, scripted {want_ms} ms"
    );
}

#[tokio::test]
async fn chat_timings_come_out_as_scripted() {
    let base = server().await;
    let client = reqwest::Client::new();
    let out = client::send(
        &client,
        &target(format!("{base}/ok"), Endpoint::Chat),
        &spec(),
        None,
    )
    .await;
    let Outcome::Success(r) = out else {
        panic!("expected success, got {out:?}")
    };
    // The role-only chunk at 0 ms does not count: TTFT is the first content.
    near(r.ttft, 100.0, "TTFT");
    assert_eq!(r.itl.len(), 2);
    near(r.itl[0], 50.0, "ITL 1");
    near(r.itl[1], 100.0, "ITL 2");
    near(r.e2e, 300.0, "E2E");
    // Four tokens from usage (one chunk carried two): (300 - 100) / 3.
    assert_eq!(
        (r.output_tokens, r.prompt_tokens, r.cached_tokens),
        (4, 7, 3)
    );
    near(r.tpot().expect("tpot"), 200.0 / 3.0, "TPOT");
    assert_eq!(r.text, "Hello world");
}

#[tokio::test]
async fn completions_without_usage_count_content_chunks() {
    let base = server().await;
    let client = reqwest::Client::new();
    let t = target(format!("{base}/ok"), Endpoint::Completions);
    let Outcome::Success(r) = client::send(&client, &t, &spec(), None).await else {
        panic!("expected success")
    };
    assert!(!r.usage_reported);
    assert_eq!(r.output_tokens, 3);
    near(r.ttft, 80.0, "TTFT");
    near(r.e2e, 160.0, "E2E");
    near(r.tpot().expect("tpot"), 40.0, "TPOT");
}

#[tokio::test]
async fn shed_load_broken_streams_and_cancellations_are_told_apart() {
    let base = server().await;
    let client = reqwest::Client::new();
    let busy = client::send(
        &client,
        &target(format!("{base}/busy"), Endpoint::Chat),
        &spec(),
        None,
    )
    .await;
    assert_eq!(
        busy,
        Outcome::Rejected {
            status: 429,
            retry_after: Some(3.0)
        }
    );
    let broken = client::send(
        &client,
        &target(format!("{base}/broken"), Endpoint::Chat),
        &spec(),
        None,
    )
    .await;
    assert!(
        matches!(broken, Outcome::Failed(ref e) if e.contains("without [DONE]")),
        "{broken:?}"
    );
    let cut = client::send(
        &client,
        &target(format!("{base}/ok"), Endpoint::Chat),
        &spec(),
        Some(1),
    )
    .await;
    let Outcome::Cancelled(r) = cut else {
        panic!("expected a cancellation, got {cut:?}")
    };
    assert_eq!(r.chunk_times.len(), 1);
    // Nothing listens on port 9 of localhost.
    let down = client::send(
        &client,
        &target("http://127.0.0.1:9".into(), Endpoint::Chat),
        &spec(),
        None,
    )
    .await;
    assert!(
        matches!(down, Outcome::Failed(ref e) if e.contains("cannot reach")),
        "{down:?}"
    );
}

#[tokio::test]
async fn the_bypass_header_follows_the_cache_option_and_the_answer_is_recorded() {
    let base = server().await;
    let client = reqwest::Client::new();
    let mut t = target(format!("{base}/synor"), Endpoint::Chat);
    let cache_of = |out: Outcome| {
        let Outcome::Success(r) = out else {
            panic!("expected success, got {out:?}")
        };
        r.cache
    };
    let bypassed = client::send(&client, &t, &spec(), None).await;
    assert_eq!(cache_of(bypassed).as_deref(), Some("bypass"));
    t.cache = CacheMode::Allow;
    let allowed = client::send(&client, &t, &spec(), None).await;
    assert_eq!(cache_of(allowed).as_deref(), Some("miss"));
    // A server without a response cache sends no header.
    let plain = target(format!("{base}/ok"), Endpoint::Chat);
    assert_eq!(
        cache_of(client::send(&client, &plain, &spec(), None).await),
        None
    );
}

fn run_info(cache: CacheMode) -> RunInfo {
    RunInfo {
        date: report::utc_now(),
        base_url: "fake".into(),
        model: "m".into(),
        endpoint: "chat".into(),
        dataset: "fixed".into(),
        num_prompts: 3,
        request_rate: "inf".into(),
        burstiness: 1.0,
        max_concurrency: None,
        seed: 0,
        cache: Some(cache),
        command: "test".into(),
    }
}

#[tokio::test]
async fn a_run_answered_from_the_l2_cache_is_counted_as_hits_and_flagged() {
    let base = server().await;
    let mut t = target(format!("{base}/cached"), Endpoint::Chat);
    t.cache = CacheMode::Allow;
    let plan = Plan {
        target: t,
        specs: vec![spec(); 3],
        request_rate: f64::INFINITY,
        burstiness: 1.0,
        max_concurrency: None,
        seed: 0,
        warmup: false,
        cancel_after: None,
        progress: false,
        timeout: Duration::from_secs(10),
        duration: None,
    };
    let out = bench::run(&plan).await.expect("the run");
    let a = metrics::aggregate(&out.records, out.duration, 3, &[50.0], Slo::default());
    assert_eq!((a.completed, a.cache.hits, a.cache.misses), (3, 3, 0));
    assert_eq!(a.cache.hits_by_tier.get("l2"), Some(&3));
    assert_eq!(a.cache.hit_rate, Some(1.0));
    let result = BenchResult {
        run: run_info(CacheMode::Allow),
        aggregates: a,
        cancellation_check: None,
        output_tokens_per_second: Vec::new(),
        details: None,
    };
    let text = report::render(&result);
    assert!(text.contains("WARNING: 3 of 3 responses came from the response cache (l2 3)"));
    let json = serde_json::to_value(&result).expect("serializable");
    assert_eq!(json["aggregates"]["cache"]["hits_by_tier"]["l2"], 3);
    assert_eq!(json["aggregates"]["cache"]["hit_rate"], 1.0);
}
