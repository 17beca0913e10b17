//! API keys: created with a random secret that is shown once, stored as
//! its SHA-256 only, looked up by that hash and compared in constant time;
//! per-key limits (requests and tokens per minute, concurrent requests);
//! revocation.

use rand::Rng;
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Db, StoreError, now};

/// Characters of a secret's random part.
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Secrets start with this, so they are easy to recognise (and to scan for).
pub const SECRET_PREFIX: &str = "sk-synor-";

/// Per-key limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub max_concurrent: Option<i64>,
}

/// A key as listed (never with its secret).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    /// The secret's first characters, to tell keys apart.
    pub prefix: String,
    pub limits: Limits,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

fn hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Equality that takes the same time wherever the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn record(row: &AnyRow) -> Result<KeyRecord, sqlx::Error> {
    Ok(KeyRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        limits: Limits {
            rpm: row.try_get("rpm_limit")?,
            tpm: row.try_get("tpm_limit")?,
            max_concurrent: row.try_get("max_concurrent")?,
        },
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

/// The listed columns (a macro, so queries stay string literals).
macro_rules! columns {
    () => {
        "id, name, prefix, rpm_limit, tpm_limit, max_concurrent, created_at, revoked_at"
    };
}

impl Db {
    /// Creates a key; returns it with its secret (shown once, never stored).
    pub async fn create_key(
        &self,
        name: &str,
        limits: Limits,
    ) -> Result<(KeyRecord, String), StoreError> {
        // The RNG is not `Send`: finish with it before any `.await`.
        let body: String = {
            let mut rng = rand::rng();
            (0..40)
                .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
                .collect()
        };
        let secret = format!("{SECRET_PREFIX}{body}");
        let id = format!("key_{}", uuid::Uuid::new_v4().simple());
        let prefix: String = secret.chars().take(SECRET_PREFIX.len() + 4).collect();
        let t = now();
        sqlx::query(
            "INSERT INTO api_keys (id, name, prefix, secret_hash, rpm_limit, tpm_limit, max_concurrent, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&id)
        .bind(name)
        .bind(&prefix)
        .bind(hash(&secret))
        .bind(limits.rpm)
        .bind(limits.tpm)
        .bind(limits.max_concurrent)
        .bind(t)
        .bind(t)
        .execute(&self.pool)
        .await?;
        let rec = KeyRecord {
            id,
            name: name.to_string(),
            prefix,
            limits,
            created_at: t,
            revoked_at: None,
        };
        Ok((rec, secret))
    }

    /// Every key, oldest first.
    pub async fn list_keys(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM api_keys ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }

    /// Revokes a key; false when there is no such active key.
    pub async fn revoke_key(&self, id: &str) -> Result<bool, StoreError> {
        let t = now();
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = $1, updated_at = $2 WHERE id = $3 AND revoked_at IS NULL",
        )
        .bind(t)
        .bind(t)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The active key whose secret this is.
    pub async fn find_key(&self, secret: &str) -> Result<Option<KeyRecord>, StoreError> {
        let h = hash(secret);
        let row = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            ", secret_hash FROM api_keys WHERE secret_hash = $1 AND revoked_at IS NULL"
        ))
        .bind(&h)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let stored: String = row.try_get("secret_hash")?;
        if !constant_time_eq(stored.as_bytes(), h.as_bytes()) {
            return Ok(None);
        }
        Ok(Some(record(&row)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn keys_work_the_same_on_sqlite_and_postgres() {
        for url in [testing::sqlite_url(), testing::postgres_url()] {
            let db = Db::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}"));
            keys_are_found_by_secret_only_while_active(&db).await;
        }
    }

    async fn keys_are_found_by_secret_only_while_active(db: &Db) {
        let limits = Limits {
            rpm: Some(5),
            tpm: None,
            max_concurrent: Some(2),
        };
        let (k, secret) = db.create_key("ci", limits).await.expect("create");
        assert!(secret.starts_with(SECRET_PREFIX) && secret.len() == SECRET_PREFIX.len() + 40);
        assert!(secret.starts_with(&k.prefix));
        let found = db.find_key(&secret).await.expect("find").expect("active");
        assert_eq!((found.id.as_str(), found.limits), (k.id.as_str(), limits));
        assert!(db.find_key("sk-synor-wrong").await.expect("find").is_none());
        let listed = db.list_keys().await.expect("list");
        assert!(
            listed
                .iter()
                .any(|l| l.id == k.id && l.revoked_at.is_none())
        );
        assert!(db.revoke_key(&k.id).await.expect("revoke"));
        assert!(
            !db.revoke_key(&k.id).await.expect("again"),
            "revoking twice is a no-op"
        );
        assert!(db.find_key(&secret).await.expect("find").is_none());
        let listed = db.list_keys().await.expect("list");
        assert!(
            listed
                .iter()
                .any(|l| l.id == k.id && l.revoked_at.is_some())
        );
    }

    #[test]
    fn secrets_are_stored_as_hashes_and_compared_evenly() {
        assert_eq!(hash("abc").len(), 64);
        assert_ne!(hash("abc"), hash("abd"));
        assert!(constant_time_eq(b"same", b"same"));
        assert!(!constant_time_eq(b"same", b"sane") && !constant_time_eq(b"a", b"ab"));
    }
}
