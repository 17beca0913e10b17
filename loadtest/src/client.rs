//! One streamed chat request over HTTP + SSE, timed the way vLLM's serving
//! benchmark times it: TTFT is the first chunk with non-empty content
//! (role-only and usage-only chunks do not count), ITL the gaps between
//! content-bearing chunks, E2E latency runs to `data: [DONE]`.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Timings and counts of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestResult {
    pub ttft: Duration,
    pub e2e: Duration,
    /// Gaps between consecutive content-bearing chunks.
    pub itl: Vec<Duration>,
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub text: String,
}

impl RequestResult {
    /// Time per output token after the first: (E2E - TTFT) / (tokens - 1).
    pub fn tpot(&self) -> Option<Duration> {
        (self.output_tokens > 1).then(|| (self.e2e - self.ttft) / (self.output_tokens as u32 - 1))
    }
}

/// What to send.
#[derive(Debug, Clone)]
pub struct ChatJob {
    pub base_url: String,
    pub model: String,
    pub prompt: String,
    pub max_tokens: u32,
    pub ignore_eos: bool,
    pub api_key: Option<String>,
}

/// Sends one streaming chat completion and times it.
pub async fn stream_chat(client: &reqwest::Client, job: &ChatJob) -> anyhow::Result<RequestResult> {
    let body = json!({
        "model": job.model,
        "messages": [{"role": "user", "content": job.prompt}],
        "max_tokens": job.max_tokens,
        "temperature": 0,
        "ignore_eos": job.ignore_eos,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let url = format!("{}/v1/chat/completions", job.base_url.trim_end_matches('/'));
    let mut req = client.post(&url).json(&body);
    if let Some(key) = &job.api_key {
        req = req.bearer_auth(key);
    }
    let start = Instant::now();
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        bail!("{url} answered {status}: {text}");
    }
    let mut out = RequestResult::default();
    let mut last_content: Option<Instant> = None;
    let mut chunks = 0u64;
    let mut buf = String::new();
    let mut bytes = resp.bytes_stream();
    while let Some(piece) = bytes.next().await {
        buf.push_str(&String::from_utf8_lossy(&piece.context("stream broke")?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                let data = data.trim();
                if data == "[DONE]" {
                    out.e2e = start.elapsed();
                    if out.output_tokens == 0 {
                        out.output_tokens = chunks;
                    }
                    return Ok(out);
                }
                let v: Value = serde_json::from_str(data).context("malformed SSE chunk")?;
                if let Some(err) = v.get("error") {
                    bail!("server error mid-stream: {err}");
                }
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    out.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
                    out.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                }
                let content = v["choices"][0]["delta"]["content"]
                    .as_str()
                    .unwrap_or_default();
                if content.is_empty() {
                    continue;
                }
                let now = Instant::now();
                match last_content {
                    None => out.ttft = now - start,
                    Some(prev) => out.itl.push(now - prev),
                }
                last_content = Some(now);
                chunks += 1;
                out.text.push_str(content);
            }
        }
    }
    bail!("the stream ended without [DONE]")
}
