//! Accounts and what admins and users read of them: creating accounts,
//! crediting top-ups (a journal transaction against `deposits`), credit
//! limits, and the usage records of an account.

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::amount::{self, Amount, MAX_AMOUNT, MAX_BALANCE};
use super::{DEPOSITS, Ledger, LedgerError, PAYOUTS, TREASURY};
use crate::store::now;

/// What an account is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccountKind {
    User,
    Provider,
    Treasury,
    System,
}

impl AccountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Provider => "provider",
            Self::Treasury => "treasury",
            Self::System => "system",
        }
    }
}

/// An account as stored (amounts in ticks; units strings on the API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Account {
    pub id: String,
    pub kind: String,
    pub name: String,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub balance: Amount,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub held: Amount,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub credit_limit: Amount,
    /// Never refused (open mode's local user, system accounts).
    pub unlimited: bool,
    pub created_at: i64,
}

impl Account {
    /// What a new hold may use: balance + credit limit - holds.
    /// Saturating, although bounded balances, holds and limits never
    /// come near `i64`'s ends.
    pub fn available(&self) -> Amount {
        self.balance
            .saturating_add(self.credit_limit)
            .saturating_sub(self.held)
    }
}

/// One request's usage record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct UsageRecord {
    pub request_id: String,
    pub key_id: Option<String>,
    pub model: String,
    pub provider_id: String,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    /// What the user paid.
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub cost: Amount,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub provider_amount: Amount,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub fee: Amount,
    /// `finished`, `cut` or `failed`.
    pub outcome: String,
    pub created_at: i64,
    /// The executor (or provider worker) that ran the prefill, and the
    /// one that ran the decode; empty for cache hits.
    pub prefill_by: String,
    pub decode_by: String,
}

fn account(r: &AnyRow) -> Result<Account, sqlx::Error> {
    Ok(Account {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        name: r.try_get("name")?,
        balance: r.try_get("balance")?,
        held: r.try_get("held")?,
        credit_limit: r.try_get("credit_limit")?,
        unlimited: r.try_get::<i64, _>("unlimited")? != 0,
        created_at: r.try_get("created_at")?,
    })
}

fn usage(r: &AnyRow) -> Result<UsageRecord, sqlx::Error> {
    Ok(UsageRecord {
        request_id: r.try_get("request_id")?,
        key_id: r.try_get("key_id")?,
        model: r.try_get("model")?,
        provider_id: r.try_get("provider_id")?,
        prompt_tokens: r.try_get("prompt_tokens")?,
        cached_tokens: r.try_get("cached_tokens")?,
        completion_tokens: r.try_get("completion_tokens")?,
        cost: r.try_get("cost")?,
        provider_amount: r.try_get("provider_amount")?,
        fee: r.try_get("fee")?,
        outcome: r.try_get("outcome")?,
        created_at: r.try_get("created_at")?,
        prefill_by: r.try_get("prefill_by")?,
        decode_by: r.try_get("decode_by")?,
    })
}

const ACCOUNT_COLUMNS: &str = "id, kind, name, balance, held, credit_limit, unlimited, created_at";

impl Ledger {
    /// Creates an account with a fresh id (`user:...`, `provider:...`).
    pub async fn create_account(
        &self,
        kind: AccountKind,
        name: &str,
        credit_limit: Amount,
    ) -> Result<Account, LedgerError> {
        amount::check_bound("credit_limit", credit_limit, MAX_AMOUNT)
            .map_err(LedgerError::InvalidLimit)?;
        let id = format!("{}:{}", kind.as_str(), uuid::Uuid::new_v4().simple());
        let t = now();
        sqlx::query(
            "INSERT INTO accounts (id, kind, name, credit_limit, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&id)
        .bind(kind.as_str())
        .bind(name)
        .bind(credit_limit)
        .bind(t)
        .execute(&self.db.pool)
        .await?;
        self.account(&id).await
    }

    pub async fn account(&self, id: &str) -> Result<Account, LedgerError> {
        let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        row.map(|r| account(&r))
            .transpose()?
            .ok_or_else(|| LedgerError::UnknownAccount(id.to_string()))
    }

    /// Every account, by id.
    pub async fn accounts(&self) -> Result<Vec<Account>, LedgerError> {
        let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.iter().map(account).collect::<Result<_, _>>()?)
    }

    /// Credits `amount` (`0 < amount <= MAX_AMOUNT`) to a user or
    /// provider account from `deposits`; returns the journal transaction id.
    /// System accounts (`deposits`, `treasury`) are refused.
    pub async fn top_up(
        &self,
        account_id: &str,
        amount: Amount,
        memo: &str,
    ) -> Result<String, LedgerError> {
        amount::check_amount("top-up", amount).map_err(LedgerError::InvalidAmount)?;
        let a = self.account(account_id).await?;
        if a.kind != AccountKind::User.as_str() && a.kind != AccountKind::Provider.as_str() {
            return Err(LedgerError::WrongAccount(format!(
                "top-ups credit user or provider accounts; `{account_id}` is a {} account",
                a.kind
            )));
        }
        self.transfer("topup", DEPOSITS, account_id, amount, memo, false)
            .await
    }

    /// A penalty: `amount` (> 0) from a provider to the treasury.
    pub async fn penalize(
        &self,
        provider_id: &str,
        amount: Amount,
        memo: &str,
    ) -> Result<String, LedgerError> {
        self.take_final_funds("penalty", provider_id, TREASURY, amount, memo)
            .await
    }

    /// Pays `amount` of a provider's final funds out of the ledger (to
    /// `payouts`); returns the journal transaction id. Pending earnings
    /// stay: a failed spot check may still claw them back.
    pub async fn payout(
        &self,
        provider_id: &str,
        amount: Amount,
        memo: &str,
    ) -> Result<String, LedgerError> {
        self.take_final_funds("payout", provider_id, PAYOUTS, amount, memo)
            .await
    }

    /// Moves `amount` of a provider's final funds (its available funds
    /// less its pending earnings) to `to`.
    async fn take_final_funds(
        &self,
        kind: &str,
        provider_id: &str,
        to: &str,
        amount: Amount,
        memo: &str,
    ) -> Result<String, LedgerError> {
        let final_funds = self.final_funds(provider_id).await?;
        if amount > final_funds {
            return Err(LedgerError::InsufficientQuota {
                need: amount,
                available: final_funds.max(0),
            });
        }
        // Checked again inside the transfer, with the row locked: two
        // payouts (or a payout and a penalty) at once both pass the check
        // above, and the second must not reach the pending pay.
        self.transfer(kind, provider_id, to, amount, memo, true)
            .await
    }

    /// A provider's final funds: what it holds less what is still pending.
    pub async fn final_funds(&self, provider_id: &str) -> Result<Amount, LedgerError> {
        let p = self.account(provider_id).await?;
        if p.kind != AccountKind::Provider.as_str() {
            return Err(LedgerError::WrongAccount(format!(
                "penalties and payouts apply to provider accounts, not `{provider_id}`"
            )));
        }
        let pending = self.pending_earnings(provider_id).await?;
        Ok(p.available().saturating_sub(pending))
    }

    /// What `account` earned for work (usage entries) within the earnings
    /// window: pending, not final yet.
    pub async fn pending_earnings(&self, account: &str) -> Result<Amount, LedgerError> {
        let since = now() - self.earnings_window.as_secs() as i64;
        self.earned_since(account, since).await
    }

    /// What `account` earned for work (usage entries) after `since` (Unix
    /// seconds).
    pub async fn earned_since(&self, account: &str, since: i64) -> Result<Amount, LedgerError> {
        Ok(earned_since_on(&self.db.pool, account, since).await?)
    }

    /// Moves `amount` (`0 < amount <= MAX_AMOUNT`) from one account to
    /// another as one journal transaction of kind `kind`. The debit must
    /// fit the payer's funds (balance + credit limit - holds) unless it is
    /// unlimited, and no balance may leave `[-MAX_BALANCE, MAX_BALANCE]`:
    /// both are conditions of the update itself, so a refusal writes
    /// nothing. With `keep_pending`, the payer's pending earnings must
    /// still be covered after the debit (its final funds stay >= 0),
    /// checked inside the transaction once its row is locked, when every
    /// settlement that credited it before has committed.
    async fn transfer(
        &self,
        kind: &str,
        from: &str,
        to: &str,
        amount: Amount,
        memo: &str,
        keep_pending: bool,
    ) -> Result<String, LedgerError> {
        amount::check_amount(kind, amount).map_err(LedgerError::InvalidAmount)?;
        let mut tx = self.db.pool.begin().await?;
        // Rows in id order, so concurrent transfers never deadlock.
        let mut moves = [(from, -amount), (to, amount)];
        moves.sort();
        for (id, delta) in moves {
            if !apply_move(&mut tx, id, delta).await? {
                drop(tx);
                return Err(self.transfer_refusal(id, delta).await);
            }
        }
        if keep_pending {
            let left = self.final_funds_in(&mut tx, from).await?;
            if left < 0 {
                drop(tx);
                return Err(LedgerError::InsufficientQuota {
                    need: amount,
                    available: left.saturating_add(amount).max(0),
                });
            }
        }
        let tx_id = format!("{kind}:{}", uuid::Uuid::new_v4().simple());
        sqlx::query("INSERT INTO journal (id, kind, memo, created_at) VALUES ($1, $2, $3, $4)")
            .bind(&tx_id)
            .bind(kind)
            .bind(memo)
            .bind(now())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO entries (tx_id, account_id, amount) VALUES ($1, $2, $3), ($4, $5, $6)",
        )
        .bind(&tx_id)
        .bind(to)
        .bind(amount)
        .bind(&tx_id)
        .bind(from)
        .bind(-amount)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(tx_id)
    }

    /// `id`'s final funds as `tx` sees them: available less pending.
    async fn final_funds_in(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        id: &str,
    ) -> Result<Amount, LedgerError> {
        let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_one(&mut **tx)
            .await?;
        let available = account(&row)?.available();
        let since = now() - self.earnings_window.as_secs() as i64;
        let pending = earned_since_on(&mut **tx, id, since).await?;
        Ok(available.saturating_sub(pending))
    }

    /// Why a transfer's update of `id` by `delta` matched no row.
    pub(super) async fn transfer_refusal(&self, id: &str, delta: Amount) -> LedgerError {
        let a = match self.account(id).await {
            Ok(a) => a,
            Err(e) => return e,
        };
        let out_of_bounds = a
            .balance
            .checked_add(delta)
            .is_none_or(|b| !(-MAX_BALANCE..=MAX_BALANCE).contains(&b));
        if out_of_bounds {
            LedgerError::InvalidAmount(format!(
                "this would take the balance of `{id}` past the ledger's bound of {}",
                amount::show_units(MAX_BALANCE)
            ))
        } else {
            LedgerError::InsufficientQuota {
                need: delta.saturating_abs(),
                available: a.available(),
            }
        }
    }

    /// Sets how far below zero an account may go (at most `MAX_AMOUNT`).
    pub async fn set_credit_limit(&self, id: &str, limit: Amount) -> Result<(), LedgerError> {
        amount::check_bound("credit_limit", limit, MAX_AMOUNT)
            .map_err(LedgerError::InvalidLimit)?;
        let done = sqlx::query(
            "UPDATE accounts SET credit_limit = $1 WHERE id = $2 AND balance - held >= -$3",
        )
        .bind(limit)
        .bind(id)
        .bind(limit)
        .execute(&self.db.pool)
        .await?;
        if done.rows_affected() == 0 {
            let a = self.account(id).await?;
            return Err(LedgerError::InvalidLimit(format!(
                "`{id}` already uses {} of credit (balance minus holds); the limit cannot go below that",
                amount::show_units(a.held.saturating_sub(a.balance))
            )));
        }
        Ok(())
    }

    /// The newest usage records of an account (`limit` at most).
    pub async fn usage(
        &self,
        account_id: &str,
        limit: i64,
    ) -> Result<Vec<UsageRecord>, LedgerError> {
        self.usage_where(Some(account_id), None, limit).await
    }

    /// The newest usage records, of one account and of one key when given
    /// (`limit` at most).
    pub async fn usage_where(
        &self,
        account_id: Option<&str>,
        key_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<UsageRecord>, LedgerError> {
        let rows = sqlx::query(
            "SELECT request_id, key_id, model, provider_id, prompt_tokens, cached_tokens, \
             completion_tokens, cost, provider_amount, fee, outcome, created_at, prefill_by, \
             decode_by FROM usage_records \
             WHERE (CAST($1 AS TEXT) IS NULL OR account_id = $2) \
               AND (CAST($3 AS TEXT) IS NULL OR key_id = $4) \
             ORDER BY created_at DESC, request_id LIMIT $5",
        )
        .bind(account_id)
        .bind(account_id)
        .bind(key_id)
        .bind(key_id)
        .bind(limit)
        .fetch_all(&self.db.pool)
        .await?;
        Ok(rows.iter().map(usage).collect::<Result<_, _>>()?)
    }

    /// What requests cost per `bucket` seconds since `since` (of an
    /// account and a key, when given): (bucket start, cost, requests),
    /// oldest first; buckets without requests are left out.
    pub async fn spend(
        &self,
        account_id: Option<&str>,
        key_id: Option<&str>,
        since: i64,
        bucket: i64,
    ) -> Result<Vec<SpendBucket>, LedgerError> {
        let bucket = bucket.max(1);
        let rows = sqlx::query(
            "SELECT (created_at / $1) * $2 AS at, CAST(SUM(cost) AS BIGINT) AS cost, \
             COUNT(*) AS requests FROM usage_records \
             WHERE created_at >= $3 \
               AND (CAST($4 AS TEXT) IS NULL OR account_id = $5) \
               AND (CAST($6 AS TEXT) IS NULL OR key_id = $7) \
             GROUP BY at ORDER BY at",
        )
        .bind(bucket)
        .bind(bucket)
        .bind(since)
        .bind(account_id)
        .bind(account_id)
        .bind(key_id)
        .bind(key_id)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SpendBucket {
                    at: r.try_get("at")?,
                    cost: r.try_get("cost")?,
                    requests: r.try_get("requests")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(LedgerError::from)
    }

    /// What `account` earned for work per `bucket` seconds since `since`:
    /// (bucket start, earned, paid jobs), oldest first; buckets without
    /// earnings are left out.
    pub async fn earned_by_time(
        &self,
        account: &str,
        since: i64,
        bucket: i64,
    ) -> Result<Vec<EarnedBucket>, LedgerError> {
        let bucket = bucket.max(1);
        let rows = sqlx::query(
            "SELECT (j.created_at / $1) * $2 AS at, CAST(SUM(e.amount) AS BIGINT) AS earned, \
             COUNT(*) AS jobs FROM entries e JOIN journal j ON j.id = e.tx_id \
             WHERE e.account_id = $3 AND j.kind = 'usage' AND e.amount > 0 \
               AND j.created_at >= $4 \
             GROUP BY at ORDER BY at",
        )
        .bind(bucket)
        .bind(bucket)
        .bind(account)
        .bind(since)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(EarnedBucket {
                    at: r.try_get("at")?,
                    earned: r.try_get("earned")?,
                    jobs: r.try_get("jobs")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(LedgerError::from)
    }

    /// The usage record of one request, if it was settled.
    pub async fn usage_of(&self, request_id: &str) -> Result<Option<UsageRecord>, LedgerError> {
        let row = sqlx::query(
            "SELECT request_id, key_id, model, provider_id, prompt_tokens, cached_tokens, \
             completion_tokens, cost, provider_amount, fee, outcome, created_at, prefill_by, \
             decode_by FROM usage_records WHERE request_id = $1",
        )
        .bind(request_id)
        .fetch_optional(&self.db.pool)
        .await?;
        Ok(row.map(|r| usage(&r)).transpose()?)
    }

    /// What moved in and out of an account, by journal kind (`usage`,
    /// `trade`, `penalty`, `topup`): the sum of its entries and how many.
    pub async fn totals(&self, account_id: &str) -> Result<Vec<KindTotal>, LedgerError> {
        let rows = sqlx::query(
            "SELECT j.kind AS kind, CAST(SUM(e.amount) AS BIGINT) AS total, \
             CAST(COUNT(*) AS BIGINT) AS n FROM entries e JOIN journal j ON j.id = e.tx_id \
             WHERE e.account_id = $1 GROUP BY j.kind ORDER BY j.kind",
        )
        .bind(account_id)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(KindTotal {
                    kind: r.try_get("kind")?,
                    total: r.try_get("total")?,
                    transactions: r.try_get("n")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(LedgerError::from)
    }
}

/// What requests cost in one time bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SpendBucket {
    /// The bucket's start (Unix seconds).
    pub at: i64,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "0.0012")]
    pub cost: Amount,
    pub requests: i64,
}

/// What a provider earned in one time bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EarnedBucket {
    /// The bucket's start (Unix seconds).
    pub at: i64,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "0.0012")]
    pub earned: Amount,
    /// Paid work (settled requests' credits) in the bucket.
    pub jobs: i64,
}

/// An account's entries of one journal kind, summed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct KindTotal {
    pub kind: String,
    /// Ticks (credits positive).
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub total: Amount,
    pub transactions: i64,
}

/// Adds `delta` to `id`'s balance inside `tx` when the result stays
/// within the ledger's bounds and, for a debit, within the account's
/// funds (balance + credit limit - holds) unless it is unlimited; false
/// when refused (nothing changed).
/// What `account` earned for work (positive usage entries) after `since`,
/// on `ex` (the pool, or a transaction that locked the account's row).
async fn earned_since_on<'e, E>(ex: E, account: &str, since: i64) -> Result<Amount, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    let row = sqlx::query(
        "SELECT CAST(COALESCE(SUM(e.amount), 0) AS BIGINT) AS pending FROM entries e \
         JOIN journal j ON j.id = e.tx_id \
         WHERE e.account_id = $1 AND j.kind = 'usage' AND e.amount > 0 AND j.created_at > $2",
    )
    .bind(account)
    .bind(since)
    .fetch_one(ex)
    .await?;
    row.try_get("pending")
}

pub(super) async fn apply_move(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
    delta: Amount,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE accounts SET balance = balance + $1 WHERE id = $2 \
         AND balance + $3 BETWEEN $4 AND $5 \
         AND ($6 > 0 OR unlimited = 1 OR balance - held + $7 >= -credit_limit)",
    )
    .bind(delta)
    .bind(id)
    .bind(delta)
    .bind(-MAX_BALANCE)
    .bind(MAX_BALANCE)
    .bind(delta)
    .bind(delta)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() > 0)
}
