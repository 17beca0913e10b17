//! `EngineHandle`: the one interface the server uses to generate text.
//! Cloneable and cheap; it validates requests, hands them to the core
//! thread, and returns a `RequestStream` of events. `EngineBuilder` starts
//! one around an executor.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crate::chat::{ChatMessage, ChatTemplate, TemplateChoice};
use crate::constraint::{Constraint, ConstraintFactory};
use crate::core::{Command, CoreEvent, EngineCore, Handoff, TokenScore};
use crate::error::{EngineError, Result};
use crate::executor::{Executor, LocalExecutor};
use crate::generation::GenerationDefaults;
use crate::kv_cache::plan::plan;
use crate::kv_cache::{KvDtype, KvLayout, KvManager, SlidingBlocks};
use crate::latency::LatencyStats;
use crate::loader::{LoadedModel, load_gguf};
use crate::model::llama::Llama;
use crate::output::{OutputProcessor, RawStream, RequestStream};
use crate::request::{GenerateRequest, RequestId, ValidRequest};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::stats::{EngineStats, StatsCell};
use crate::tokenizer::TextTokenizer;

/// Everything that shapes an engine: scheduling limits and KV memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
    /// Bytes of KV cache (keys and values of every layer, scales included).
    pub kv_cache_memory: usize,
    /// How the KV cache stores keys and values (Q8_0: about half the
    /// bytes of f16; the CPU backend only).
    pub kv_cache_dtype: KvDtype,
    /// Positions per KV block.
    pub block_size: usize,
    /// Sliding-window layers keep every position's KV as full-attention
    /// layers do (llama.cpp's `--swa-full`), instead of blocks of their
    /// own released behind the window.
    pub swa_full: bool,
    /// Run only the model's first this many layers (testing: a provider
    /// that cheats by skipping layers; spot checks must catch it).
    pub keep_layers: Option<usize>,
    /// Where the model runs.
    pub device: Device,
}

/// The compute device an engine runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Cpu,
    /// The first adapter wgpu finds (Vulkan, Metal, DX12; lavapipe).
    Wgpu,
    /// An NVIDIA GPU by index, through CUDA.
    Cuda(u32),
}

impl Device {
    /// The CUDA device index, for `Cuda(n)`.
    pub fn cuda_index(self) -> Option<u32> {
        match self {
            Self::Cuda(n) => Some(n),
            Self::Cpu | Self::Wgpu => None,
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    /// `cpu`, `wgpu`, `cuda` or `cuda:N`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "wgpu" => Ok(Self::Wgpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("unknown device `{s}`: cpu, wgpu, cuda or cuda:N")),
        }
    }
}

/// The executor of `model` on `device`.
fn executor_on(device: Device, model: Llama, layout: KvLayout) -> Result<Box<dyn Executor>> {
    if device != Device::Cpu && layout.dtype != KvDtype::F16 {
        return Err(EngineError::Load(format!(
            "--kv-cache-dtype {} runs on the CPU backend only; the GPU backends keep f16",
            layout.dtype.name()
        )));
    }
    match device {
        Device::Cpu => Ok(Box::new(LocalExecutor::new(model, layout)?)),
        #[cfg(feature = "wgpu")]
        Device::Wgpu => crate::gpu_executor::on_wgpu(model, layout),
        #[cfg(not(feature = "wgpu"))]
        Device::Wgpu => Err(EngineError::Load(
            "this build has no wgpu backend: build with `--features wgpu`".into(),
        )),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => crate::gpu_executor::on_cuda(n, model, layout),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(n) => Err(EngineError::Load(format!(
            "cuda:{n}: this build has no CUDA backend: build with `--features cuda`"
        ))),
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            kv_cache_memory: 1 << 30,
            kv_cache_dtype: KvDtype::F16,
            block_size: 16,
            swa_full: false,
            keep_layers: None,
            device: Device::Cpu,
        }
    }
}

/// Static facts about the served model.
#[derive(Debug)]
pub struct ModelInfo {
    pub architecture: String,
    /// Longest sequence served (model context, capped by the KV capacity).
    pub context_length: usize,
    pub vocab_size: usize,
    /// KV blocks and positions per block.
    pub kv_blocks: usize,
    /// Blocks of the sliding-window layers' own (0: they share
    /// `kv_blocks`), after `kv_blocks` in the executors' KV.
    pub sliding_kv_blocks: usize,
    pub block_size: usize,
    /// The KV geometry: layers, KV heads and head width (what a KV block
    /// moved to another executor must match).
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The executor that runs its steps, or its prefill with split stages
    /// (`Executor::name`).
    pub executor: String,
    /// The executor that runs its decode (the same one without a split).
    pub decode_executor: String,
    /// The model's sampling defaults (`generation`).
    pub generation: GenerationDefaults,
}

/// Shared between every clone of a handle.
struct Shared {
    commands: Sender<Command>,
    tokenizer: Arc<TextTokenizer>,
    template: ChatTemplate,
    info: ModelInfo,
    stats: Arc<StatsCell>,
    next_id: AtomicU64,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Built on the first structured-output request (the token trie).
    constraints: OnceLock<std::result::Result<Arc<ConstraintFactory>, String>>,
}

/// A running text-generation engine.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("info", &self.shared.info)
            .finish_non_exhaustive()
    }
}

/// What the engine needs to know of its model besides the tokenizer.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub architecture: String,
    /// The model's own context length (the engine caps it by its KV).
    pub context_length: usize,
    pub vocab_size: usize,
    /// Sampling defaults for requests that leave fields out.
    pub generation: GenerationDefaults,
}

/// Builds an engine: the model's tokenizer, template and facts, the
/// scheduling limits, and the executor that runs its steps (its KV layout
/// sizes the block tables).
pub struct EngineBuilder {
    tokenizer: TextTokenizer,
    template: ChatTemplate,
    facts: ModelFacts,
    scheduler: SchedulerConfig,
    executors: Vec<Box<dyn Executor>>,
    /// The sliding-window layers' window, where the executors' KV gives
    /// them blocks of their own (`KvLayout::sliding`).
    window: Option<usize>,
    /// Its requests' first id.
    first_id: u64,
}

impl EngineBuilder {
    pub fn new(tokenizer: TextTokenizer, template: ChatTemplate, facts: ModelFacts) -> Self {
        Self {
            tokenizer,
            template,
            facts,
            scheduler: SchedulerConfig::default(),
            executors: Vec::new(),
            window: None,
            first_id: 1,
        }
    }

    /// Numbers its requests from `first` (engines whose request ids meet
    /// in one place, such as the lanes of one model, take apart ranges).
    pub fn first_id(mut self, first: u64) -> Self {
        self.first_id = first.max(1);
        self
    }

    pub fn scheduler(mut self, config: SchedulerConfig) -> Self {
        self.scheduler = config;
        self
    }

    /// The sliding-window layers' window: where the executors' KV layout
    /// gives those layers a pool of their own (`KvLayout::sliding`, sized
    /// by `kv_cache::plan`), their blocks are released behind it. Without
    /// such a pool every layer reads one table.
    pub fn sliding_window(mut self, window: Option<usize>) -> Self {
        self.window = window;
        self
    }

    /// Adds an executor.
    pub fn executor(mut self, executor: Box<dyn Executor>) -> Self {
        self.executors.push(executor);
        self
    }

    /// Starts the engine thread. With one executor it runs every step;
    /// with two, the first runs prefill and the second decode, and each
    /// sequence's KV blocks move from the first to the second when its
    /// prefill is done (both need the same KV geometry).
    pub fn start(self) -> Result<EngineHandle> {
        let (shared, core) = self.assemble()?;
        let thread = std::thread::Builder::new()
            .name("synor-engine".into())
            .spawn(move || core.run())
            .map_err(|e| EngineError::Load(format!("engine thread: {e}")))?;
        if let Ok(mut t) = shared.thread.lock() {
            *t = Some(thread);
        }
        Ok(EngineHandle {
            shared: Arc::new(shared),
        })
    }

    /// The engine without a thread of its own, for a caller that has none
    /// (a browser tab): the handle, and the core it drives a turn at a
    /// time (`EngineCore::turn`).
    pub fn start_driven(self) -> Result<(EngineHandle, EngineCore)> {
        let (shared, core) = self.assemble()?;
        let handle = EngineHandle {
            shared: Arc::new(shared),
        };
        Ok((handle, core))
    }

    /// The handle's shared half and its core, not yet running.
    fn assemble(self) -> Result<(Shared, EngineCore)> {
        let mut executors = self.executors.into_iter();
        let (executor, decoder) = match (executors.next(), executors.next(), executors.next()) {
            (Some(e), d, None) => (e, d),
            (None, ..) => return Err(EngineError::Load("an engine needs an executor".into())),
            (Some(_), _, Some(_)) => {
                return Err(EngineError::Load(
                    "an engine runs on one executor, or two (prefill, then decode)".into(),
                ));
            }
        };
        if let Some(d) = &decoder
            && d.kv_layout() != executor.kv_layout()
        {
            return Err(EngineError::Load(
                "the prefill and decode executors need the same KV geometry".into(),
            ));
        }
        let layout = executor.kv_layout();
        let block_size = layout.block_size;
        let sliding = sliding_pool(self.window, &layout)?;
        let swa_blocks = sliding.map_or(0, |(_, n)| n);
        let num_blocks = layout.num_blocks - swa_blocks;
        let mut sched = self.scheduler;
        let capacity = num_blocks * block_size;
        let context = self.facts.context_length;
        sched.max_model_len = sched.max_model_len.min(context).min(capacity);
        let computed = [Some(&executor), decoder.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|e| e.max_positions())
            .min();
        if let Some(limit) = computed {
            sched.max_model_len = sched.max_model_len.min(limit);
        }
        if capacity < context {
            tracing::warn!(
                capacity,
                context,
                "the KV cache holds less than one full context"
            );
        }
        let info = ModelInfo {
            architecture: self.facts.architecture,
            context_length: sched.max_model_len,
            vocab_size: self.facts.vocab_size,
            kv_blocks: num_blocks,
            sliding_kv_blocks: swa_blocks,
            block_size,
            layers: layout.n_layer,
            kv_heads: layout.n_kv_head,
            head_dim: layout.head_dim,
            executor: executor.name(),
            decode_executor: decoder.as_ref().unwrap_or(&executor).name(),
            generation: self.facts.generation,
        };
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(StatsCell::default());
        let eos: Vec<u32> = self.tokenizer.eog_ids().iter().copied().collect();
        let mut kv = KvManager::new(num_blocks, block_size);
        if let Some((window, blocks)) = sliding {
            kv = kv.with_sliding(window, blocks);
        }
        let mut scheduler = Scheduler::new(sched, kv);
        if decoder.is_some() {
            scheduler = scheduler.with_split_stages();
        }
        let mut core =
            EngineCore::new(scheduler, executor, rx, eos, info.vocab_size, stats.clone());
        if let Some(d) = decoder {
            core = core.with_decoder(d);
        }
        let shared = Shared {
            commands: tx,
            tokenizer: Arc::new(self.tokenizer),
            template: self.template,
            info,
            stats,
            next_id: AtomicU64::new(self.first_id),
            thread: std::sync::Mutex::new(None),
            constraints: OnceLock::new(),
        };
        Ok((shared, core))
    }
}

/// The sliding-window layers' (window, blocks) where `layout` gives them a
/// pool of their own (its last blocks) and a window is set; `None` where
/// every layer reads one table.
fn sliding_pool(window: Option<usize>, layout: &KvLayout) -> Result<Option<(usize, usize)>> {
    let Some(pool) = layout.sliding else {
        return Ok(None);
    };
    let Some(window) = window.filter(|&w| w > 0) else {
        return Err(EngineError::Load(
            "the KV layout gives sliding-window layers blocks of their own, but no window".into(),
        ));
    };
    let first = pool.first as usize;
    if first == 0 || first >= layout.num_blocks {
        return Err(EngineError::Load(format!(
            "a sliding pool from block {first} of {} leaves one of the two groups empty",
            layout.num_blocks
        )));
    }
    Ok(Some((window, layout.num_blocks - first)))
}

impl EngineHandle {
    /// Loads a GGUF model and starts its engine thread.
    pub fn start_gguf(
        path: &Path,
        template: &TemplateChoice,
        config: EngineConfig,
    ) -> Result<Self> {
        Self::start(load_gguf(path, template)?, config)
    }

    /// Starts the engine thread around an already loaded model on the
    /// local CPU executor, sizing the KV cache from
    /// `config.kv_cache_memory`.
    pub fn start(loaded: LoadedModel, config: EngineConfig) -> Result<Self> {
        Self::builder(loaded, config)?.start()
    }

    /// `start` without a thread (see `EngineBuilder::start_driven`).
    pub fn start_driven(loaded: LoadedModel, config: EngineConfig) -> Result<(Self, EngineCore)> {
        Self::builder(loaded, config)?.start_driven()
    }

    /// The builder `start` starts: the model on the local CPU executor,
    /// the KV cache sized from `config.kv_cache_memory`.
    fn builder(loaded: LoadedModel, config: EngineConfig) -> Result<EngineBuilder> {
        let LoadedModel {
            mut model,
            tokenizer,
            template,
            generation,
        } = loaded;
        if let Some(n) = config.keep_layers {
            model.keep_layers(n);
        }
        let mc = &model.config;
        let block_size = config.block_size.max(1);
        let dtype = config.kv_cache_dtype;
        let layer_block =
            block_size * KvLayout::bytes_per_token(1, mc.n_kv_head, mc.head_dim, dtype);
        // Sliding-window layers keep blocks of their own (the mask holds
        // up to `SlidingBlocks::MAX_LAYERS` layers).
        let mask = SlidingBlocks::mask(mc.n_layer, |l| mc.window(l) > 0);
        let sliding = (mc.sliding_kv()).filter(|_| !config.swa_full && mask.is_some());
        let sched = SchedulerConfig {
            max_model_len: config.scheduler.max_model_len.min(mc.context_length),
            ..config.scheduler.clone()
        };
        let Some(plan) = plan(
            config.kv_cache_memory,
            layer_block,
            mc.n_layer,
            sliding,
            &sched,
            block_size,
        ) else {
            return Err(EngineError::Load(format!(
                "--kv-cache-memory {} bytes is less than one KV block ({} bytes)",
                config.kv_cache_memory,
                layer_block * mc.n_layer
            )));
        };
        let num_blocks = plan.total_blocks();
        let facts = ModelFacts {
            architecture: mc.architecture.clone(),
            context_length: mc.context_length,
            vocab_size: mc.vocab_size,
            generation,
        };
        let layout = KvLayout {
            dtype,
            sliding: plan.sliding.zip(mask).map(|(_, layers)| SlidingBlocks {
                layers,
                first: plan.full_blocks as u32,
            }),
            ..mc.kv_layout(block_size, num_blocks)
        };
        Ok(EngineBuilder::new(tokenizer, template, facts)
            .scheduler(config.scheduler)
            .sliding_window(plan.sliding.map(|(window, _)| window))
            .executor(executor_on(config.device, model, layout)?))
    }

    /// Queues a single-choice `req`.
    pub fn submit(&self, req: ValidRequest) -> Result<RequestStream> {
        if req.params.n != 1 {
            return Err(EngineError::Validation {
                field: "n",
                message: "use submit_n for n > 1".into(),
            });
        }
        let constraint = self.constraint_for(&req)?;
        self.enqueue(req.into_inner(), None, constraint)
    }

    /// Queues one choice (`n` = 1) without the request side's text work:
    /// the stream yields the core's events (token ids, log-probabilities,
    /// the end), for a caller that detokenizes and matches stop strings
    /// itself (the fleet's relay). `resume` are tokens already generated
    /// for it elsewhere: generation continues after them, positions and
    /// penalties included, so a seeded draw is the one the first executor
    /// would have made. Structured output cannot be resumed.
    pub fn submit_raw(&self, req: ValidRequest, resume: Vec<u32>) -> Result<RawStream> {
        self.submit_handoff(req, resume, Handoff::default())
    }

    /// `submit_raw` with KV that moves with the request: rows a prefill
    /// worker computed for its prompt (`handoff.import`), or a stream of
    /// its prompt's rows for a decode worker (`handoff.export`).
    pub fn submit_handoff(
        &self,
        req: ValidRequest,
        resume: Vec<u32>,
        handoff: Handoff,
    ) -> Result<RawStream> {
        if req.params.n != 1 {
            return Err(EngineError::validation(
                "n",
                "a raw submission is one choice",
            ));
        }
        if !resume.is_empty() && req.params.grammar.is_some() {
            return Err(EngineError::validation(
                "response_format",
                "structured output cannot resume on another executor",
            ));
        }
        if resume.len() >= req.params.max_tokens
            || req.prompt_tokens.len() + resume.len() >= self.shared.info.context_length
        {
            return Err(EngineError::validation(
                "max_tokens",
                "nothing is left to generate after the resumed tokens",
            ));
        }
        if let Some(bad) = resume
            .iter()
            .find(|&&t| t as usize >= self.shared.info.vocab_size)
        {
            return Err(EngineError::validation(
                "resume",
                format!("token id {bad} is outside the vocabulary"),
            ));
        }
        let constraint = self.constraint_for(&req)?;
        let (id, rx) = self.send_add(req.into_inner(), None, constraint, resume, handoff)?;
        Ok(RawStream::new(id, rx, self.shared.commands.clone()))
    }

    /// Scores `tokens[prompt_len..]` as the continuation of the tokens
    /// before them, in one prefill between steps (a spot check's
    /// reference): each token's log-probability and rank.
    pub async fn score(&self, tokens: Vec<u32>, prompt_len: usize) -> Result<Vec<TokenScore>> {
        let vocab = self.shared.info.vocab_size as u32;
        if tokens.len() >= self.shared.info.context_length || tokens.iter().any(|&t| t >= vocab) {
            return Err(EngineError::validation(
                "tokens",
                "past the context or outside the vocabulary",
            ));
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.shared
            .commands
            .send(Command::Score {
                tokens,
                prompt_len,
                reply,
            })
            .map_err(|_| EngineError::Shutdown)?;
        rx.await.map_err(|_| EngineError::Shutdown)?
    }

    /// How many leading tokens of `tokens` this engine's prefix cache
    /// holds now (whole blocks; answered between steps).
    pub async fn cached_prefix(&self, tokens: Vec<u32>) -> Result<usize> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.shared
            .commands
            .send(Command::CachedPrefix { tokens, reply })
            .map_err(|_| EngineError::Shutdown)?;
        rx.await.map_err(|_| EngineError::Shutdown)
    }

    /// The end-of-output token of constrained generation.
    fn constraint_eos(&self) -> u32 {
        let t = &self.shared.tokenizer;
        t.special()
            .eos
            .or_else(|| t.eog_ids().first().copied())
            .unwrap_or(0)
    }

    /// A matcher for the request's grammar, if it has one.
    fn constraint_for(&self, req: &GenerateRequest) -> Result<Option<Constraint>> {
        let Some(grammar) = &req.params.grammar else {
            return Ok(None);
        };
        let factory = self
            .shared
            .constraints
            .get_or_init(|| {
                ConstraintFactory::new(
                    &self.shared.tokenizer,
                    self.shared.info.vocab_size,
                    self.constraint_eos(),
                )
                .map(Arc::new)
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| EngineError::Validation {
                field: "response_format",
                message: e.clone(),
            })?;
        factory.matcher(grammar, "response_format").map(Some)
    }

    /// Queues `req`'s `n` choices; choice `i` samples with seed `seed + i`
    /// (when seeded), and choices 2..n wait for the first one's prompt so
    /// they share its KV blocks instead of recomputing them.
    pub fn submit_n(&self, req: ValidRequest) -> Result<Vec<RequestStream>> {
        let req = req.into_inner();
        let constraint = self.constraint_for(&req)?;
        let n = req.params.n;
        let mut streams = Vec::with_capacity(n);
        let mut first = None;
        for i in 0..n {
            let mut choice = req.clone();
            choice.params.n = 1;
            choice.params.seed = req.params.seed.map(|s| s.wrapping_add(i as u64));
            let stream = self.enqueue(choice, first, constraint.clone())?;
            first.get_or_insert(stream.id());
            streams.push(stream);
        }
        Ok(streams)
    }

    fn enqueue(
        &self,
        req: GenerateRequest,
        wait_for: Option<RequestId>,
        constraint: Option<Constraint>,
    ) -> Result<RequestStream> {
        let processor = OutputProcessor::new(
            self.shared.tokenizer.clone(),
            &req.prompt_tokens,
            req.params.stop.clone(),
        );
        let (id, rx) = self.send_add(req, wait_for, constraint, Vec::new(), Handoff::default())?;
        Ok(RequestStream::new(
            id,
            rx,
            processor,
            self.shared.commands.clone(),
        ))
    }

    /// Hands a request to the core; returns its id and its event channel.
    fn send_add(
        &self,
        req: GenerateRequest,
        wait_for: Option<RequestId>,
        constraint: Option<Constraint>,
        resume: Vec<u32>,
        handoff: Handoff,
    ) -> Result<(RequestId, tokio::sync::mpsc::UnboundedReceiver<CoreEvent>)> {
        let id = RequestId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        self.shared
            .commands
            .send(Command::Add {
                id,
                req: Box::new(req),
                wait_for,
                events,
                arrived: web_time::Instant::now(),
                constraint: constraint.map(|c| (Box::new(c), self.constraint_eos())),
                resume,
                handoff,
            })
            .map_err(|_| EngineError::Shutdown)?;
        Ok((id, rx))
    }

    /// Checks a request against this model (parameters, vocabulary,
    /// context length) without submitting it, so callers can refuse it
    /// before they quote, hold or rate-limit anything; the checked request
    /// is what the submit calls take.
    pub fn validate(&self, req: GenerateRequest) -> Result<ValidRequest> {
        self.check(&req)?;
        Ok(ValidRequest::checked(req))
    }

    fn check(&self, req: &GenerateRequest) -> Result<()> {
        req.params.validate()?;
        if req.prompt_tokens.is_empty() {
            return Err(EngineError::Validation {
                field: "prompt",
                message: "the prompt is empty".into(),
            });
        }
        let vocab = self.shared.info.vocab_size as u32;
        if let Some(bad) = req.prompt_tokens.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::Validation {
                field: "prompt",
                message: format!("token id {bad} is outside the vocabulary (size {vocab})"),
            });
        }
        if let Some(bad) = req.params.stop_token_ids.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::Validation {
                field: "stop_token_ids",
                message: format!("token id {bad} is outside the vocabulary (size {vocab})"),
            });
        }
        if let Some((bad, _)) = req.params.logit_bias.iter().find(|(t, _)| *t >= vocab) {
            return Err(EngineError::Validation {
                field: "logit_bias",
                message: format!("token id {bad} is outside the vocabulary (size {vocab})"),
            });
        }
        let max = self.shared.info.context_length;
        let (p, m) = (req.prompt_tokens.len(), req.params.max_tokens);
        if p + m > max {
            return Err(EngineError::ContextLength {
                max_context: max,
                prompt_tokens: p,
                max_tokens: m,
            });
        }
        Ok(())
    }

    /// Aborts a request (its stream then ends with `FinishReason::Abort`).
    pub fn abort(&self, id: RequestId) {
        let _ = self.shared.commands.send(Command::Abort(id));
    }

    pub fn stats(&self) -> EngineStats {
        self.shared.stats.snapshot()
    }

    /// Latency distributions and request counters since start.
    pub fn latency(&self) -> LatencyStats {
        self.shared.stats.latency.snapshot()
    }

    pub fn info(&self) -> &ModelInfo {
        &self.shared.info
    }

    /// The tokenizer, shared (for streams that detokenize elsewhere).
    pub fn shared_tokenizer(&self) -> Arc<TextTokenizer> {
        self.shared.tokenizer.clone()
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.shared.tokenizer
    }

    /// Renders a conversation with the model's chat template.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        self.shared.template.render(messages)
    }

    /// Stops the engine thread after failing whatever is still queued.
    pub fn shutdown(&self) {
        let _ = self.shared.commands.send(Command::Shutdown);
        let thread = self.shared.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}
