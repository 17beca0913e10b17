//! The served models: the registry (by name, added and removed while
//! serving), how models are loaded from the models directory, and the
//! content version that cache keys include. The server and the worker
//! both serve from one.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use crate::chat::TemplateChoice;
use crate::embed::EmbeddingHandle;
use crate::error::EngineError;
use crate::generation::GenerationDefaults;
use crate::handle::EngineHandle;
use crate::loader::load_gguf;

/// Why the registry refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The requested model is not served.
    #[error("the model `{0}` does not exist")]
    NotFound(String),
    /// The model exists but cannot serve this endpoint.
    #[error("the model `{model}` does not support {endpoint}")]
    WrongKind {
        model: String,
        endpoint: &'static str,
    },
    /// A model of this name is already served.
    #[error("a model named `{0}` is already served")]
    NameTaken(String),
}

/// What a served model can do.
#[derive(Debug, Clone)]
pub enum ModelKind {
    Text(EngineHandle),
    Embedding(EmbeddingHandle),
}

/// One model as clients see it.
#[derive(Debug, Clone)]
pub struct RegisteredModel {
    pub name: String,
    pub created: u64,
    /// Identifies the weights (a hash of the files' sizes and first
    /// bytes): the same on every replica and after a restart, different
    /// when the model changes. Cache keys include it.
    pub version: u64,
    pub kind: ModelKind,
    /// The file (or folder) its weights were loaded from; `None` for a
    /// model built elsewhere (a pipeline's).
    pub path: Option<PathBuf>,
}

/// A content hash of a model file, or of a model folder's files: sizes
/// and the first 64 KiB of each (enough to tell weights apart without
/// reading gigabytes).
pub fn model_version(path: &Path) -> u64 {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .collect()
            })
            .unwrap_or_default()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        let size = std::fs::metadata(&f).map_or(0, |m| m.len());
        h.update(size.to_le_bytes());
        let mut head = Vec::new();
        if let Ok(file) = std::fs::File::open(&f) {
            let _ = file.take(64 * 1024).read_to_end(&mut head);
        }
        h.update(&head);
    }
    let d = h.finalize();
    u64::from_le_bytes(d[..8].try_into().unwrap_or_default())
}

/// The models this server answers for, by name. Models can be added and
/// removed while serving (admin API); handlers take cheap clones of the
/// handles, so a removal never pulls a model from under a running request
/// (its engine stops, and such requests end with an error).
#[derive(Debug, Default)]
pub struct ModelRegistry {
    models: RwLock<Vec<RegisteredModel>>,
}

impl ModelRegistry {
    pub fn new(models: Vec<RegisteredModel>) -> Self {
        Self {
            models: RwLock::new(models),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<RegisteredModel>> {
        self.models.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<RegisteredModel>> {
        self.models.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn list(&self) -> Vec<RegisteredModel> {
        self.read().clone()
    }

    pub fn get(&self, name: &str) -> Result<RegisteredModel, RegistryError> {
        self.read()
            .iter()
            .find(|m| m.name == name)
            .cloned()
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))
    }

    /// A generative model, or why not.
    pub fn text(&self, name: &str) -> Result<EngineHandle, RegistryError> {
        match self.get(name)?.kind {
            ModelKind::Text(h) => Ok(h),
            ModelKind::Embedding(_) => Err(RegistryError::WrongKind {
                model: name.into(),
                endpoint: "text generation",
            }),
        }
    }

    /// An embedding model, or why not.
    pub fn embedding(&self, name: &str) -> Result<EmbeddingHandle, RegistryError> {
        match self.get(name)?.kind {
            ModelKind::Embedding(h) => Ok(h),
            ModelKind::Text(_) => Err(RegistryError::WrongKind {
                model: name.into(),
                endpoint: "embeddings",
            }),
        }
    }

    /// Serves one more model; refused if the name is taken.
    pub fn add(&self, model: RegisteredModel) -> Result<(), RegistryError> {
        let mut models = self.write();
        if models.iter().any(|m| m.name == model.name) {
            return Err(RegistryError::NameTaken(model.name));
        }
        models.push(model);
        Ok(())
    }

    /// Stops serving `name` and stops its engine.
    pub fn remove(&self, name: &str) -> Result<(), RegistryError> {
        let removed = {
            let mut models = self.write();
            let i = models
                .iter()
                .position(|m| m.name == name)
                .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
            models.remove(i)
        };
        if let ModelKind::Text(h) = removed.kind {
            h.shutdown();
        }
        Ok(())
    }

    /// Stops every engine thread.
    pub fn shutdown(&self) {
        for m in self.read().iter() {
            if let ModelKind::Text(h) = &m.kind {
                h.shutdown();
            }
        }
    }
}

/// What a model is, for loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Embedding,
}

/// How models are loaded: where relative paths point, and the engine
/// settings every text model gets.
#[derive(Debug, Clone, Default)]
pub struct ModelLoader {
    pub models_dir: PathBuf,
    pub engine: crate::handle::EngineConfig,
    pub template: TemplateChoice,
}

impl ModelLoader {
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.models_dir.join(path)
        }
    }

    /// Resolves a path given over the API: relative, without `..`, and
    /// inside the models directory once canonicalized (symlinks followed).
    /// Errors name the path as given, never the resolved one.
    pub fn resolve_inside(&self, path: &Path) -> Result<PathBuf, String> {
        use std::path::Component;
        let shown = path.display();
        let plain = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if path.as_os_str().is_empty() || !plain {
            return Err("the path must be relative to the models directory, without `..`".into());
        }
        let root = self.models_dir.canonicalize().map_err(|e| {
            tracing::error!(dir = %self.models_dir.display(), error = %e, "models directory unreadable");
            "the models directory is not readable".to_string()
        })?;
        let full = root
            .join(path)
            .canonicalize()
            .map_err(|_| format!("no model at `{shown}` in the models directory"))?;
        if !full.starts_with(&root) {
            return Err(format!("`{shown}` leads outside the models directory"));
        }
        Ok(full)
    }

    /// Loads a model (blocking: run it off the async runtime); a text
    /// model's sampling defaults are its own with `generation`'s fields
    /// over them.
    pub fn load(
        &self,
        name: &str,
        path: &Path,
        kind: Kind,
        generation: GenerationDefaults,
    ) -> Result<RegisteredModel, EngineError> {
        let path = self.resolve(path);
        let kind = match kind {
            Kind::Text => {
                let mut loaded = load_gguf(&path, &self.template)?;
                loaded.generation = loaded.generation.then(generation);
                ModelKind::Text(EngineHandle::start(loaded, self.engine.clone())?)
            }
            Kind::Embedding => ModelKind::Embedding(EmbeddingHandle::start(&path)?),
        };
        Ok(RegisteredModel {
            name: name.to_string(),
            created: web_time::SystemTime::now()
                .duration_since(web_time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            version: model_version(&path),
            kind,
            path: Some(path),
        })
    }
}
