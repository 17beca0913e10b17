//! Tests against the real `synor` binary on port 0.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::process::{Synor, TINY};

/// The first model's statistics from `/health`.
async fn engine_stats(client: &reqwest::Client, synor: &Synor) -> Value {
    let health: Value = client
        .get(synor.url("/health"))
        .send()
        .await
        .expect("health")
        .json()
        .await
        .expect("json");
    health["models"][0].clone()
}

/// Sequences running or waiting in the engine.
async fn running(client: &reqwest::Client, synor: &Synor) -> u64 {
    let m = engine_stats(client, synor).await;
    m["running"].as_u64().expect("running count") + m["waiting"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_stops_its_generation() {
    let synor = Synor::start();
    let client = reqwest::Client::new();
    let body = json!({
        "model": TINY, "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 1500, "ignore_eos": true, "stream": true,
    });
    let resp = client
        .post(synor.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let mut bytes = resp.bytes_stream();
    let mut seen = 0;
    while seen < 5 {
        let chunk = bytes.next().await.expect("stream open").expect("chunk");
        seen += String::from_utf8_lossy(&chunk).matches("data: ").count();
    }
    assert_eq!(running(&client, &synor).await, 1);
    drop(bytes); // hang up
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&client, &synor).await > 0 {
        assert!(
            Instant::now() < deadline,
            "generation kept running after the client left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server is still healthy and serving.
    let ok = client
        .post(synor.url("/v1/chat/completions"))
        .json(&json!({"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .send()
        .await
        .expect("send");
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn sigterm_stops_the_server_cleanly() {
    let synor = Synor::start();
    let client = reqwest::Client::new();
    let models: Value = client
        .get(synor.url("/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], TINY);
    let status = tokio::task::spawn_blocking(move || synor.terminate())
        .await
        .expect("join");
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test]
async fn sigterm_gives_open_streams_a_bounded_grace_then_exits() {
    let synor = Synor::start_with(&["--shutdown-grace", "1"]);
    let client = reqwest::Client::new();
    let body = json!({"model": TINY, "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 1900, "ignore_eos": true, "stream": true});
    let resp = client
        .post(synor.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("send");
    let mut bytes = resp.bytes_stream();
    let _ = bytes.next().await.expect("a first chunk");
    let started = Instant::now();
    let stopped = tokio::task::spawn_blocking(move || synor.terminate());
    // The stream ends (finished, or cut after the grace period), not hangs.
    let drained = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(_)) = bytes.next().await {}
    })
    .await;
    assert!(drained.is_ok(), "the stream outlived the grace period");
    let status = stopped.await.expect("join");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_storm_of_cancelled_and_finished_streams_leaves_nothing_behind() {
    let synor = Synor::start();
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let (client, url) = (client.clone(), synor.url("/v1/chat/completions"));
        tasks.push(tokio::spawn(async move {
            let body = json!({
                "model": TINY, "messages": [{"role": "user", "content": format!("request {i}")}],
                "max_tokens": 40 + i, "ignore_eos": true, "stream": true, "n": 1 + i % 3, "seed": i,
            });
            let resp = client.post(url).json(&body).send().await.expect("send");
            assert_eq!(resp.status(), 200);
            let mut bytes = resp.bytes_stream();
            // Every other client hangs up after a few chunks.
            let limit = if i % 2 == 0 { 3 } else { usize::MAX };
            let mut chunks = 0;
            let mut done = false;
            while let Some(piece) = bytes.next().await {
                let text = String::from_utf8_lossy(&piece.expect("chunk")).into_owned();
                chunks += text.matches("data: ").count();
                done |= text.contains("[DONE]");
                if chunks >= limit {
                    break;
                }
            }
            assert!(done || i % 2 == 0, "request {i} ended without [DONE]");
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = engine_stats(&client, &synor).await;
        let idle =
            m["running"] == 0 && m["waiting"] == 0 && m["kv_cache_usage"].as_f64() == Some(0.0);
        if idle {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "engine not idle after the storm: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
