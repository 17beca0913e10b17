//! Reading the journal, and the audit: the ledger's invariants checked
//! against it, the double entry's and the economic ones (no provider paid
//! more than its user paid less the fee, no fee below the protocol's, no
//! completion billed past `max_tokens`). Each check is one SQL statement,
//! so it sees one consistent snapshot even while requests are being billed.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::{AssertSqlSafe, Row};

use super::amount::Amount;
use super::{Ledger, LedgerError};

/// One journal transaction with its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Transaction {
    pub id: String,
    /// `topup` or `usage`.
    pub kind: String,
    /// The request id of a usage transaction.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    pub memo: String,
    pub created_at: i64,
    /// Account id -> amount (units strings; ticks in the ledger); they sum to zero.
    #[serde(serialize_with = "crate::ledger::units::map::serialize")]
    #[schema(value_type = BTreeMap<String, String>)]
    pub entries: BTreeMap<String, Amount>,
}

/// The result of an audit: empty `violations` means every invariant holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Audit {
    pub violations: Vec<String>,
    pub transactions: i64,
    pub open_holds: i64,
}

/// Each invariant: a query returning one row per violation, and its label.
const CHECKS: &[(&str, &str)] = &[
    (
        "transaction does not sum to zero",
        "SELECT tx_id AS what FROM entries GROUP BY tx_id HAVING SUM(amount) <> 0",
    ),
    (
        "balance differs from its journal entries",
        "SELECT a.id AS what FROM accounts a WHERE a.balance <> CAST(COALESCE( \
         (SELECT SUM(e.amount) FROM entries e WHERE e.account_id = a.id), 0) AS BIGINT)",
    ),
    (
        "held differs from the open holds",
        "SELECT a.id AS what FROM accounts a WHERE a.held <> CAST(COALESCE( \
         (SELECT SUM(h.amount) FROM holds h WHERE h.account_id = a.id AND h.state = 'open'), 0) AS BIGINT)",
    ),
    (
        "balance below the credit limit",
        "SELECT id AS what FROM accounts WHERE unlimited = 0 AND balance - held < -credit_limit",
    ),
    (
        "settled hold without exactly one usage record (or a record without a settled hold)",
        "SELECT COALESCE(h.request_id, u.request_id) AS what FROM holds h \
         FULL OUTER JOIN usage_records u ON u.request_id = h.request_id \
         WHERE (h.state = 'settled' AND u.request_id IS NULL) \
         OR (u.request_id IS NOT NULL AND (h.state IS NULL OR h.state <> 'settled'))",
    ),
    (
        "usage cost differs from the user's journal debit",
        "SELECT u.request_id AS what FROM usage_records u WHERE u.cost <> CAST(COALESCE( \
         (SELECT -SUM(e.amount) FROM entries e WHERE e.tx_id = 'usage:' || u.request_id \
         AND e.account_id = u.account_id), 0) AS BIGINT)",
    ),
    (
        "key spending differs from its usage records and trades",
        "SELECT k.id AS what FROM api_keys k WHERE k.spent <> CAST(COALESCE( \
         (SELECT SUM(u.cost) FROM usage_records u WHERE u.key_id = k.id), 0) AS BIGINT) \
         + CAST(COALESCE((SELECT SUM(h.spent) FROM holds h WHERE h.key_id = k.id), 0) AS BIGINT) \
         OR k.held <> CAST(COALESCE((SELECT SUM(h.amount) FROM holds h \
         WHERE h.key_id = k.id AND h.state = 'open'), 0) AS BIGINT)",
    ),
    (
        "key over its budget",
        "SELECT id AS what FROM api_keys WHERE budget IS NOT NULL AND spent + held > budget",
    ),
    (
        "balances do not sum to zero",
        "SELECT 'all' AS what FROM (SELECT SUM(balance) AS total FROM accounts) t WHERE t.total <> 0",
    ),
    // The economic invariants: what a double entry cannot see.
    (
        "providers paid more than the user paid less the protocol fee",
        "SELECT u.request_id AS what FROM usage_records u JOIN holds h ON h.request_id = u.request_id \
         WHERE u.fee < 0 OR u.provider_amount < 0 OR u.provider_amount + u.fee <> u.cost \
         OR u.fee * (10000 + h.fee_bps) < u.cost * h.fee_bps",
    ),
    (
        "provider credits differ from the usage record",
        "SELECT u.request_id AS what FROM usage_records u WHERE u.provider_amount <> CAST(COALESCE( \
         (SELECT SUM(e.amount) FROM entries e WHERE e.tx_id = 'usage:' || u.request_id \
         AND e.account_id <> u.account_id AND e.account_id <> 'treasury'), 0) AS BIGINT) \
         OR EXISTS (SELECT 1 FROM entries e WHERE e.tx_id = 'usage:' || u.request_id \
         AND e.account_id <> u.account_id AND e.amount < 0)",
    ),
    (
        "completion tokens billed past the request's max_tokens",
        "SELECT u.request_id AS what FROM usage_records u JOIN holds h ON h.request_id = u.request_id \
         WHERE h.max_completion IS NOT NULL AND u.completion_tokens > h.max_completion",
    ),
];

impl Ledger {
    /// Checks every invariant.
    pub async fn audit(&self) -> Result<Audit, LedgerError> {
        let mut audit = Audit::default();
        for (label, sql) in CHECKS {
            for row in sqlx::query(AssertSqlSafe(*sql))
                .fetch_all(&self.db.pool)
                .await?
            {
                let what: String = row.try_get("what")?;
                audit.violations.push(format!("{label}: {what}"));
            }
        }
        let count = |sql: &'static str| async move {
            let row = sqlx::query(sql).fetch_one(&self.db.pool).await?;
            row.try_get::<i64, _>("n")
        };
        audit.transactions = count("SELECT CAST(COUNT(*) AS BIGINT) AS n FROM journal").await?;
        audit.open_holds =
            count("SELECT CAST(COUNT(*) AS BIGINT) AS n FROM holds WHERE state = 'open'").await?;
        self.last_audit.store(
            audit.violations.len() as i64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(audit)
    }

    /// The newest journal transactions (touching one account, of one
    /// kind, or all).
    pub async fn journal(
        &self,
        account: Option<&str>,
        kind: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Transaction>, LedgerError> {
        let rows = sqlx::query(
            "SELECT j.id, j.kind, j.ref, j.memo, j.created_at, e.account_id, e.amount \
             FROM journal j JOIN entries e ON e.tx_id = j.id WHERE j.id IN ( \
               SELECT j2.id FROM journal j2 WHERE (CAST($1 AS TEXT) IS NULL OR EXISTS ( \
                 SELECT 1 FROM entries e2 WHERE e2.tx_id = j2.id AND e2.account_id = $2)) \
                 AND (CAST($3 AS TEXT) IS NULL OR j2.kind = $4) \
               ORDER BY j2.created_at DESC, j2.id DESC LIMIT $5) \
             ORDER BY j.created_at DESC, j.id DESC",
        )
        .bind(account)
        .bind(account)
        .bind(kind)
        .bind(kind)
        .bind(limit)
        .fetch_all(&self.db.pool)
        .await?;
        let mut out: Vec<Transaction> = Vec::new();
        for r in rows {
            let id: String = r.try_get("id")?;
            if out.last().is_none_or(|t| t.id != id) {
                out.push(Transaction {
                    id,
                    kind: r.try_get("kind")?,
                    reference: r.try_get("ref")?,
                    memo: r.try_get("memo")?,
                    created_at: r.try_get("created_at")?,
                    entries: BTreeMap::new(),
                });
            }
            if let Some(t) = out.last_mut() {
                t.entries
                    .insert(r.try_get("account_id")?, r.try_get("amount")?);
            }
        }
        Ok(out)
    }
}
