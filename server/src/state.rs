//! `AppState`: what every handler can reach, typed. Today the served models;
//! later issues add the ledger, the market and the provider registry.

use std::sync::Arc;

use engine::{EmbeddingHandle, EngineHandle};

use crate::error::ApiError;

/// What a served model can do.
#[derive(Debug, Clone)]
pub enum ModelKind {
    Text(EngineHandle),
    Embedding(EmbeddingHandle),
}

/// One model as clients see it.
#[derive(Debug, Clone)]
pub struct ServedModel {
    pub name: String,
    pub created: u64,
    pub kind: ModelKind,
}

/// The models this server answers for, by name.
#[derive(Debug, Default)]
pub struct ModelRegistry {
    models: Vec<ServedModel>,
}

impl ModelRegistry {
    pub fn new(models: Vec<ServedModel>) -> Self {
        Self { models }
    }

    pub fn list(&self) -> &[ServedModel] {
        &self.models
    }

    pub fn get(&self, name: &str) -> Result<&ServedModel, ApiError> {
        self.models
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| ApiError::ModelNotFound(name.to_string()))
    }

    /// A generative model, or why not.
    pub fn text(&self, name: &str) -> Result<&EngineHandle, ApiError> {
        match &self.get(name)?.kind {
            ModelKind::Text(h) => Ok(h),
            ModelKind::Embedding(_) => Err(ApiError::WrongModelKind {
                model: name.into(),
                endpoint: "text generation",
            }),
        }
    }

    /// An embedding model, or why not.
    pub fn embedding(&self, name: &str) -> Result<&EmbeddingHandle, ApiError> {
        match &self.get(name)?.kind {
            ModelKind::Embedding(h) => Ok(h),
            ModelKind::Text(_) => Err(ApiError::WrongModelKind {
                model: name.into(),
                endpoint: "embeddings",
            }),
        }
    }

    /// Stops every engine thread.
    pub fn shutdown(&self) {
        for m in &self.models {
            if let ModelKind::Text(h) = &m.kind {
                h.shutdown();
            }
        }
    }
}

/// Shared handler state.
#[derive(Debug, Clone)]
pub struct AppState {
    pub models: Arc<ModelRegistry>,
    /// HTTP request counts for `/metrics`.
    pub http: Arc<crate::metrics::HttpMetrics>,
    /// API keys, limits and the admin token.
    pub auth: Arc<crate::auth::Auth>,
}

impl AppState {
    /// Open mode: no keys needed.
    pub fn new(models: Arc<ModelRegistry>) -> Self {
        Self::with_auth(models, crate::auth::Auth::open())
    }

    pub fn with_auth(models: Arc<ModelRegistry>, auth: crate::auth::Auth) -> Self {
        Self {
            models,
            http: Arc::default(),
            auth: Arc::new(auth),
        }
    }
}
