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
    /// When a check caught one of its workers: refused until an admin
    /// clears it.
    pub quarantined_at: Option<i64>,
    /// What the check found.
    pub quarantine_reason: Option<String>,
}

fn token(row: &AnyRow) -> Result<WorkerToken, sqlx::Error> {
    Ok(WorkerToken {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
        quarantined_at: row.try_get("quarantined_at")?,
        quarantine_reason: row.try_get("quarantine_reason")?,
    })
}

/// The columns `token` reads.
const COLUMNS: &str =
    "id, account_id, name, prefix, created_at, revoked_at, quarantined_at, quarantine_reason";

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
            quarantined_at: None,
            quarantine_reason: None,
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
        let sql = format!("SELECT {COLUMNS} FROM worker_tokens ORDER BY created_at, id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
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

    /// Quarantines token `id` (once: the first reason stands); false when
    /// there is no such token or it already was.
    pub async fn quarantine_worker_token(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE worker_tokens SET quarantined_at = $1, quarantine_reason = $2 \
             WHERE id = $3 AND quarantined_at IS NULL",
        )
        .bind(now())
        .bind(reason)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Lifts token `id`'s quarantine; false when it was not quarantined.
    pub async fn clear_worker_quarantine(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE worker_tokens SET quarantined_at = NULL, quarantine_reason = NULL \
             WHERE id = $1 AND quarantined_at IS NOT NULL",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Of tokens `ids`, those revoked or quarantined, with why.
    pub async fn sanctioned_tokens(
        &self,
        ids: &[String],
    ) -> Result<Vec<(String, String)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list: Vec<String> = (1..=ids.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT id, revoked_at, quarantine_reason FROM worker_tokens WHERE id IN ({}) \
             AND (revoked_at IS NOT NULL OR quarantined_at IS NOT NULL)",
            list.join(", ")
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in ids {
            q = q.bind(id.as_str());
        }
        let mut out = Vec::new();
        for row in q.fetch_all(&self.pool).await? {
            let revoked: Option<i64> = row.try_get("revoked_at")?;
            let reason: Option<String> = row.try_get("quarantine_reason")?;
            let why = match revoked {
                Some(_) => "this worker token was revoked".to_string(),
                None => format!(
                    "this worker token is quarantined: {}",
                    reason.unwrap_or_default()
                ),
            };
            out.push((row.try_get("id")?, why));
        }
        Ok(out)
    }

    /// The unrevoked token whose secret this is (quarantined or not: the
    /// gateway refuses a quarantined one with its reason).
    pub async fn find_worker_token(&self, secret: &str) -> Result<Option<WorkerToken>, StoreError> {
        let h = hash(secret);
        let sql = format!(
            "SELECT {COLUMNS}, secret_hash FROM worker_tokens \
             WHERE secret_hash = $1 AND revoked_at IS NULL"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
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

    #[tokio::test]
    async fn a_quarantine_is_stored_with_the_token_until_an_admin_clears_it() {
        for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
            let db = Db::connect(&url).await.expect("db");
            let (t, secret) = db
                .create_worker_token("provider:house", "rack 2")
                .await
                .expect("token");
            let (other, _) = db
                .create_worker_token("provider:house", "rack 3")
                .await
                .expect("token");
            let ids = vec![t.id.clone(), other.id.clone()];
            assert!(db.sanctioned_tokens(&ids).await.expect("none").is_empty());
            assert!(
                db.quarantine_worker_token(&t.id, "canary")
                    .await
                    .expect("q")
            );
            assert!(!db.quarantine_worker_token(&t.id, "again").await.expect("q"));
            // Another connection to the same database (a restart, another
            // replica) sees it.
            let again = Db::connect(&url).await.expect("db");
            let found = again.find_worker_token(&secret).await.expect("find");
            let found = found.expect("still a token");
            assert_eq!(found.quarantine_reason.as_deref(), Some("canary"));
            assert!(found.quarantined_at.is_some());
            let hit = again.sanctioned_tokens(&ids).await.expect("hit");
            assert_eq!(hit.len(), 1);
            assert!(
                hit[0].0 == t.id && hit[0].1.contains("quarantined: canary"),
                "{hit:?}"
            );
            assert!(again.revoke_worker_token(&other.id).await.expect("revoke"));
            assert_eq!(again.sanctioned_tokens(&ids).await.expect("both").len(), 2);
            assert!(again.clear_worker_quarantine(&t.id).await.expect("clear"));
            assert!(!again.clear_worker_quarantine(&t.id).await.expect("twice"));
            let found = again.find_worker_token(&secret).await.expect("find");
            assert_eq!(found.and_then(|f| f.quarantined_at), None);
        }
    }
}
