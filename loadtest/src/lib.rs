//! `synor-loadtest`: a serving benchmark that speaks only HTTP and SSE, so
//! it measures Synor and any other OpenAI-compatible server (llama.cpp's
//! `llama-server`, vLLM, Ollama) the same way. Metrics follow vLLM's
//! `benchmark_serving` definitions.
//!
//! - `cli`: arguments and their validation;
//! - `dataset`: the requests to send (random, chat JSONL, paraphrase sets);
//! - `traffic`: arrival times (Poisson / gamma) and the concurrency cap;
//! - `client`: one streamed request, timed chunk by chunk, with its
//!   `x-synor-cache` header (sent as `bypass` unless `--cache allow`);
//! - `bench`: runs a benchmark and gathers the outcomes;
//! - `metrics`: aggregates (percentiles, goodput, throughput, cache hits);
//! - `report`: the console block and the JSON result file;
//! - `plot`: SVG plots of the distributions and of throughput over time;
//! - `overhead`: latency of cheap requests (the HTTP path itself);
//! - `compare`: side-by-side table of two result files;
//! - `vllm`: vLLM's flat result file (`--save-result`);
//! - `probe`: the server's own view of running work (cancellation check).

pub mod bench;
pub mod cli;
pub mod client;
pub mod compare;
pub mod dataset;
pub mod genmodel;
pub mod metrics;
pub mod overhead;
pub mod plot;
pub mod probe;
pub mod report;
pub mod traffic;
pub mod vllm;
