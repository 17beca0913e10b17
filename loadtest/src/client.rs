//! One streamed request over HTTP + SSE, timed the way vLLM's serving
//! benchmark times it: the clock starts just before the request is sent;
//! TTFT is the first chunk with non-empty content (role-only and
//! usage-only chunks do not count); ITL are the gaps between
//! content-bearing chunks; E2E latency runs to `data: [DONE]`. Output
//! tokens come from `usage.completion_tokens` when the server sends it,
//! else from re-tokenizing the text (with `--tokenizer`), else from the
//! number of content chunks. Every request says whether the server's
//! response cache may answer it (`x-synor-cache: bypass` unless
//! `--cache allow`), and every response's `x-synor-cache` header (`miss`,
//! `bypass`, or the kind of hit) is kept, so cached answers never pass
//! for generation unnoticed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::dataset::RequestSpec;

/// Which OpenAI endpoint to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
}

/// The header that asks for (and reports) the server's response cache.
pub const CACHE_HEADER: &str = "x-synor-cache";

/// Whether the server's response cache may answer the requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Send `x-synor-cache: bypass`: every answer is generated.
    #[default]
    Bypass,
    /// Send no cache header: the server's own rules decide (measures the cache).
    Allow,
}

/// Where and how to send requests.
#[derive(Clone)]
pub struct Target {
    pub base_url: String,
    pub model: String,
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
    pub ignore_eos: bool,
    pub temperature: f32,
    pub top_p: Option<f32>,
    pub cache: CacheMode,
    /// Counts output tokens when the server sends no usage.
    pub tokenizer: Option<Arc<tokenizers::Tokenizer>>,
}

/// Timings and counts of one request. Times are from the moment it was sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestResult {
    pub ttft: Duration,
    pub e2e: Duration,
    /// Gaps between consecutive content-bearing chunks.
    pub itl: Vec<Duration>,
    /// Arrival of every content-bearing chunk.
    pub chunk_times: Vec<Duration>,
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Whether `output_tokens` came from the server's `usage`.
    pub usage_reported: bool,
    /// The response's `x-synor-cache` header, lowercased (`None` without one).
    #[serde(default)]
    pub cache: Option<String>,
    #[serde(skip)]
    pub text: String,
}

impl RequestResult {
    /// Time per output token after the first: (E2E - TTFT) / (tokens - 1).
    pub fn tpot(&self) -> Option<Duration> {
        (self.output_tokens > 1)
            .then(|| (self.e2e - self.ttft).div_f64((self.output_tokens - 1) as f64))
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Success(RequestResult),
    /// 429 or 503: the server shed load (counted apart from failures).
    Rejected {
        status: u16,
        retry_after: Option<f64>,
    },
    Failed(String),
    /// The client dropped the connection on purpose (cancellation storm).
    Cancelled(RequestResult),
}

/// The JSON body for `spec` on `target`'s endpoint.
pub fn request_body(target: &Target, spec: &RequestSpec) -> Value {
    let mut body = json!({
        "model": target.model,
        "max_tokens": spec.max_tokens,
        "temperature": target.temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(p) = target.top_p {
        body["top_p"] = json!(p);
    }
    match target.endpoint {
        Endpoint::Chat => body["messages"] = json!(spec.messages),
        Endpoint::Completions => body["prompt"] = json!(spec.prompt()),
    }
    if target.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    body
}

/// The URL of `target`'s endpoint.
pub fn endpoint_url(target: &Target) -> String {
    let path = match target.endpoint {
        Endpoint::Chat => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
    };
    format!("{}{path}", target.base_url.trim_end_matches('/'))
}

/// The request for `spec`: body, API key and (with `CacheMode::Bypass`)
/// `x-synor-cache: bypass`.
pub fn build_request(
    client: &reqwest::Client,
    target: &Target,
    spec: &RequestSpec,
) -> reqwest::RequestBuilder {
    let mut req = client
        .post(endpoint_url(target))
        .json(&request_body(target, spec));
    if let Some(key) = &target.api_key {
        req = req.bearer_auth(key);
    }
    match target.cache {
        CacheMode::Bypass => req.header(CACHE_HEADER, "bypass"),
        CacheMode::Allow => req,
    }
}

/// A response's `x-synor-cache` value, trimmed and lowercased.
pub fn cache_outcome(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let v = headers.get(CACHE_HEADER)?.to_str().ok()?.trim();
    (!v.is_empty()).then(|| v.to_ascii_lowercase())
}

/// Sends one streaming request and times it. With `cancel_after`, drops
/// the connection once that many content chunks have arrived.
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    spec: &RequestSpec,
    cancel_after: Option<usize>,
) -> Outcome {
    let url = endpoint_url(target);
    let req = build_request(client, target, spec);
    let start = Instant::now();
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("cannot reach {url}: {e}")),
    };
    let status = resp.status().as_u16();
    if status == 429 || status == 503 {
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok());
        return Outcome::Rejected {
            status,
            retry_after,
        };
    }
    if !resp.status().is_success() {
        let text = resp.text().await.unwrap_or_default();
        return Outcome::Failed(format!("{url} answered {status}: {}", text.trim()));
    }
    let mut timer = ChunkTimer::new(start, target.endpoint);
    timer.out.cache = cache_outcome(resp.headers());
    let mut bytes = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(piece) = bytes.next().await {
        let piece = match piece {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(format!("the stream broke: {e}")),
        };
        buf.extend_from_slice(&piece);
        while let Some((end, sep)) = event_end(&buf) {
            let event: Vec<u8> = buf.drain(..end + sep).collect();
            match timer.event(&String::from_utf8_lossy(&event)) {
                Ok(true) => return Outcome::Success(timer.finish(target)),
                Ok(false) => {}
                Err(e) => return Outcome::Failed(e),
            }
            if cancel_after.is_some_and(|k| timer.out.chunk_times.len() >= k) {
                return Outcome::Cancelled(timer.finish(target));
            }
        }
    }
    Outcome::Failed("the stream ended without [DONE]".into())
}

/// The end of the first complete SSE event in `buf` and its separator's length.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Turns SSE events into timings.
struct ChunkTimer {
    start: Instant,
    endpoint: Endpoint,
    last_content: Option<Instant>,
    out: RequestResult,
}

impl ChunkTimer {
    fn new(start: Instant, endpoint: Endpoint) -> Self {
        Self {
            start,
            endpoint,
            last_content: None,
            out: RequestResult::default(),
        }
    }

    /// Handles one event; `Ok(true)` at `[DONE]`.
    fn event(&mut self, event: &str) -> Result<bool, String> {
        for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
            let data = data.trim();
            if data == "[DONE]" {
                self.out.e2e = self.start.elapsed();
                return Ok(true);
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("malformed SSE chunk: {e}"))?;
            if let Some(err) = v.get("error") {
                return Err(format!("server error mid-stream: {err}"));
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                self.out.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
                self.out.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                self.out.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
                self.out.usage_reported = true;
            }
            let choice = &v["choices"][0];
            let content = match self.endpoint {
                Endpoint::Chat => choice["delta"]["content"].as_str(),
                Endpoint::Completions => choice["text"].as_str(),
            };
            let content = content.unwrap_or_default();
            if content.is_empty() {
                continue;
            }
            let now = Instant::now();
            match self.last_content {
                None => self.out.ttft = now - self.start,
                Some(prev) => self.out.itl.push(now - prev),
            }
            self.last_content = Some(now);
            self.out.chunk_times.push(now - self.start);
            self.out.text.push_str(content);
        }
        Ok(false)
    }

    /// The result, with output tokens counted if the server did not say.
    fn finish(mut self, target: &Target) -> RequestResult {
        if self.out.e2e.is_zero() {
            self.out.e2e = self.start.elapsed();
        }
        if !self.out.usage_reported {
            self.out.output_tokens = match &target.tokenizer {
                Some(t) => t
                    .encode(self.out.text.as_str(), false)
                    .map(|e| e.len() as u64)
                    .unwrap_or(self.out.chunk_times.len() as u64),
                None => self.out.chunk_times.len() as u64,
            };
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Message;

    fn target(cache: CacheMode) -> Target {
        Target {
            base_url: "http://127.0.0.1:8080/".into(),
            model: "m".into(),
            endpoint: Endpoint::Chat,
            api_key: Some("k".into()),
            ignore_eos: false,
            temperature: 0.0,
            top_p: None,
            cache,
            tokenizer: None,
        }
    }

    fn sent_cache_header(cache: CacheMode) -> Option<String> {
        let spec = RequestSpec {
            messages: vec![Message {
                role: "user".into(),
                content: "hi".into(),
            }],
            max_tokens: 4,
            group: None,
        };
        let req = build_request(&reqwest::Client::new(), &target(cache), &spec)
            .build()
            .expect("a valid request");
        assert_eq!(
            req.url().as_str(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        assert!(req.headers().contains_key("authorization"));
        req.headers()
            .get(CACHE_HEADER)
            .map(|v| v.to_str().unwrap_or_default().to_string())
    }

    #[test]
    fn bypass_mode_sends_the_bypass_header_and_allow_mode_sends_none() {
        assert_eq!(
            sent_cache_header(CacheMode::Bypass).as_deref(),
            Some("bypass")
        );
        assert_eq!(sent_cache_header(CacheMode::Allow), None);
        assert_eq!(CacheMode::default(), CacheMode::Bypass);
    }

    #[test]
    fn the_cache_outcome_is_read_trimmed_and_lowercased() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(cache_outcome(&h), None);
        h.insert(
            CACHE_HEADER,
            reqwest::header::HeaderValue::from_static(" L2 "),
        );
        assert_eq!(cache_outcome(&h).as_deref(), Some("l2"));
        h.insert(CACHE_HEADER, reqwest::header::HeaderValue::from_static(""));
        assert_eq!(cache_outcome(&h), None);
    }
}
