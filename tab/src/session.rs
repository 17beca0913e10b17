//! A browser tab's worker session, without I/O: the page's Web Worker owns
//! the WebSocket and the clock's loop, and hands this what arrives;
//! this answers with the protocol messages to send. It holds one model's
//! engine, driven a turn at a time (a tab has no threads), and runs the
//! jobs placed on it exactly as a native worker does (`submit_raw` after
//! the tokens an earlier attempt delivered, every event forwarded in
//! order). What a tab cannot do (embeddings, split prefill/decode,
//! pipeline stages) it refuses at once, so the server places it
//! elsewhere.

use std::collections::HashMap;

use engine::core::EngineCore;
use engine::{EngineConfig, EngineHandle, GenerateRequest, RawStream, TemplateChoice};
use protocol::engine_side::{Meter, job_message, served_model};
use protocol::{Device, FromWorker, ToWorker, VERSION};

/// What the tab tells the server about itself.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The provider's name for this tab.
    pub name: String,
    pub region: String,
    /// The browser (its user agent), shown to admins.
    pub browser: String,
    /// Logical processors the browser reports.
    pub cores: u32,
}

/// Where a tab's engine runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum On {
    /// The CPU kernels (WebAssembly SIMD128).
    Cpu,
    /// The page's WebGPU adapter (opened first: `gpu::open_gpu`), as
    /// the browser describes it.
    Gpu { adapter: String },
}

/// One running attempt.
#[derive(Debug)]
struct Job {
    attempt: u32,
    stream: RawStream,
}

/// What the page shows: this tab's own counts (the server's, which pay,
/// come from `/v1/providers/earnings`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Counts {
    pub jobs: u64,
    pub tokens: u64,
    pub running: u32,
    /// Milliseconds the engine spent in steps.
    pub busy_ms: f64,
    pub refused: u64,
    pub paused: bool,
    pub draining: bool,
}

/// The session after `load`.
pub struct Session {
    model: String,
    on: On,
    engine: EngineHandle,
    core: EngineCore,
    jobs: HashMap<u64, Job>,
    meter: Meter,
    counts: Counts,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model)
            .field("jobs", &self.jobs.len())
            .field("counts", &self.counts)
            .finish()
    }
}

/// What a message from the server asks of the page.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    /// Messages to send, in order.
    pub send: Vec<FromWorker>,
    /// The server ended the session: close the socket, with why.
    pub close: Option<String>,
}

impl Session {
    /// Loads `bytes` (a GGUF) as `model` with `kv_bytes` of KV cache, to
    /// run `on` the CPU or the page's GPU.
    pub fn load(model: &str, bytes: &[u8], kv_bytes: usize, on: On) -> Result<Self, String> {
        let loaded = engine::loader::load_gguf_bytes(bytes, model, &TemplateChoice::default())
            .map_err(|e| e.to_string())?;
        let config = EngineConfig {
            kv_cache_memory: kv_bytes,
            device: match on {
                On::Cpu => engine::Device::Cpu,
                On::Gpu { .. } => engine::Device::Wgpu,
            },
            ..EngineConfig::default()
        };
        let (engine, core) =
            EngineHandle::start_driven(loaded, config).map_err(|e| e.to_string())?;
        Ok(Self {
            model: model.to_string(),
            on,
            engine,
            core,
            jobs: HashMap::new(),
            meter: Meter::default(),
            counts: Counts::default(),
        })
    }

    /// The first message of each connection: what this tab is and serves.
    pub fn register(&mut self, who: &Identity) -> FromWorker {
        self.counts.draining = false;
        self.counts.paused = false;
        let device = match &self.on {
            On::Cpu => Device {
                kind: "cpu".into(),
                name: format!("WebAssembly in {}", who.browser),
                cores: who.cores,
                memory_bytes: 0,
                features: vec!["wasm32".into(), "browser".into()],
                usable: true,
            },
            On::Gpu { adapter } => Device {
                kind: "wgpu".into(),
                name: format!("WebGPU {adapter} in {}", who.browser),
                cores: 0,
                memory_bytes: 0,
                features: vec!["wasm32".into(), "browser".into(), "webgpu".into()],
                usable: true,
            },
        };
        FromWorker::Register {
            v: VERSION,
            name: who.name.clone(),
            build: format!("synor-tab {}", env!("CARGO_PKG_VERSION")),
            devices: vec![device],
            models: vec![served_model(&self.model, self.engine.info())],
            threads: 1,
            region: who.region.clone(),
            asks: Vec::new(),
            encoders: Vec::new(),
            parts: Vec::new(),
        }
    }

    /// Handles one text message from the server.
    pub fn receive(&mut self, text: &str) -> Reply {
        let msg = match protocol::decode_from_server(text) {
            Ok(m) => m,
            Err(e) => {
                return Reply {
                    close: Some(format!("the server sent what this tab cannot read: {e}")),
                    ..Reply::default()
                };
            }
        };
        let mut reply = Reply::default();
        match msg {
            // The page shows an error's text; the server closes the
            // socket after a fatal one.
            ToWorker::Welcome { .. } | ToWorker::Error { .. } => {}
            ToWorker::Drain { .. } => self.counts.draining = true,
            ToWorker::Pause { paused, .. } => self.counts.paused = paused,
            ToWorker::Cancel { job, .. } => {
                if let Some(j) = self.jobs.get(&job) {
                    j.stream.abort();
                }
            }
            ToWorker::Assign {
                job,
                attempt,
                model,
                prompt,
                resume,
                params,
                kv,
                ..
            } => {
                let why = if kv.is_some() {
                    Some("a browser tab does not take KV from another worker".to_string())
                } else if model != self.model {
                    Some(format!("this tab serves {}, not {model}", self.model))
                } else if self.counts.draining {
                    Some("this tab is leaving".to_string())
                } else {
                    self.start(job, attempt, prompt, resume, params).err()
                };
                if let Some(message) = why {
                    self.counts.refused += 1;
                    reply.send.push(FromWorker::Failed {
                        v: VERSION,
                        job,
                        attempt,
                        message,
                    });
                }
            }
            other @ (ToWorker::Embed { .. }
            | ToWorker::Prefill { .. }
            | ToWorker::KvEnd { .. }
            | ToWorker::KvAbort { .. }
            | ToWorker::LoadPart { .. }
            | ToWorker::DropPart { .. }
            | ToWorker::StageStep { .. }) => reply.send.extend(refusal(other)),
        }
        reply
    }

    /// Submits one assignment to the engine.
    fn start(
        &mut self,
        job: u64,
        attempt: u32,
        prompt: Vec<u32>,
        resume: Vec<u32>,
        params: protocol::JobParams,
    ) -> Result<(), String> {
        let req = GenerateRequest {
            prompt_tokens: prompt,
            params: params.sampling(),
        };
        let stream = self
            .engine
            .validate(req)
            .and_then(|r| self.engine.submit_raw(r, resume))
            .map_err(|e| e.to_string())?;
        // A replayed attempt of a job this tab still runs replaces it.
        self.jobs.insert(job, Job { attempt, stream });
        self.counts.jobs += 1;
        Ok(())
    }

    /// Whether the engine has work (the page calls `turn` until not).
    pub fn busy(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// One engine turn, then every event it produced, as messages.
    pub fn turn(&mut self) -> Vec<FromWorker> {
        let started = web_time::Instant::now();
        self.core.turn();
        self.counts.busy_ms += started.elapsed().as_secs_f64() * 1e3;
        let mut out = Vec::new();
        self.jobs.retain(|&job, j| {
            while let Some(ev) = j.stream.try_next() {
                let msg = job_message(job, j.attempt, ev);
                if let FromWorker::Tokens { tokens, .. } = &msg {
                    self.counts.tokens += tokens.len() as u64;
                }
                out.push(msg);
            }
            !j.stream.is_done()
        });
        self.counts.running = self.jobs.len() as u32;
        out
    }

    /// The heartbeat's message.
    pub fn status(&mut self) -> FromWorker {
        FromWorker::Status {
            v: VERSION,
            load: self.meter.load([&self.engine]),
        }
    }

    /// The page's view of this tab.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// The tab stops taking work (its schedule ended, or it is closing):
    /// running jobs finish; the message says so to the server.
    pub fn leave(&mut self) -> FromWorker {
        self.counts.draining = true;
        FromWorker::Drain { v: VERSION }
    }

    /// The connection was lost: every job stops here (the server replays
    /// them on another worker, after the tokens it already relayed).
    pub fn lost(&mut self) {
        self.jobs.clear(); // dropping a stream aborts its sequence
        self.counts.running = 0;
        self.core.turn();
    }
}

/// The answer to work a tab does not do.
fn refusal(msg: ToWorker) -> Option<FromWorker> {
    let no = |what: &str| format!("a browser tab does not run {what}");
    match msg {
        ToWorker::Embed { job, .. } => Some(FromWorker::Failed {
            v: VERSION,
            job,
            attempt: 0,
            message: no("embeddings"),
        }),
        ToWorker::Prefill { transfer, .. } => Some(FromWorker::KvFailed {
            v: VERSION,
            transfer,
            message: no("split prefill"),
        }),
        ToWorker::LoadPart { model, .. } => Some(FromWorker::PartFailed {
            v: VERSION,
            model,
            message: no("pipeline stages"),
        }),
        ToWorker::StageStep { step, .. } => Some(FromWorker::StageFailed {
            v: VERSION,
            step,
            message: no("pipeline stages"),
        }),
        ToWorker::Welcome { .. }
        | ToWorker::Error { .. }
        | ToWorker::Drain { .. }
        | ToWorker::Pause { .. }
        | ToWorker::Assign { .. }
        | ToWorker::Cancel { .. }
        | ToWorker::KvEnd { .. }
        | ToWorker::KvAbort { .. }
        | ToWorker::DropPart { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::SamplingParams;
    use protocol::JobParams;

    fn tiny() -> Vec<u8> {
        let dir = std::env::var_os("SYNOR_MODELS_DIR").map_or_else(
            || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"),
            std::path::PathBuf::from,
        );
        std::fs::read(dir.join("tiny/tiny.gguf")).expect("tiny.gguf: run `make models` first")
    }

    fn session() -> Session {
        Session::load("tiny", &tiny(), 8 << 20, On::Cpu).expect("load")
    }

    fn greedy(max_tokens: usize) -> JobParams {
        let p = SamplingParams {
            temperature: 0.0,
            max_tokens,
            ignore_eos: true,
            seed: Some(7),
            ..SamplingParams::default()
        };
        JobParams::of(&p, 0)
    }

    fn assign(job: u64, model: &str, prompt: &[u32], resume: &[u32], p: &JobParams) -> String {
        serde_json::json!({"v": 1, "type": "assign", "job": job, "attempt": 1, "model": model,
            "prompt": prompt, "resume": resume, "params": p})
        .to_string()
    }

    /// Turns until idle; every message, in order.
    fn run(s: &mut Session) -> Vec<FromWorker> {
        let mut out = Vec::new();
        for _ in 0..10_000 {
            if !s.busy() {
                return out;
            }
            out.extend(s.turn());
        }
        panic!("the session never went idle");
    }

    fn ids(msgs: &[FromWorker]) -> Vec<u32> {
        msgs.iter()
            .filter_map(|m| {
                if let FromWorker::Tokens { tokens, .. } = m {
                    Some(tokens.iter().map(|t| t.id))
                } else {
                    None
                }
            })
            .flatten()
            .collect()
    }

    /// The tokens the native engine (its own thread) generates.
    fn native(prompt: &[u32], p: &JobParams) -> Vec<u32> {
        let loaded = engine::loader::load_gguf_bytes(&tiny(), "tiny", &TemplateChoice::default())
            .expect("load");
        let config = EngineConfig {
            kv_cache_memory: 8 << 20,
            ..EngineConfig::default()
        };
        let engine = EngineHandle::start(loaded, config).expect("start");
        let req = GenerateRequest {
            prompt_tokens: prompt.to_vec(),
            params: p.sampling(),
        };
        let mut raw = engine
            .submit_raw(engine.validate(req).expect("valid"), Vec::new())
            .expect("submit");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let mut got = Vec::new();
        while let Some(ev) = rt.block_on(raw.next()) {
            if let engine::core::CoreEvent::Token { id, .. } = ev {
                got.push(id);
            }
        }
        engine.shutdown();
        got
    }

    #[test]
    fn an_assignment_runs_as_on_the_native_engine_and_resumes_after_delivered_tokens() {
        let prompt = [1u32, 450, 8580, 338, 263];
        let p = greedy(24);
        let want = native(&prompt, &p);
        assert_eq!(want.len(), 24);
        let mut s = session();
        let who = Identity {
            name: "t".into(),
            region: "eu".into(),
            browser: "test".into(),
            cores: 2,
        };
        let FromWorker::Register { models, .. } = s.register(&who) else {
            panic!("not a registration");
        };
        assert_eq!(models[0].name, "tiny");
        assert_eq!(
            s.receive(&assign(1, "tiny", &prompt, &[], &p)),
            Reply::default()
        );
        let msgs = run(&mut s);
        assert!(matches!(msgs[0], FromWorker::Accepted { job: 1, .. }));
        assert_eq!(ids(&msgs), want);
        let Some(FromWorker::Done {
            reason,
            prompt_tokens,
            completion_tokens,
            ..
        }) = msgs.last()
        else {
            panic!("no done: {msgs:?}");
        };
        assert_eq!(
            (reason.as_str(), *prompt_tokens, *completion_tokens),
            ("length", 5, 24)
        );
        // A replayed attempt after 10 delivered tokens: the rest, the same.
        s.receive(&assign(2, "tiny", &prompt, &want[..10], &p));
        assert_eq!(ids(&run(&mut s)), want[10..].to_vec());
        let c = s.counts();
        assert_eq!((c.jobs, c.tokens, c.running), (2, 38, 0));
    }

    #[test]
    fn cancelled_and_lost_jobs_stop() {
        let mut s = session();
        let p = greedy(500);
        s.receive(&assign(1, "tiny", &[1, 2, 3], &[], &p));
        s.turn();
        s.receive(r#"{"v":1,"type":"cancel","job":1}"#);
        let msgs = run(&mut s);
        assert!(
            matches!(msgs.last(), Some(FromWorker::Done { reason, .. }) if reason == "abort"),
            "{msgs:?}"
        );
        s.receive(&assign(2, "tiny", &[1, 2, 3], &[], &p));
        s.turn();
        s.lost();
        assert!(!s.busy());
        // A tab that leaves refuses new work; registering again takes it.
        assert_eq!(s.leave(), FromWorker::Drain { v: VERSION });
        let r = s.receive(&assign(3, "tiny", &[1], &[], &greedy(2)));
        assert!(
            matches!(&r.send[..], [FromWorker::Failed { job: 3, .. }]),
            "{r:?}"
        );
    }

    #[test]
    fn what_a_tab_cannot_do_it_refuses_at_once() {
        let mut s = session();
        let p = greedy(4);
        let params = serde_json::to_value(&p).expect("json");
        let cases = [
            serde_json::json!({"v":1,"type":"embed","job":4,"model":"tiny","texts":["a"]}),
            serde_json::json!({"v":1,"type":"prefill","transfer":5,"model":"tiny","prompt":[1],"params":params,"from":0}),
            serde_json::json!({"v":1,"type":"load_part","model":"tiny","first":0,"end":1,"blocks":1,"block_size":16}),
            serde_json::json!({"v":1,"type":"stage_step","step":6,"model":"tiny","chunks":[],"rows":0}),
            serde_json::json!({"v":1,"type":"assign","job":7,"attempt":1,"model":"tiny","prompt":[1],"params":params,"kv":{"transfer":8}}),
            serde_json::json!({"v":1,"type":"assign","job":9,"attempt":1,"model":"other","prompt":[1],"params":params}),
        ];
        let mut answers = Vec::new();
        for c in cases {
            let r = s.receive(&c.to_string());
            assert_eq!((r.send.len(), &r.close), (1, &None), "{c}: {r:?}");
            answers.push(serde_json::to_value(&r.send[0]).expect("json")["type"].clone());
        }
        let want = [
            "failed",
            "kv_failed",
            "part_failed",
            "stage_failed",
            "failed",
            "failed",
        ];
        assert_eq!(answers, want);
        assert_eq!(s.counts().refused, 2);
        assert!(!s.busy());
        // A prompt longer than the engine allows is refused, not run.
        let long = vec![1u32; 100_000];
        let r = s.receive(&assign(10, "tiny", &long, &[], &p));
        assert!(
            matches!(&r.send[..], [FromWorker::Failed { job: 10, .. }]),
            "{r:?}"
        );
        // What cannot be read ends the session.
        assert!(s.receive("{not json").close.is_some());
        assert!(s.receive(r#"{"v":9,"type":"drain"}"#).close.is_some());
    }
}
