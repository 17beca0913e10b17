//! In-process router tests: the OpenAI shapes, streaming, and every error
//! path, through `server::app` with `tower::ServiceExt::oneshot`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{BODY_LIMIT, MINILM, TINY, get, post, send};

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": TINY,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
        "ignore_eos": true,
        "seed": 1,
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

#[tokio::test]
async fn chat_returns_an_openai_completion_with_usage() {
    let r = post("/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-"))
    );
    assert_eq!(v["model"], TINY);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap_or(0) + 5)
    );
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn text_parts_are_accepted_like_a_string() {
    let parts = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}]});
    let a = post("/v1/chat/completions", chat(parts)).await.json();
    let b = post("/v1/chat/completions", chat(json!({}))).await.json();
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
    assert_eq!(a["usage"], b["usage"]);
}

#[tokio::test]
async fn streaming_sends_role_deltas_finish_usage_and_done() {
    let body = chat(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let r = post("/v1/chat/completions", body.clone()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.content_type.starts_with("text/event-stream"),
        "{}",
        r.content_type
    );
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    let finish = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(finish["finish_reason"], "length");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let plain = post("/v1/chat/completions", chat(json!({}))).await.json();
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
    );
}

#[tokio::test]
async fn completions_answer_each_prompt_as_a_choice() {
    let body = json!({"model": TINY, "prompt": ["a b c", "x y"], "max_tokens": 3, "ignore_eos": true, "seed": 2});
    let v = post("/v1/completions", body).await.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let tokens = json!({"model": TINY, "prompt": [1, 450, 4996], "max_tokens": 2, "ignore_eos": true, "echo": true});
    let v = post("/v1/completions", tokens).await.json();
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn streamed_completions_end_with_done() {
    let body = json!({"model": TINY, "prompt": "a b c", "max_tokens": 4, "ignore_eos": true, "stream": true});
    let data = post("/v1/completions", body).await.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&data[data.len() - 2]).expect("chunk");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn embeddings_come_as_floats_or_base64() {
    let v = post(
        "/v1/embeddings",
        json!({"model": MINILM, "input": ["one", "two"]}),
    )
    .await
    .json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][1]["index"], 1);
    assert_eq!(
        v["data"][0]["embedding"].as_array().map(Vec::len),
        Some(384)
    );
    assert!(v["usage"]["prompt_tokens"].as_u64().is_some_and(|n| n >= 2));
    let b = post(
        "/v1/embeddings",
        json!({"model": MINILM, "input": "one", "encoding_format": "base64"}),
    )
    .await
    .json();
    let s = b["data"][0]["embedding"].as_str().expect("base64 string");
    assert_eq!(
        s.len(),
        2048,
        "384 f32 = 1536 bytes = 2048 base64 characters"
    );
}

#[tokio::test]
async fn models_are_listed_and_retrievable() {
    let v = get("/v1/models").await.json();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [TINY, MINILM]);
    assert_eq!(
        get(&format!("/v1/models/{TINY}")).await.json()["object"],
        "model"
    );
    assert_eq!(
        get("/v1/models/nope").await.error(StatusCode::NOT_FOUND)["code"],
        "model_not_found"
    );
    assert_eq!(get("/health").await.json()["status"], "ok");
}

#[tokio::test]
async fn invalid_parameters_are_named() {
    let cases = [
        (json!({"temperature": 5}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (
            json!({"max_completion_tokens": -3}),
            "max_completion_tokens",
        ),
        (json!({"n": 99}), "n"),
        (json!({"n": 0}), "n"),
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"logit_bias": {"five": 1.0}}), "logit_bias"),
        (json!({"logit_bias": {"5": 500.0}}), "logit_bias"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 50}),
            "top_logprobs",
        ),
        (
            json!({"tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
            "response_format",
        ),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"stop": "x".repeat(257)}), "stop"),
        (
            json!({"stop_token_ids": (0..65).collect::<Vec<u32>>()}),
            "stop_token_ids",
        ),
        (json!({"stop_token_ids": [1_000_000]}), "stop_token_ids"),
        (
            json!({"logit_bias": (0..301).map(|t| (t.to_string(), json!(1.0))).collect::<serde_json::Map<String, Value>>()}),
            "logit_bias",
        ),
        (
            json!({"tools": [weather_tool(), weather_tool()]}),
            "tools[1].function.name",
        ),
        (json!({"tools": vec![weather_tool(); 129]}), "tools"),
        (json!({"max_tokens": 1_000_000_000_000i64}), "messages"),
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"top_k": -5}), "top_k"),
        (json!({"frobnicate": true}), "frobnicate"),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (json!({"temperature": "hot"}), "temperature"),
    ];
    for (extra, param) in cases {
        let r = post("/v1/chat/completions", chat(extra.clone())).await;
        let err = r.error(StatusCode::BAD_REQUEST);
        assert_eq!(err["param"], param, "for {extra}: {err}");
        assert_eq!(err["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn n_choices_share_a_prompt_and_report_log_probabilities() {
    let body = chat(json!({"n": 3, "temperature": 1.0, "logprobs": true, "top_logprobs": 2}));
    let v = post("/v1/chat/completions", body).await.json();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let content = c["logprobs"]["content"]
            .as_array()
            .expect("logprobs content");
        assert_eq!(content.len(), 5, "one entry per generated token");
        for e in content {
            assert!(e["logprob"].as_f64().is_some_and(|l| l <= 0.0));
            assert_eq!(e["top_logprobs"].as_array().map(Vec::len), Some(2));
            assert!(e["bytes"].is_array() && e["token"].is_string());
        }
    }
    assert_eq!(v["usage"]["completion_tokens"], 15);
    // Seeded choices differ from one another (seed + i each).
    let texts: std::collections::HashSet<String> = choices
        .iter()
        .map(|c| c["message"]["content"].to_string())
        .collect();
    assert!(texts.len() > 1, "all choices identical: {texts:?}");
}

#[tokio::test]
async fn completions_report_legacy_logprobs_and_accept_penalties() {
    let body = json!({
        "model": TINY, "prompt": "a b c", "max_tokens": 4, "ignore_eos": true, "logprobs": 3,
        "presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {"7": -100}, "n": 2, "seed": 4,
    });
    let v = post("/v1/completions", body).await.json();
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(4));
    assert_eq!(lp["token_logprobs"].as_array().map(Vec::len), Some(4));
    assert_eq!(lp["top_logprobs"][0].as_object().map(|o| o.len()), Some(3));
    assert_eq!(lp["text_offset"][0], 0);
}

#[tokio::test]
async fn context_overflow_and_unsupported_completion_fields_are_refused() {
    let r = post(
        "/v1/chat/completions",
        chat(json!({"max_tokens": 10_000_000})),
    )
    .await;
    assert_eq!(
        r.error(StatusCode::BAD_REQUEST)["code"],
        "context_length_exceeded"
    );
    let r = post(
        "/v1/completions",
        json!({"model": TINY, "prompt": "a", "suffix": "b"}),
    )
    .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST)["param"], "suffix");
    let r = post(
        "/v1/completions",
        json!({"model": TINY, "prompt": [1, 99_999_999]}),
    )
    .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST)["param"], "prompt");
    let r = post("/v1/completions", json!({"model": TINY, "prompt": []})).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST)["param"], "prompt");
}

#[tokio::test]
async fn models_must_exist_and_fit_the_endpoint() {
    let r = post("/v1/chat/completions", chat(json!({"model": "gpt-4"}))).await;
    assert_eq!(r.error(StatusCode::NOT_FOUND)["code"], "model_not_found");
    let r = post("/v1/chat/completions", chat(json!({"model": MINILM}))).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST)["param"], "model");
    let r = post("/v1/embeddings", json!({"model": TINY, "input": "x"})).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST)["param"], "model");
}

#[tokio::test]
async fn embedding_inputs_are_checked() {
    for (body, param) in [
        (json!({"model": MINILM, "input": []}), "input"),
        (json!({"model": MINILM, "input": ["ok", ""]}), "input[1]"),
        (
            json!({"model": MINILM, "input": "x", "dimensions": 10}),
            "dimensions",
        ),
        (
            json!({"model": MINILM, "input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"model": MINILM, "input": [[1, 999_999]]}), "input"),
    ] {
        let r = post("/v1/embeddings", body).await;
        assert_eq!(r.error(StatusCode::BAD_REQUEST)["param"], param);
    }
}

#[tokio::test]
async fn malformed_bodies_oversized_bodies_and_unknown_routes() {
    let r = send(
        "POST",
        "/v1/chat/completions",
        Some("application/json"),
        b"{\"model\": ".to_vec(),
    )
    .await;
    assert!(
        r.error(StatusCode::BAD_REQUEST)["message"]
            .as_str()
            .is_some_and(|m| m.contains("not valid JSON"))
    );
    let r = send(
        "POST",
        "/v1/chat/completions",
        Some("text/plain"),
        b"{}".to_vec(),
    )
    .await;
    let msg = r.error(StatusCode::BAD_REQUEST)["message"].to_string();
    assert!(msg.contains("Content-Type: application/json"), "{msg}");
    // `curl -d` sends form encoding; a JSON body is still accepted.
    let form = "application/x-www-form-urlencoded";
    let r = send(
        "POST",
        "/v1/completions",
        Some(form),
        json!({"model": TINY, "prompt": "a", "max_tokens": 1})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let big = json!({"model": TINY, "prompt": "x".repeat(BODY_LIMIT * 2)});
    post("/v1/completions", big)
        .await
        .error(StatusCode::PAYLOAD_TOO_LARGE);
    get("/v2/nothing").await.error(StatusCode::NOT_FOUND);
    send("DELETE", "/v1/chat/completions", None, Vec::new())
        .await
        .error(StatusCode::METHOD_NOT_ALLOWED);
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}},
            "required": ["city"], "additionalProperties": false}}})
}

#[tokio::test]
async fn a_forced_tool_call_names_the_function_with_valid_arguments() {
    let forced = json!({"tools": [weather_tool()], "max_tokens": 200, "ignore_eos": false,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let v = post("/v1/chat/completions", chat(forced.clone()))
        .await
        .json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null());
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call-"))
    );
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("a string"))
            .expect("arguments are JSON");
    assert!(
        args["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 5),
        "{args}"
    );
    // Streamed: one chunk carries the whole call, with its index.
    let mut streamed = forced;
    streamed["stream"] = json!(true);
    let r = post("/v1/chat/completions", chat(streamed)).await;
    let chunks: Vec<Value> = r
        .sse_data()
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{last}");
    let call = &last["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(
        (call["index"].as_u64(), &call["function"]["name"]),
        (Some(0), &json!("get_weather"))
    );
}

#[tokio::test]
async fn token_id_embeddings_match_the_text_they_encode() {
    // "hello world" in MiniLM's WordPiece vocabulary, with [CLS] and [SEP].
    let text = post(
        "/v1/embeddings",
        json!({"model": MINILM, "input": "hello world"}),
    )
    .await;
    let ids = post(
        "/v1/embeddings",
        json!({"model": MINILM, "input": [[101, 7592, 2088, 102], [101, 7592, 102]]}),
    )
    .await;
    assert_eq!(ids.status, StatusCode::OK, "{}", ids.text());
    let (a, b) = (text.json(), ids.json());
    let va = a["data"][0]["embedding"].as_array().expect("vector");
    let vb = b["data"][0]["embedding"].as_array().expect("vector");
    let dot: f64 = va
        .iter()
        .zip(vb)
        .map(|(x, y)| x.as_f64().unwrap_or(0.0) * y.as_f64().unwrap_or(0.0))
        .sum();
    assert!(dot > 0.9999, "cosine {dot}");
    assert_eq!(b["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(b["usage"]["prompt_tokens"], 7);
    let bad = post(
        "/v1/embeddings",
        json!({"model": MINILM, "input": [999_999]}),
    )
    .await;
    assert_eq!(bad.error(StatusCode::BAD_REQUEST)["param"], "input");
    let empty = post(
        "/v1/embeddings",
        json!({"model": MINILM, "input": [[101], []]}),
    )
    .await;
    assert_eq!(empty.error(StatusCode::BAD_REQUEST)["param"], "input[1]");
}
