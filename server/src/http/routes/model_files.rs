//! The weights a worker may load, served to its provider
//! (`GET /v1/providers/models/{model}/file`, a worker token): the file a
//! served text model was loaded from, whole or one byte range at a time
//! (`Range: bytes=a-b`, `a-`, `-n`; 206 with `Content-Range`), with its
//! SHA-256 (`X-Synor-Sha256`, also the strong `ETag`) so that a worker
//! with no disk of its own, a browser tab, can fetch it in parts, resume,
//! check it and keep it. The hash is computed once per file version and
//! kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use engine::registry::ModelKind;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::fleet::worker_token;
use crate::http::error::ApiError;
use crate::http::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/providers/models", get(list))
        .route("/v1/providers/models/{model}/file", get(file))
}

/// A served text model a worker may fetch.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ModelFile {
    /// The model's name.
    pub id: String,
    /// Its file's size in bytes.
    pub bytes: u64,
}

/// The list of them.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ModelFiles {
    pub object: &'static str,
    pub data: Vec<ModelFile>,
}

/// The served text models whose file a worker may fetch (a worker token):
/// what a browser tab offers its provider to serve.
#[utoipa::path(get, path = "/v1/providers/models", tag = "providers",
    responses(
        (status = 200, description = "Served text models loaded from one file, with the file's size", body = ModelFiles),
        (status = 401, description = "Missing, wrong or revoked worker token", body = crate::http::error::ErrorResponse)),
    security(("worker_token" = [])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<axum::Json<ModelFiles>, ApiError> {
    worker_token(&state, &headers).await?;
    let mut data = Vec::new();
    for m in state.models.list() {
        let Some(path) = m.path.filter(|_| matches!(m.kind, ModelKind::Text(_))) else {
            continue;
        };
        if let Ok(meta) = tokio::fs::metadata(&path).await
            && meta.is_file()
        {
            data.push(ModelFile {
                id: m.name,
                bytes: meta.len(),
            });
        }
    }
    data.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(axum::Json(ModelFiles {
        object: "list",
        data,
    }))
}

/// Bytes read from the file at a time.
const CHUNK: usize = 256 * 1024;

/// Serves a served text model's weights file (a worker token).
#[utoipa::path(get, path = "/v1/providers/models/{model}/file", tag = "providers",
    params(("model" = String, Path, description = "A served text model"),
        ("Range" = Option<String>, Header, description = "One byte range: bytes=a-b, bytes=a- or bytes=-n")),
    responses(
        (status = 200, description = "The whole file; X-Synor-Sha256 and ETag carry its SHA-256", content_type = "application/octet-stream"),
        (status = 206, description = "The range asked for, with Content-Range", content_type = "application/octet-stream"),
        (status = 401, description = "Missing, wrong or revoked worker token", body = crate::http::error::ErrorResponse),
        (status = 404, description = "No such text model, or none loaded from one file", body = crate::http::error::ErrorResponse),
        (status = 416, description = "A range the file cannot satisfy, or several ranges", body = crate::http::error::ErrorResponse)),
    security(("worker_token" = [])))]
pub(crate) async fn file(
    State(state): State<AppState>,
    UrlPath(model): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    worker_token(&state, &headers).await?;
    let found = state.models.get(&model).ok();
    let path = found
        .filter(|m| matches!(m.kind, ModelKind::Text(_)))
        .and_then(|m| m.path)
        .filter(|p| p.is_file())
        .ok_or_else(|| ApiError::NotFound {
            what: "model file",
            id: model.clone(),
        })?;
    let len = tokio::fs::metadata(&path)
        .await
        .map_err(|e| ApiError::Storage(format!("reading {model}'s file: {e}")))?
        .len();
    let asked = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let range = byte_range(asked, len)?;
    let sha = sha256_of(path.clone()).await?;
    let (start, end) = range.unwrap_or((0, len));
    let body = Body::from_stream(chunks(path, start, end));
    let status = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    let value = |s: String| HeaderValue::from_str(&s).map_err(|e| ApiError::Storage(e.to_string()));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, value((end - start).to_string())?);
    h.insert(header::ETAG, value(format!("\"{sha}\""))?);
    h.insert("x-synor-sha256", value(sha)?);
    if range.is_some() {
        h.insert(
            header::CONTENT_RANGE,
            value(format!("bytes {start}-{}/{len}", end - 1))?,
        );
    }
    Ok(resp)
}

/// The one byte range `header` asks of a file of `len` bytes, as
/// `(start, end)` with `end` exclusive (`None`: the whole file); a range
/// past the end is cut to it, one that starts past it (or an empty
/// suffix) cannot be satisfied, and several ranges are refused.
pub fn byte_range(header: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, ApiError> {
    let Some(h) = header.map(str::trim) else {
        return Ok(None);
    };
    let bad = |why| ApiError::RangeNotSatisfiable { len, why };
    let spec = h
        .strip_prefix("bytes=")
        .ok_or_else(|| bad("only byte ranges are served (bytes=a-b)"))?;
    if spec.contains(',') {
        return Err(bad("one range at a time"));
    }
    let (a, b) = spec
        .split_once('-')
        .ok_or_else(|| bad("a range is bytes=a-b, bytes=a- or bytes=-n"))?;
    let num = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| bad("a range's bounds are whole numbers"))
    };
    let (start, end) = match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, true) => return Err(bad("a range needs a bound")),
        (true, false) => {
            let n = num(b)?.min(len);
            (len - n, len)
        }
        (false, true) => (num(a)?, len),
        (false, false) => {
            let (s, e) = (num(a)?, num(b)?);
            if e < s {
                return Err(bad("a range's end comes before its start"));
            }
            (s, e.saturating_add(1).min(len))
        }
    };
    if start >= len || start >= end {
        return Err(bad("the range starts past the end of the file"));
    }
    Ok(Some((start, end)))
}

/// The file's bytes `start..end`, read `CHUNK` at a time (a read error
/// ends the body with an error: the client sees a cut transfer).
fn chunks(
    path: PathBuf,
    start: u64,
    end: u64,
) -> impl futures_util::Stream<Item = std::io::Result<Vec<u8>>> + Send {
    futures_util::stream::try_unfold(
        (None::<tokio::fs::File>, path, start),
        move |(file, path, at)| async move {
            if at >= end {
                return Ok(None);
            }
            let mut file = match file {
                Some(f) => f,
                None => {
                    let mut f = tokio::fs::File::open(&path).await?;
                    f.seek(std::io::SeekFrom::Start(at)).await?;
                    f
                }
            };
            let want = usize::try_from(end - at).unwrap_or(CHUNK).min(CHUNK);
            let mut buf = vec![0u8; want];
            file.read_exact(&mut buf).await?;
            Ok(Some((buf, (Some(file), path, at + want as u64))))
        },
    )
}

/// The SHA-256 (hex) of the file at `path`, computed once per version of
/// it (its length and modification time) and kept.
async fn sha256_of(path: PathBuf) -> Result<String, ApiError> {
    type Known = HashMap<PathBuf, (u64, std::time::SystemTime, String)>;
    static KNOWN: OnceLock<Mutex<Known>> = OnceLock::new();
    let known = KNOWN.get_or_init(Mutex::default);
    let meta = tokio::fs::metadata(&path)
        .await
        .map_err(|e| ApiError::Storage(e.to_string()))?;
    let stamp = (meta.len(), meta.modified().unwrap_or(std::time::UNIX_EPOCH));
    let hit = known
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&path)
        .filter(|k| (k.0, k.1) == stamp)
        .map(|k| k.2.clone());
    if let Some(sha) = hit {
        return Ok(sha);
    }
    let p = path.clone();
    let sha = tokio::task::spawn_blocking(move || hash_file(&p))
        .await
        .map_err(|e| ApiError::Storage(e.to_string()))?
        .map_err(|e| ApiError::Storage(format!("hashing {}: {e}", path.display())))?;
    known
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path, (stamp.0, stamp.1, sha.clone()));
    Ok(sha)
}

fn hash_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(h: &str, len: u64) -> Option<(u64, u64)> {
        byte_range(Some(h), len).expect(h)
    }

    #[test]
    fn ranges_are_read_as_http_says_and_bad_ones_refused() {
        assert_eq!(byte_range(None, 10).expect("none"), None);
        assert_eq!(ok("bytes=0-3", 10), Some((0, 4)));
        assert_eq!(ok("bytes=4-", 10), Some((4, 10)));
        assert_eq!(ok("bytes=-3", 10), Some((7, 10)));
        // Past the end: cut to it; a suffix longer than the file: all.
        assert_eq!(ok("bytes=8-100", 10), Some((8, 10)));
        assert_eq!(ok("bytes=-100", 10), Some((0, 10)));
        assert_eq!(ok(" bytes=9-9 ", 10), Some((9, 10)));
        for bad in [
            "bytes=10-",
            "bytes=10-12",
            "bytes=5-2",
            "bytes=-0",
            "bytes=-",
            "bytes=a-b",
            "bytes=0-1,4-5",
            "items=0-1",
            "bytes=0",
            "bytes=-1-2",
        ] {
            let e = byte_range(Some(bad), 10).expect_err(bad);
            assert_eq!(e.status(), StatusCode::RANGE_NOT_SATISFIABLE, "{bad}");
        }
        assert!(
            byte_range(Some("bytes=0-"), 0).is_err(),
            "an empty file has no range"
        );
    }
}
