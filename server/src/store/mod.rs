//! Persistent storage through sqlx: PostgreSQL (production, shared by
//! replicas) or a SQLite file (the embedded default), picked by the URL.
//! Each backend has its own migrations (`migrations/postgres`,
//! `migrations/sqlite`), embedded in the binary and run at connect time.
//! Queries use `$N` placeholders, which both backends accept.

pub mod keys;

use std::path::Path;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

/// Storage errors (mapped to a generic 500/503 by the API layer).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL `{0}` (use sqlite:// or postgres://)")]
    UnsupportedUrl(String),
    #[error("cannot create the database folder {path}: {source}")]
    Folder {
        path: String,
        source: std::io::Error,
    },
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A connected, migrated database.
#[derive(Debug, Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub backend: Backend,
}

impl Db {
    /// Connects to `url` and applies the backend's pending migrations. A
    /// SQLite file (and its folder) is created if missing.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let (backend, url) = if let Some(rest) = url.strip_prefix("sqlite://") {
            (Backend::Sqlite, sqlite_url(rest)?)
        } else if url.starts_with("sqlite:") {
            (Backend::Sqlite, url.to_string())
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Backend::Postgres, url.to_string())
        } else {
            return Err(StoreError::UnsupportedUrl(url.to_string()));
        };
        let pool = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 4 } else { 16 })
            .connect(&url)
            .await?;
        match backend {
            Backend::Sqlite => sqlx::migrate!("../migrations/sqlite").run(&pool).await?,
            Backend::Postgres => sqlx::migrate!("../migrations/postgres").run(&pool).await?,
        }
        Ok(Self { pool, backend })
    }
}

/// `sqlite://<path>` with the file created on first use.
fn sqlite_url(rest: &str) -> Result<String, StoreError> {
    let path = rest.split('?').next().unwrap_or(rest);
    if path != ":memory:"
        && let Some(dir) = Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Folder {
            path: dir.display().to_string(),
            source,
        })?;
    }
    Ok(if rest.contains('?') {
        format!("sqlite://{rest}")
    } else {
        format!("sqlite://{rest}?mode=rwc")
    })
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
