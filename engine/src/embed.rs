//! `EmbeddingHandle`: a BERT embedder on its own thread behind a bounded
//! queue, so embedding work never blocks the async runtime and overload is
//! refused at once instead of queueing forever.

use std::path::Path;

use candle_core::Device;
use tokio::sync::{mpsc, oneshot};

use crate::error::{EngineError, Result};
use crate::model::bert::BertEmbedder;

/// Requests waiting for the embedding thread before new ones are refused.
const QUEUE_DEPTH: usize = 64;

/// Vectors for a batch of inputs, and the tokens they used.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub prompt_tokens: usize,
}

/// What to embed: texts, or token ids used as given.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

type Job = (EmbedInput, oneshot::Sender<Result<Embeddings>>);

/// A running embedding model.
#[derive(Debug, Clone)]
pub struct EmbeddingHandle {
    jobs: mpsc::Sender<Job>,
    pub dimensions: usize,
    pub max_tokens: usize,
}

impl EmbeddingHandle {
    /// Loads the model folder and starts its thread.
    pub fn start(dir: &Path) -> Result<Self> {
        let model = BertEmbedder::load(dir, &Device::Cpu)?;
        let (dimensions, max_tokens) = (model.dimensions, model.max_tokens);
        let (jobs, mut rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
        std::thread::Builder::new()
            .name("synor-embed".into())
            .spawn(move || {
                while let Some((inputs, reply)) = rx.blocking_recv() {
                    if reply.is_closed() {
                        continue; // the caller left
                    }
                    let result = match &inputs {
                        EmbedInput::Texts(t) => model.embed(t),
                        EmbedInput::Tokens(t) => model.embed_ids(t),
                    };
                    let result = result.map(|(vectors, prompt_tokens)| Embeddings {
                        vectors,
                        prompt_tokens,
                    });
                    let _ = reply.send(result);
                }
            })
            .map_err(|e| EngineError::Load(format!("embedding thread: {e}")))?;
        tracing::info!(path = %dir.display(), dimensions, "loaded embedding model");
        Ok(Self {
            jobs,
            dimensions,
            max_tokens,
        })
    }

    /// Embeds `inputs` (one vector each, in order).
    pub async fn embed(&self, inputs: Vec<String>) -> Result<Embeddings> {
        self.embed_input(EmbedInput::Texts(inputs)).await
    }

    /// Embeds texts or token-id lists (one vector each, in order).
    pub async fn embed_input(&self, inputs: EmbedInput) -> Result<Embeddings> {
        let (tx, rx) = oneshot::channel();
        self.jobs.try_send((inputs, tx)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => EngineError::Overloaded {
                waiting: QUEUE_DEPTH,
            },
            mpsc::error::TrySendError::Closed(_) => EngineError::Shutdown,
        })?;
        rx.await.map_err(|_| EngineError::Shutdown)?
    }
}
