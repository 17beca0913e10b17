//! API keys: created with a random secret that is shown once, stored as
//! its SHA-256 only, looked up by that hash and compared in constant time;
//! per-key limits (requests and tokens per minute, concurrent requests);
//! revocation. Every key belongs to a user account (the ledger's), made
//! for it unless one is given, and may have a spending budget.

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
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
pub struct Limits {
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub max_concurrent: Option<i64>,
}

/// What a new key is: its name, limits, account and budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewKey {
    pub name: String,
    pub limits: Limits,
    /// The user account it spends from; `None` makes a new one.
    pub account_id: Option<String>,
    /// Most the key may spend, in ticks; `None` is unlimited.
    pub budget: Option<i64>,
}

impl NewKey {
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_string(),
            ..Self::default()
        }
    }
}

/// A key as listed (never with its secret).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    /// The user account it spends from.
    pub account_id: String,
    /// Spending budget, if any, and what it has spent.
    #[serde(with = "crate::ledger::units::opt")]
    #[schema(value_type = Option<String>, example = "0.0004")]
    pub budget: Option<i64>,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub spent: i64,
    /// The secret's first characters, to tell keys apart.
    pub prefix: String,
    pub limits: Limits,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A new secret: `prefix` then 40 random letters and digits.
pub(crate) fn new_secret(prefix: &str) -> String {
    let mut rng = rand::rng();
    let body: String = (0..40)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{prefix}{body}")
}

/// The SHA-256 of a secret, hex (what is stored).
pub(crate) fn hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether a looked-up row's `secret_hash` is `h` (compared in constant
/// time, after the index lookup found it).
pub(crate) fn hash_matches(row: &AnyRow, h: &str) -> Result<bool, sqlx::Error> {
    let stored: String = row.try_get("secret_hash")?;
    Ok(constant_time_eq(stored.as_bytes(), h.as_bytes()))
}

/// Equality that takes the same time wherever the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn record(row: &AnyRow) -> Result<KeyRecord, sqlx::Error> {
    Ok(KeyRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        account_id: row
            .try_get::<Option<String>, _>("account_id")?
            .unwrap_or_default(),
        budget: row.try_get("budget")?,
        spent: row.try_get("spent")?,
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
        "id, name, account_id, budget, spent, prefix, rpm_limit, tpm_limit, max_concurrent, \
         created_at, revoked_at"
    };
}

impl Db {
    /// Creates a key; returns it with its secret (shown once, never stored).
    pub async fn create_key(&self, new: &NewKey) -> Result<(KeyRecord, String), StoreError> {
        let (name, limits) = (new.name.as_str(), new.limits);
        // The RNG is not `Send`: `new_secret` is done with it before any
        // `.await`.
        let secret = new_secret(SECRET_PREFIX);
        let id = format!("key_{}", uuid::Uuid::new_v4().simple());
        let prefix: String = secret.chars().take(SECRET_PREFIX.len() + 4).collect();
        let t = now();
        let mut tx = self.pool.begin().await?;
        let account_id = match &new.account_id {
            Some(a) => {
                let kind: Option<String> =
                    sqlx::query_scalar("SELECT kind FROM accounts WHERE id = $1")
                        .bind(a)
                        .fetch_optional(&mut *tx)
                        .await?;
                if kind.as_deref() != Some("user") {
                    return Err(StoreError::UnknownAccount(a.clone()));
                }
                a.clone()
            }
            None => {
                let a = format!("user:{}", uuid::Uuid::new_v4().simple());
                sqlx::query(
                    "INSERT INTO accounts (id, kind, name, created_at) VALUES ($1, 'user', $2, $3)",
                )
                .bind(&a)
                .bind(name)
                .bind(t)
                .execute(&mut *tx)
                .await?;
                a
            }
        };
        sqlx::query(
            "INSERT INTO api_keys (id, name, account_id, budget, prefix, secret_hash, rpm_limit, \
             tpm_limit, max_concurrent, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&id)
        .bind(name)
        .bind(&account_id)
        .bind(new.budget)
        .bind(&prefix)
        .bind(hash(&secret))
        .bind(limits.rpm)
        .bind(limits.tpm)
        .bind(limits.max_concurrent)
        .bind(t)
        .bind(t)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let rec = KeyRecord {
            id,
            name: name.to_string(),
            account_id,
            budget: new.budget,
            spent: 0,
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
        match row {
            Some(row) if hash_matches(&row, &h)? => Ok(Some(record(&row)?)),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn keys_work_the_same_on_sqlite_and_postgres() {
        for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
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
        let new = NewKey {
            limits,
            ..NewKey::named("ci")
        };
        let (k, secret) = db.create_key(&new).await.expect("create");
        assert!(k.account_id.starts_with("user:"));
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
