//! Persistent storage through sqlx: PostgreSQL (production, shared by
//! replicas) or a SQLite file (the embedded default), picked by the URL.
//! Each backend has its own migrations (`migrations/postgres`,
//! `migrations/sqlite`), embedded in the binary and run at connect time.
//! Queries use `$N` placeholders, which both backends accept.

pub mod keys;
#[cfg(test)]
mod migration_tests;
pub mod models;
pub mod points;
pub mod workers;

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
    #[error("no user account `{0}`")]
    UnknownAccount(String),
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
        let db = Self::open(url).await?;
        db.migrator().run(&db.pool).await?;
        Ok(db)
    }

    /// The backend's migrations, embedded in the binary.
    pub fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
        static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");
        match self.backend {
            Backend::Sqlite => &SQLITE,
            Backend::Postgres => &POSTGRES,
        }
    }

    /// Connects to `url` without migrating.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
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
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // Write-ahead logging: readers never block the
                        // writer and a commit is one fsync (still FULL
                        // sync: a commit survives a power cut).
                        sqlx::query("PRAGMA journal_mode = WAL")
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query("PRAGMA busy_timeout = 10000")
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await?;
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

/// Test and benchmark helpers: a reachable PostgreSQL (started if it is
/// down, with the machine's own command), a fresh schema in it, and a fresh
/// SQLite file.
#[doc(hidden)]
pub mod testing {
    /// `SYNOR_TEST_POSTGRES_URL`, default the local `test` database.
    pub fn postgres_url() -> String {
        let url = std::env::var("SYNOR_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let up = || {
            std::process::Command::new("pg_isready")
                .args(["-h", "127.0.0.1", "-p", "5432"])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !up() {
            let _ = std::process::Command::new("sh")
                .args([
                    "-c",
                    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
                ])
                .status();
            for _ in 0..50 {
                if up() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
        url
    }

    /// A URL of a fresh, empty schema in the test database, so each test
    /// migrates and audits its own tables. Schemas left by runs older than
    /// an hour are dropped.
    pub async fn fresh_postgres_url() -> String {
        use sqlx::Connection;
        let base = postgres_url();
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(&base)
            .await
            .unwrap_or_else(|e| panic!("{base}: {e}"));
        let t = super::now();
        let old = sqlx::query(
            "SELECT CAST(nspname AS TEXT) AS nspname FROM pg_namespace WHERE nspname LIKE 't\\_%' ESCAPE '\\'",
        )
        .fetch_all(&mut conn)
        .await
        .expect("schemas");
        for row in old {
            use sqlx::Row;
            let name: String = row.get(0);
            let born: i64 = name
                .split('_')
                .nth(1)
                .and_then(|x| x.parse().ok())
                .unwrap_or(t);
            if t - born > 3600 {
                let drop = format!("DROP SCHEMA IF EXISTS {name} CASCADE");
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop))
                    .execute(&mut conn)
                    .await;
            }
        }
        let name = format!("t_{t}_{}", uuid::Uuid::new_v4().simple());
        let create = format!("CREATE SCHEMA {name}");
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&mut conn)
            .await
            .expect("create schema");
        format!("{base}?options[search_path]={name}")
    }

    pub fn sqlite_url() -> String {
        let dir = std::env::temp_dir().join(format!("synor-db-{}", uuid::Uuid::new_v4().simple()));
        format!("sqlite://{}/t.db", dir.display())
    }
}
