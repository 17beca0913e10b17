//! Placing a hold: before a request runs, its worst case is reserved on
//! the user's account (and on its key's budget) in one transaction; the
//! conditional updates make the check and the reservation one step, so
//! concurrent requests (on any replica) can never overdraw an account.

use sqlx::Row;

use super::amount::{self, Amount, MAX_BALANCE, Quote};
use super::{Ledger, LedgerError};
use crate::store::now;

/// Retries of a hold that met another transaction (`super::retryable`).
const RETRIES: u32 = 4;

/// One request's reservation.
#[derive(Debug, Clone)]
pub struct HoldRequest<'a> {
    /// Unique per request; its usage record and journal entry carry it.
    pub request_id: &'a str,
    pub account_id: &'a str,
    pub key_id: Option<&'a str>,
    pub quote: &'a Quote,
    /// The worst case (`quote.worst_case(..)`).
    pub amount: Amount,
    /// The most completion tokens it may be billed for (the sum of its
    /// choices' `max_tokens`), checked by the audit; `None`: no limit.
    pub max_completion: Option<u64>,
}

impl Ledger {
    /// Reserves `h.amount`, or refuses: `InsufficientQuota` when the
    /// account's balance (plus its credit limit) minus what is already held
    /// cannot cover it, `BudgetExceeded` when the key's budget cannot.
    pub async fn hold(&self, h: HoldRequest<'_>) -> Result<(), LedgerError> {
        self.hold_for(h, self.instance()).await
    }

    /// `hold`, recorded as belonging to `instance` (the market's bids use
    /// one no server owns, so recovery never closes them).
    pub(super) async fn hold_for(
        &self,
        h: HoldRequest<'_>,
        instance: &str,
    ) -> Result<(), LedgerError> {
        if self.jobs.is_closed() {
            return Err(LedgerError::Closed);
        }
        check_hold(h.amount)?;
        let mut attempt = 0;
        loop {
            match self.hold_once(&h, instance).await {
                Err(LedgerError::Sql(e)) if super::retryable(&e) && attempt < RETRIES => {
                    attempt += 1;
                    super::backoff(attempt).await;
                }
                r => return r,
            }
        }
    }

    /// One attempt at `hold_for`, in one transaction.
    async fn hold_once(&self, h: &HoldRequest<'_>, instance: &str) -> Result<(), LedgerError> {
        let mut tx = self.db.pool.begin().await?;
        match reserve(&mut tx, h.account_id, h.key_id, h.amount).await? {
            Reserved::Yes => {}
            Reserved::NoFunds => {
                drop(tx);
                return Err(self.refusal(h.account_id, h.amount).await);
            }
            Reserved::OverBudget => {
                drop(tx);
                let key = h.key_id.unwrap_or_default();
                return Err(self.budget_refusal(key, h.amount).await);
            }
        }
        if let Err(e) = insert_hold(&mut tx, h, instance).await {
            let duplicate = matches!(&e, sqlx::Error::Database(d) if d.is_unique_violation());
            return Err(if duplicate {
                LedgerError::DuplicateHold(h.request_id.to_string())
            } else {
                e.into()
            });
        }
        tx.commit().await?;
        Ok(())
    }

    /// Whether the account (and key budget) can cover `amount` now, read
    /// without writing.
    pub(super) async fn check_cover(
        &self,
        account: &str,
        key: Option<&str>,
        amount: Amount,
    ) -> Result<(), LedgerError> {
        check_hold(amount)?;
        let row = sqlx::query(
            "SELECT unlimited, balance - held + credit_limit AS available FROM accounts WHERE id = $1",
        )
        .bind(account)
        .fetch_optional(&self.db.pool)
        .await?
        .ok_or_else(|| LedgerError::UnknownAccount(account.to_string()))?;
        let available: Amount = row.try_get("available")?;
        if row.try_get::<i64, _>("unlimited")? == 0 && available < amount {
            return Err(LedgerError::InsufficientQuota {
                need: amount,
                available,
            });
        }
        if let Some(key) = key {
            let remaining: Option<i64> =
                sqlx::query_scalar("SELECT budget - spent - held FROM api_keys WHERE id = $1")
                    .bind(key)
                    .fetch_optional(&self.db.pool)
                    .await?
                    .flatten();
            if let Some(r) = remaining.filter(|r| *r < amount) {
                return Err(LedgerError::BudgetExceeded {
                    need: amount,
                    remaining: r,
                });
            }
        }
        Ok(())
    }

    /// Why an account refused a hold of `need`.
    async fn refusal(&self, account: &str, need: Amount) -> LedgerError {
        let row = sqlx::query(
            "SELECT balance - held + credit_limit AS available FROM accounts WHERE id = $1",
        )
        .bind(account)
        .fetch_optional(&self.db.pool)
        .await;
        match row {
            Ok(Some(r)) => LedgerError::InsufficientQuota {
                need,
                available: r.try_get("available").unwrap_or(0),
            },
            Ok(None) => LedgerError::UnknownAccount(account.to_string()),
            Err(e) => e.into(),
        }
    }

    async fn budget_refusal(&self, key: &str, need: Amount) -> LedgerError {
        let row =
            sqlx::query("SELECT budget - spent - held AS remaining FROM api_keys WHERE id = $1")
                .bind(key)
                .fetch_optional(&self.db.pool)
                .await;
        match row {
            Ok(Some(r)) => LedgerError::BudgetExceeded {
                need,
                remaining: r
                    .try_get::<Option<i64>, _>("remaining")
                    .ok()
                    .flatten()
                    .unwrap_or(0),
            },
            Ok(None) => LedgerError::UnknownAccount(format!("key {key}")),
            Err(e) => e.into(),
        }
    }
}

/// A hold is `0..=MAX_AMOUNT` (a request's worst case above that is
/// refused, not clamped).
fn check_hold(amount: Amount) -> Result<(), LedgerError> {
    if amount == 0 {
        return Ok(());
    }
    amount::check_amount("request's worst-case cost", amount)
        .map(|_| ())
        .map_err(LedgerError::InvalidAmount)
}

/// Whether a reservation was made.
pub(super) enum Reserved {
    Yes,
    NoFunds,
    OverBudget,
}

/// Reserves `amount` on the account (within balance + credit limit, unless
/// unlimited) and on the key's budget, inside `tx`; on a refusal nothing
/// stays reserved once the caller drops (rolls back) `tx`.
pub(super) async fn reserve(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    account: &str,
    key: Option<&str>,
    amount: Amount,
) -> Result<Reserved, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE accounts SET held = held + $1 WHERE id = $2 AND held + $3 <= $4 \
         AND (unlimited = 1 OR balance - held - $5 >= -credit_limit)",
    )
    .bind(amount)
    .bind(account)
    .bind(amount)
    .bind(MAX_BALANCE)
    .bind(amount)
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(Reserved::NoFunds);
    }
    if let Some(key) = key {
        let done = sqlx::query(
            "UPDATE api_keys SET held = held + $1 WHERE id = $2 \
             AND spent + held + $3 <= COALESCE(budget, $4)",
        )
        .bind(amount)
        .bind(key)
        .bind(amount)
        .bind(MAX_BALANCE)
        .execute(&mut **tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(Reserved::OverBudget);
        }
    }
    Ok(Reserved::Yes)
}

/// Inserts an open hold row.
pub(super) async fn insert_hold(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    h: &HoldRequest<'_>,
    instance: &str,
) -> Result<(), sqlx::Error> {
    let q = h.quote;
    sqlx::query(
        "INSERT INTO holds (request_id, account_id, key_id, model, provider_id, amount, \
         price_input, price_cached, price_output, fee_bps, payout_bps, instance_id, state, created_at, \
         prefill_by, decode_by, max_completion) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'open', $13, $14, $15, $16)",
    )
    .bind(h.request_id)
    .bind(h.account_id)
    .bind(h.key_id)
    .bind(&q.model)
    .bind(&q.provider_id)
    .bind(h.amount)
    .bind(q.prices.input)
    .bind(q.prices.cached_input)
    .bind(q.prices.output)
    .bind(q.fee_bps)
    .bind(q.payout_bps)
    .bind(instance)
    .bind(now())
    .bind(&q.stages.prefill)
    .bind(&q.stages.decode)
    .bind(h.max_completion.map(|m| i64::try_from(m).unwrap_or(i64::MAX)))
    .execute(&mut **tx)
    .await?;
    Ok(())
}
