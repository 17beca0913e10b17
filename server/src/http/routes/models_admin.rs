//! Models an admin manages while serving: load one from the models
//! directory (`POST /admin/models`, kept in the database so a restart
//! serves it again), unload one (`DELETE /admin/models/{name}`, forgotten),
//! and list the model files there are to load (`GET /admin/models/files`).

use std::path::{Path as FsPath, PathBuf};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use engine::GenerationDefaults;

use crate::http::api::bodies::{List, ModelChange};
use crate::http::api::json::ApiJson;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use money::store::Db;
use money::store::models::SavedModel;

pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/models", post(load_model))
        .route("/admin/models/files", get(files))
        .route("/admin/models/{name}", delete(unload_model))
}

/// Where loaded models are kept: the ledger's database (a server without
/// one, as in some tests, keeps none).
fn store(state: &AppState) -> Option<&Db> {
    state
        .billing
        .as_ref()
        .map(|b| &b.ledger.db)
        .or(state.auth.db.as_ref())
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Text => "text",
        Kind::Embedding => "embedding",
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoadModel {
    name: String,
    /// A GGUF file (text) or a model folder (embedding), relative to the
    /// models directory (absolute paths, `..` and symlinks leading out of
    /// it are refused).
    #[schema(value_type = String)]
    path: std::path::PathBuf,
    #[serde(default = "text_kind")]
    kind: Kind,
    /// A text model's sampling defaults over its own (`temperature`,
    /// `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_tokens`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    generation_config: Option<serde_json::Value>,
}

fn text_kind() -> Kind {
    Kind::Text
}

/// What a model is, for loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Text,
    Embedding,
}

impl From<Kind> for engine::registry::Kind {
    fn from(k: Kind) -> Self {
        match k {
            Kind::Text => Self::Text,
            Kind::Embedding => Self::Embedding,
        }
    }
}

/// Loads a model and starts serving it.
#[utoipa::path(post, path = "/admin/models", tag = "admin", request_body = LoadModel,
    responses((status = 201, description = "Loaded", body = ModelChange), (status = 400, description = "Bad name or path", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn load_model(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<LoadModel>,
) -> Result<Response, ApiError> {
    if req.name.trim().is_empty() || req.name.len() > 128 {
        return Err(ApiError::invalid(
            "name",
            "a model name is 1-128 characters",
        ));
    }
    if state.models.get(&req.name).is_ok() {
        return Err(ApiError::invalid(
            "name",
            format!("a model named `{}` is already served", req.name),
        ));
    }
    let loader = state.loader.clone();
    let path = loader
        .resolve_inside(&req.path)
        .map_err(|m| ApiError::invalid("path", m))?;
    let generation = match &req.generation_config {
        None => GenerationDefaults::default(),
        Some(v) => GenerationDefaults::parse_override(&v.to_string())
            .map_err(|m| ApiError::invalid("generation_config", m))?,
    };
    let (name, kind) = (req.name.clone(), req.kind);
    let model =
        tokio::task::spawn_blocking(move || loader.load(&name, &path, kind.into(), generation))
            .await
            .map_err(|e| ApiError::Storage(format!("model loading panicked: {e}")))?
            .map_err(|e| {
                // The details (resolved path, file bytes, backtraces) are for
                // the log only.
                tracing::warn!(path = %req.path.display(), error = %e, "admin model load failed");
                ApiError::invalid(
                    "path",
                    format!(
                        "`{}` could not be loaded as {} model (the server log has the details)",
                        req.path.display(),
                        match kind {
                            Kind::Text => "a text (GGUF)",
                            Kind::Embedding => "an embedding (safetensors folder)",
                        }
                    ),
                )
            })?;
    state.models.add(model)?;
    if let Some(db) = store(&state) {
        let saved = SavedModel {
            name: req.name.clone(),
            path: req.path.display().to_string(),
            kind: kind_name(req.kind).into(),
            generation_config: req
                .generation_config
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default(),
        };
        // Serving it is what matters now; a restart not knowing it is
        // said in the log.
        if let Err(e) = db.save_model(&saved).await {
            tracing::error!(model = %saved.name, error = %e, "a loaded model was not saved");
        }
    }
    let body = ModelChange {
        id: req.name,
        object: "model",
        loaded: Some(true),
        deleted: None,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Stops serving a model.
#[utoipa::path(delete, path = "/admin/models/{name}", tag = "admin",
    params(("name" = String, Path, description = "The model's name")),
    responses((status = 200, description = "Unloaded", body = ModelChange), (status = 404, description = "No such model", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn unload_model(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ModelChange>, ApiError> {
    state.models.remove(&name)?;
    if let Some(db) = store(&state) {
        db.forget_model(&name)
            .await
            .map_err(|e| ApiError::Storage(e.to_string()))?;
    }
    Ok(Json(ModelChange {
        id: name,
        object: "model",
        loaded: None,
        deleted: Some(true),
    }))
}

/// A model file (or embedding folder) under the models directory.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelFile {
    /// Relative to the models directory: what `POST /admin/models` takes.
    pub path: String,
    /// `text` (a GGUF file) or `embedding` (a folder with
    /// `model.safetensors` and `config.json`).
    pub kind: String,
    pub bytes: u64,
    /// The name it would be served under by default (its folder's name).
    pub suggested_name: String,
    /// The served models loaded from it.
    pub loaded_as: Vec<String>,
}

/// Files past this many are left out of the listing.
const MAX_FILES: usize = 500;
/// Folders deeper than this are not searched.
const MAX_DEPTH: usize = 4;

/// The model files under the models directory an admin could load, and
/// which are loaded.
#[utoipa::path(get, path = "/admin/models/files", tag = "admin",
    responses((status = 200, description = "Model files", body = List<ModelFile>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn files(
    State(state): State<AppState>,
) -> Result<Json<List<ModelFile>>, ApiError> {
    let root = state.loader.models_dir.clone();
    let found = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        walk(&root, &root, 0, &mut out);
        out
    })
    .await
    .map_err(|e| ApiError::Storage(format!("listing the models directory: {e}")))?;
    let loaded: Vec<(String, String)> = match store(&state) {
        Some(db) => db
            .saved_models()
            .await
            .map_err(|e| ApiError::Storage(e.to_string()))?
            .into_iter()
            .map(|m| (m.path, m.name))
            .collect(),
        None => Vec::new(),
    };
    let served: Vec<String> = state.models.list().into_iter().map(|m| m.name).collect();
    let data = found
        .into_iter()
        .map(|(path, kind, bytes)| {
            let suggested_name = suggested(&path);
            let mut loaded_as: Vec<String> = loaded
                .iter()
                .filter(|(p, n)| *p == path && served.contains(n))
                .map(|(_, n)| n.clone())
                .collect();
            if served.contains(&suggested_name) && loaded_as.is_empty() {
                loaded_as.push(suggested_name.clone());
            }
            ModelFile {
                path,
                kind: kind.into(),
                bytes,
                suggested_name,
                loaded_as,
            }
        })
        .collect();
    Ok(Json(List::of(data)))
}

/// The default served name of a model at `path`: its folder's name (as
/// the command line names it), or the file's stem at the top.
fn suggested(path: &str) -> String {
    let p = FsPath::new(path);
    match p.parent().and_then(|d| d.file_name()) {
        Some(dir) => dir.to_string_lossy().into_owned(),
        None => p
            .file_stem()
            .map_or_else(|| path.to_string(), |s| s.to_string_lossy().into_owned()),
    }
}

/// Collects (path under `root`, kind, bytes) of the model files under
/// `dir`: GGUF files, and folders holding an embedding model. Hidden
/// entries (a fetch in progress) are skipped.
fn walk(root: &FsPath, dir: &FsPath, depth: usize, out: &mut Vec<(String, &'static str, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    let rel = |p: &FsPath| p.strip_prefix(root).unwrap_or(p).display().to_string();
    if dir != root && dir.join("model.safetensors").is_file() && dir.join("config.json").is_file() {
        let bytes = std::fs::metadata(dir.join("model.safetensors")).map_or(0, |m| m.len());
        out.push((rel(dir), "embedding", bytes));
    }
    for p in entries {
        if out.len() >= MAX_FILES {
            return;
        }
        let hidden = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        if p.is_dir() && depth + 1 < MAX_DEPTH {
            walk(root, &p, depth + 1, out);
        } else if p
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            let bytes = std::fs::metadata(&p).map_or(0, |m| m.len());
            out.push((rel(&p), "text", bytes));
        }
    }
}
