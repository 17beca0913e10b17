//! Pipeline stages on a worker: the model files it may hold parts of (its
//! offers, sized from each file's tensor table), the part the server asks
//! it to hold (`load_part`, read from disk layer range only), and its
//! steps: the previous stage's hidden states arrive as frames, then
//! `stage_step`; it runs its layers (the last stage samples each chunk as
//! the server resolved it) and answers with hidden-state frames and
//! `stage_done`, or `stage_failed`. Parts outlive a connection: a server
//! that asks again for the part held is answered at once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use engine::executor::Step;
use engine::kv_cache::KvDtype;
use engine::model::ModelBatch;
use engine::model::llama::PartInput;
use engine::pipeline::{LocalStage, Stage, StageOutput, load_part_file, part_sizes};
use engine::sampling::OwnedSampling;
use protocol::stage::{
    HiddenAssembly, HiddenRows, PartOffer, StageChunk, StageSampling, decode_hidden, hidden_frames,
};
use protocol::{FromWorker, JobToken, VERSION};

use crate::Out;

/// Steps whose input frames may wait for their `stage_step` at once (a
/// server that sends frames and never the step cannot fill memory).
const PENDING_STEPS: usize = 8;

/// A model file the worker may hold a part of.
#[derive(Debug, Clone)]
pub struct PartFile {
    pub name: String,
    pub path: PathBuf,
    pub offer: PartOffer,
}

impl PartFile {
    /// The file at `path`, served as `name`, with `memory` bytes for its
    /// part's weights and KV.
    pub fn open(name: &str, path: PathBuf, memory: u64) -> anyhow::Result<Self> {
        let s = part_sizes(&path)?;
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        let offer = PartOffer {
            model: name.to_string(),
            layers: n(s.n_layer),
            hidden: n(s.hidden),
            layer_bytes: s.layer_bytes,
            ends_bytes: s.ends_bytes,
            kv_block_bytes: s.kv_bytes_per_token * 16,
            memory_bytes: memory,
        };
        Ok(Self {
            name: name.to_string(),
            path,
            offer,
        })
    }
}

/// A part held: its range and the stage that runs it.
struct Held {
    first: u32,
    end: u32,
    blocks: u32,
    block_size: u32,
    stage: Arc<Mutex<LocalStage>>,
}

/// The parts this worker offers and holds, and the frames of steps on
/// their way.
#[derive(Default)]
pub struct Stages {
    files: Vec<PartFile>,
    held: Mutex<HashMap<String, Held>>,
    pending: Mutex<Vec<(u64, Vec<HiddenRows>)>>,
    faults: StageFaults,
}

/// Testing and benchmark knobs of a worker's stages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageFaults {
    /// A cheating stage: given hidden states, it answers them back
    /// without running its layers.
    pub skip_layers: bool,
    /// A slower device: each step holds this long per layer held, and
    /// `token_layer_delay` more per layer for each token of the step (a
    /// device whose time grows with the batch).
    pub layer_delay: std::time::Duration,
    pub token_layer_delay: std::time::Duration,
}

impl Stages {
    pub fn new(files: Vec<PartFile>, faults: StageFaults) -> Self {
        Self {
            files,
            faults,
            ..Default::default()
        }
    }

    /// What it registers.
    pub fn offers(&self) -> Vec<PartOffer> {
        self.files.iter().map(|f| f.offer.clone()).collect()
    }

    /// A hidden-state frame from the server; one it cannot read is
    /// dropped (its step then fails for want of rows).
    pub fn frame(&self, bytes: &[u8]) {
        let Some(step) = protocol::stage::hidden_step(bytes) else {
            return;
        };
        let Some(hidden) = self.width_of_any() else {
            return;
        };
        let Ok(rows) = decode_hidden(bytes, hidden) else {
            tracing::warn!(step, "a hidden-state frame did not decode: dropped");
            return;
        };
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match pending.iter_mut().find(|(s, _)| *s == step) {
            Some((_, rows_of)) => rows_of.push(rows),
            None => {
                if pending.len() >= PENDING_STEPS {
                    pending.remove(0);
                }
                pending.push((step, vec![rows]));
            }
        }
    }

    /// The width of the part held (one model's stage at a time is the
    /// common case; frames carry no model).
    fn width_of_any(&self) -> Option<usize> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.keys()
            .filter_map(|m| self.files.iter().find(|f| &f.name == m))
            .map(|f| f.offer.hidden as usize)
            .next()
    }

    /// Loads layers `first..end` of `model` (answering at once when they
    /// are held already) and says so.
    pub fn load(self: &Arc<Self>, part: LoadPart, out: mpsc::Sender<Out>) {
        let stages = self.clone();
        tokio::task::spawn_blocking(move || {
            let msg = match stages.load_now(&part) {
                Ok(()) => FromWorker::PartLoaded {
                    v: VERSION,
                    model: part.model.clone(),
                    first: part.first,
                    end: part.end,
                    blocks: part.blocks,
                },
                Err(e) => {
                    tracing::warn!(model = %part.model, error = %e, "could not load the part asked for");
                    FromWorker::PartFailed {
                        v: VERSION,
                        model: part.model.clone(),
                        message: e.to_string(),
                    }
                }
            };
            send(&out, &msg);
        });
    }

    fn load_now(&self, p: &LoadPart) -> anyhow::Result<()> {
        let Some(file) = self.files.iter().find(|f| f.name == p.model) else {
            anyhow::bail!("this worker offers no part of `{}`", p.model);
        };
        {
            let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(h) = held.get(&p.model)
                && (h.first, h.end, h.blocks, h.block_size)
                    == (p.first, p.end, p.blocks, p.block_size)
            {
                return Ok(());
            }
        }
        self.drop_part(&p.model);
        let o = &file.offer;
        let layers = u64::from(p.end.saturating_sub(p.first));
        let ends = p.first == 0 || p.end == o.layers;
        let need = layers * (o.layer_bytes + u64::from(p.blocks) * o.kv_block_bytes)
            + if ends { o.ends_bytes } else { 0 };
        if need > o.memory_bytes {
            anyhow::bail!(
                "layers {}..{} with {} KV blocks need {need} bytes; it offers {}",
                p.first,
                p.end,
                p.blocks,
                o.memory_bytes
            );
        }
        let model = load_part_file(&file.path, p.first as usize..p.end as usize)?;
        let stage = LocalStage::new(
            model,
            p.block_size as usize,
            p.blocks as usize,
            KvDtype::F16,
        )?;
        tracing::info!(model = %p.model, first = p.first, end = p.end, "holding a pipeline stage");
        let held = Held {
            first: p.first,
            end: p.end,
            blocks: p.blocks,
            block_size: p.block_size,
            stage: Arc::new(Mutex::new(stage)),
        };
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p.model.clone(), held);
        Ok(())
    }

    /// Drops the part of `model` it holds.
    pub fn drop_part(&self, model: &str) {
        let dropped = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(model);
        if dropped.is_some() {
            tracing::info!(%model, "dropped its pipeline stage");
        }
    }

    /// Runs one step of the part of `s.model` it holds, off the socket's
    /// task, and answers.
    pub fn step(&self, s: StageStepMsg, out: mpsc::Sender<Out>) {
        let input = self.take_rows(s.step);
        let stage = {
            let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.get(&s.model).map(|h| h.stage.clone())
        };
        let hidden = self
            .files
            .iter()
            .find(|f| f.name == s.model)
            .map_or(0, |f| f.offer.hidden as usize);
        let faults = self.faults;
        tokio::task::spawn_blocking(move || {
            let step = s.step;
            let answer = match stage {
                Some(stage) => run_step(&stage, &s, input, hidden, faults),
                None => Err(format!("it holds no part of `{}`", s.model)),
            };
            match answer {
                Ok(StageOutput::Hidden(h)) => {
                    for f in hidden_frames(step, hidden, &h) {
                        if out.blocking_send(Out::Frame(f)).is_err() {
                            return;
                        }
                    }
                    send(
                        &out,
                        &FromWorker::StageDone {
                            v: VERSION,
                            step,
                            tokens: vec![],
                        },
                    );
                }
                Ok(StageOutput::Sampled(tokens)) => {
                    let tokens = tokens
                        .into_iter()
                        .map(|c| c.into_iter().map(job_token).collect())
                        .collect();
                    send(
                        &out,
                        &FromWorker::StageDone {
                            v: VERSION,
                            step,
                            tokens,
                        },
                    );
                }
                Err(message) => {
                    send(
                        &out,
                        &FromWorker::StageFailed {
                            v: VERSION,
                            step,
                            message,
                        },
                    );
                }
            }
        });
    }

    fn take_rows(&self, step: u64) -> Vec<HiddenRows> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match pending.iter().position(|(s, _)| *s == step) {
            Some(i) => pending.remove(i).1,
            None => Vec::new(),
        }
    }
}

/// A `load_part` message.
#[derive(Debug, Clone)]
pub struct LoadPart {
    pub model: String,
    pub first: u32,
    pub end: u32,
    pub blocks: u32,
    pub block_size: u32,
}

/// A `stage_step` message.
#[derive(Debug, Clone)]
pub struct StageStepMsg {
    pub step: u64,
    pub model: String,
    pub chunks: Vec<StageChunk>,
    pub rows: u32,
    pub sampling: Vec<Option<StageSampling>>,
}

/// Runs a step on the stage from the rows that came for it.
fn run_step(
    stage: &Mutex<LocalStage>,
    s: &StageStepMsg,
    rows: Vec<HiddenRows>,
    hidden: usize,
    faults: StageFaults,
) -> Result<StageOutput, String> {
    let chunks = s
        .chunks
        .iter()
        .map(StageChunk::chunk)
        .collect::<Result<Vec<_>, _>>()?;
    let batch = ModelBatch { chunks };
    let owned: Vec<Option<OwnedSampling>> = s
        .sampling
        .iter()
        .map(|x| x.as_ref().map(StageSampling::owned))
        .collect();
    let mut sampling: Vec<_> = owned
        .iter()
        .map(|o| o.as_ref().map(OwnedSampling::row))
        .collect();
    sampling.resize(batch.chunks.len(), None);
    let step = Step {
        batch: &batch,
        sampling,
    };
    let input = if s.rows == 0 {
        None
    } else {
        let mut a = HiddenAssembly::new(s.rows as usize, hidden);
        for r in &rows {
            a.add(r)?;
        }
        Some(a.finish()?)
    };
    if let (true, Some(h)) = (faults.skip_layers, &input) {
        return Ok(StageOutput::Hidden(h.clone()));
    }
    let input = input
        .as_deref()
        .map_or(PartInput::Tokens, PartInput::Hidden);
    let mut stage = stage.lock().unwrap_or_else(|e| e.into_inner());
    let out = stage.run(&step, input).map_err(|e| e.to_string());
    let per_layer = faults.layer_delay + faults.token_layer_delay * tokens_of(&batch);
    if !per_layer.is_zero() {
        let layers = u32::try_from(stage.layers().len()).unwrap_or(u32::MAX);
        std::thread::sleep(per_layer * layers);
    }
    out
}

/// The tokens of a step's batch, for the delay faults.
fn tokens_of(batch: &ModelBatch) -> u32 {
    u32::try_from(batch.num_tokens()).unwrap_or(u32::MAX)
}

fn job_token(t: engine::sampling::Sampled) -> JobToken {
    let (id, lp) = t;
    JobToken {
        id,
        logprob: lp.as_ref().map(|l| l.logprob),
        top: lp.map(|l| l.top).unwrap_or_default(),
    }
}

fn send(out: &mpsc::Sender<Out>, msg: &FromWorker) {
    if let Ok(text) = serde_json::to_string(msg) {
        let _ = out.blocking_send(Out::Text(text));
    }
}
