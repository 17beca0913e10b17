//! Worker tokens: a provider account's credentials for its workers at the
//! gateway. Created with a random secret that is shown once, stored as
//! its SHA-256 only, looked up by that hash and compared in constant time
//! (as API keys are).

use sqlx::Row;
use sqlx::any::AnyRow;

use super::keys::{hash, hash_matches, new_secret};
use super::{Db, StoreError, now};

/// What every worker token starts with.
pub const TOKEN_PREFIX: &str = "swt-synor-";

/// A worker token as listed (never with its secret).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct WorkerToken {
    pub id: String,
    /// The provider account its workers earn for.
    pub account_id: String,
    pub name: String,
    /// The secret's first characters, to tell tokens apart.
    pub prefix: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

fn token(row: &AnyRow) -> Result<WorkerToken, sqlx::Error> {
    Ok(WorkerToken {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

impl Db {
    /// A new token for provider account `account_id`; returns it with its
    /// secret (shown once, never stored).
    pub async fn create_worker_token(
        &self,
        account_id: &str,
        name: &str,
    ) -> Result<(WorkerToken, String), StoreError> {
        let kind: Option<String> = sqlx::query_scalar("SELECT kind FROM accounts WHERE id = $1")
            .bind(account_id)
            .fetch_optional(&self.pool)
            .await?;
        if kind.as_deref() != Some("provider") {
            return Err(StoreError::UnknownAccount(account_id.to_string()));
        }
        let secret = new_secret(TOKEN_PREFIX);
        let rec = WorkerToken {
            id: format!("wtok_{}", uuid::Uuid::new_v4().simple()),
            account_id: account_id.to_string(),
            name: name.to_string(),
            prefix: secret.chars().take(TOKEN_PREFIX.len() + 4).collect(),
            created_at: now(),
            revoked_at: None,
        };
        sqlx::query(
            "INSERT INTO worker_tokens (id, account_id, name, prefix, secret_hash, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&rec.id)
        .bind(&rec.account_id)
        .bind(&rec.name)
        .bind(&rec.prefix)
        .bind(hash(&secret))
        .bind(rec.created_at)
        .execute(&self.pool)
        .await?;
        Ok((rec, secret))
    }

    /// Every worker token, oldest first.
    pub async fn list_worker_tokens(&self) -> Result<Vec<WorkerToken>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, account_id, name, prefix, created_at, revoked_at FROM worker_tokens \
             ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(token).collect::<Result<_, _>>()?)
    }

    /// Revokes a token (its workers are refused from their next
    /// handshake); false when there is no such active token.
    pub async fn revoke_worker_token(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE worker_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
        )
        .bind(now())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The active token whose secret this is.
    pub async fn find_worker_token(&self, secret: &str) -> Result<Option<WorkerToken>, StoreError> {
        let h = hash(secret);
        let row = sqlx::query(
            "SELECT id, account_id, name, prefix, created_at, revoked_at, secret_hash \
             FROM worker_tokens WHERE secret_hash = $1 AND revoked_at IS NULL",
        )
        .bind(&h)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) if hash_matches(&row, &h)? => Ok(Some(token(&row)?)),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::store::{Db, testing};

    #[tokio::test]
    async fn tokens_belong_to_providers_and_work_only_while_active() {
        for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
            let db = Db::connect(&url).await.expect("db");
            assert!(db.create_worker_token("user:local", "w").await.is_err());
            assert!(db.create_worker_token("nobody", "w").await.is_err());
            let (t, secret) = db
                .create_worker_token("provider:house", "rack 1")
                .await
                .expect("token");
            assert!(secret.starts_with(super::TOKEN_PREFIX) && secret.starts_with(&t.prefix));
            let found = db.find_worker_token(&secret).await.expect("find");
            assert_eq!(found.as_ref().map(|f| &f.account_id), Some(&t.account_id));
            assert!(
                db.find_worker_token("swt-synor-wrong")
                    .await
                    .expect("find")
                    .is_none()
            );
            assert_eq!(
                db.list_worker_tokens().await.expect("list"),
                vec![t.clone()]
            );
            assert!(db.revoke_worker_token(&t.id).await.expect("revoke"));
            assert!(!db.revoke_worker_token(&t.id).await.expect("again"));
            assert!(db.find_worker_token(&secret).await.expect("find").is_none());
        }
    }
}
