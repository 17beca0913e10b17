//! `EmbeddingHandle`: a BERT embedder on its own thread behind a bounded
//! queue, so embedding work never blocks the async runtime and overload is
//! refused at once instead of queueing forever.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::error::{EngineError, Result};
use crate::model::bert::BertEmbedder;
use crate::model::bert_encoder::{BertEncoder, Precision};

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

/// Most queued requests merged into one pass.
const MERGE_JOBS: usize = 32;
/// Requests with at most this many texts are merged (typical queries);
/// larger ones run alone, so one long batch does not pad the others.
const MERGE_MAX_TEXTS: usize = 4;

/// Runs a batch of jobs: small text jobs together in one pass (their
/// vectors split back by position), the others one by one.
fn run_batch(model: &BertEmbedder, batch: Vec<Job>) {
    let mut merged: Vec<(usize, oneshot::Sender<Result<Embeddings>>)> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    for (inputs, reply) in batch {
        if reply.is_closed() {
            continue; // the caller left
        }
        match inputs {
            EmbedInput::Texts(t) if t.len() <= MERGE_MAX_TEXTS => {
                merged.push((t.len(), reply));
                texts.extend(t);
            }
            other @ (EmbedInput::Texts(_) | EmbedInput::Tokens(_)) => {
                let result = match &other {
                    EmbedInput::Texts(t) => model.embed(t),
                    EmbedInput::Tokens(t) => model.embed_ids(t),
                };
                let _ = reply.send(result.map(|(vectors, prompt_tokens)| Embeddings {
                    vectors,
                    prompt_tokens,
                }));
            }
        }
    }
    if merged.is_empty() {
        return;
    }
    match model.embed_each(&texts) {
        Ok((vectors, counts)) => {
            let (mut vectors, mut counts) = (vectors.into_iter(), counts.into_iter());
            for (n, reply) in merged {
                let _ = reply.send(Ok(Embeddings {
                    vectors: vectors.by_ref().take(n).collect(),
                    prompt_tokens: counts.by_ref().take(n).sum(),
                }));
            }
        }
        Err(e) => {
            for (_, reply) in merged {
                let _ = reply.send(Err(EngineError::Execution(e.to_string())));
            }
        }
    }
}

/// A running embedding model.
#[derive(Debug, Clone)]
pub struct EmbeddingHandle {
    jobs: mpsc::Sender<Job>,
    pub dimensions: usize,
    pub max_tokens: usize,
    /// Token ids of `EmbedInput::Tokens` are below this.
    pub vocab_size: usize,
    /// The int8 encoder for single short queries (`embed_query`), when the
    /// model loads into it.
    query: Option<Arc<QueryEncoder>>,
    /// The model's tokenizer, to count inputs' tokens here (a worker's
    /// own count is never billed).
    counter: Arc<tokenizers::Tokenizer>,
}

/// An int8 copy of the model with an unpadded tokenizer, for one query at
/// a time on the caller's (blocking) thread: a few milliseconds instead of
/// the f32 model's ten or more. Its vectors differ from the f32 model's by
/// a cosine under 0.005, so compare them only with each other.
struct QueryEncoder {
    model: BertEncoder,
    tokenizer: tokenizers::Tokenizer,
}

impl std::fmt::Debug for QueryEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueryEncoder")
    }
}

impl QueryEncoder {
    fn load(dir: &Path) -> Result<Self> {
        let mut tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| EngineError::Load(format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(None);
        Ok(Self {
            model: BertEncoder::load(dir, Precision::Q8)?,
            tokenizer,
        })
    }

    fn embed(&self, text: &str) -> Result<Vec<f32>> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        self.model.embed_ids(enc.get_ids())
    }
}

impl EmbeddingHandle {
    /// Loads the model folder and starts its thread.
    pub fn start(dir: &Path) -> Result<Self> {
        let model = BertEmbedder::load(dir)?;
        let (dimensions, max_tokens) = (model.dimensions, model.max_tokens);
        let vocab_size = model.vocab_size();
        let counter = Arc::new(model.tokenizer().clone());
        let (jobs, mut rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
        std::thread::Builder::new()
            .name("synor-embed".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    // Requests that queued meanwhile share one forward pass.
                    let mut batch = vec![first];
                    while batch.len() < MERGE_JOBS {
                        match rx.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    run_batch(&model, batch);
                }
            })
            .map_err(|e| EngineError::Load(format!("embedding thread: {e}")))?;
        let query = match QueryEncoder::load(dir) {
            Ok(q) => Some(Arc::new(q)),
            Err(e) => {
                tracing::warn!(error = %e, "no int8 query encoder; queries use the f32 model");
                None
            }
        };
        tracing::info!(path = %dir.display(), dimensions, "loaded embedding model");
        Ok(Self {
            jobs,
            dimensions,
            max_tokens,
            vocab_size,
            query,
            counter,
        })
    }

    /// The tokens embedding `inputs` processes, as `embed_input` counts
    /// them (special tokens added to texts, each input truncated at
    /// `max_tokens`, no padding), without running the model.
    pub fn count_tokens(&self, inputs: &EmbedInput) -> Result<usize> {
        let lens: Vec<usize> = match inputs {
            EmbedInput::Tokens(lists) => lists.iter().map(Vec::len).collect(),
            EmbedInput::Texts(texts) => self
                .counter
                .encode_batch(texts.clone(), true)
                .map_err(|e| EngineError::Tokenizer(e.to_string()))?
                .iter()
                .map(|e| e.get_ids().len())
                .collect(),
        };
        Ok(lens.iter().map(|&n| n.min(self.max_tokens)).sum())
    }

    /// Embeds one short query for similarity search, with the int8
    /// encoder if there is one (off the async runtime), else the f32 model.
    /// Vectors from here must only be compared with vectors from here.
    pub async fn embed_query(&self, text: &str) -> Result<Vec<f32>> {
        let Some(q) = self.query.clone() else {
            let mut out = self.embed(vec![text.to_string()]).await?;
            return out.vectors.pop().ok_or(EngineError::Shutdown);
        };
        let text = text.to_string();
        tokio::task::spawn_blocking(move || q.embed(&text))
            .await
            .map_err(|e| EngineError::Execution(format!("query encoder: {e}")))?
    }

    /// Embeds several short queries (single words, say) as `embed_query`
    /// does, in one trip off the async runtime.
    pub async fn embed_queries(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        let Some(q) = self.query.clone() else {
            return Ok(self.embed(texts).await?.vectors);
        };
        tokio::task::spawn_blocking(move || texts.iter().map(|t| q.embed(t)).collect())
            .await
            .map_err(|e| EngineError::Execution(format!("query encoder: {e}")))?
    }

    /// Embeds `inputs` (one vector each, in order).
    pub async fn embed(&self, inputs: Vec<String>) -> Result<Embeddings> {
        self.embed_input(EmbedInput::Texts(inputs)).await
    }

    /// Where the encoder runs (for usage records): in process, on the CPU.
    pub fn executor(&self) -> &'static str {
        "cpu"
    }

    /// Checks inputs without embedding them (empty texts or token lists,
    /// token ids outside the vocabulary), so callers can refuse them
    /// before billing.
    pub fn validate(&self, inputs: &EmbedInput) -> Result<()> {
        let refuse = |message: String| {
            Err(EngineError::Validation {
                field: "input",
                message,
            })
        };
        match inputs {
            EmbedInput::Texts(t) if t.is_empty() => refuse("inputs must not be empty".into()),
            EmbedInput::Tokens(t) if t.is_empty() => refuse("inputs must not be empty".into()),
            EmbedInput::Texts(_) => Ok(()),
            EmbedInput::Tokens(lists) => {
                let vocab = self.vocab_size as u32;
                for (i, ids) in lists.iter().enumerate() {
                    if ids.is_empty() {
                        return refuse(format!("input {i} has no tokens"));
                    }
                    if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
                        return refuse(format!(
                            "token id {bad} is outside the vocabulary (size {vocab})"
                        ));
                    }
                }
                Ok(())
            }
        }
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
