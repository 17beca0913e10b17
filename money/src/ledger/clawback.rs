//! Clawbacks: what a provider was paid for an attempt that failed a spot
//! check goes back to the treasury and its user is refunded, once per
//! attempt. The pay is the attempt's share of what the user paid, by the
//! settlement's own rule (`settle::payees`), and it lands when the request
//! settles: a clawback decided before that awaits the settlement (the
//! writer signals each committed batch), never a polling loop.

use std::time::Duration;

use super::accounts::{AccountKind, apply_move};
use super::amount::{self, Amount, Quote};
use super::settle::{Work, payees};
use super::{Ledger, LedgerError, TREASURY};
use crate::store::now;

/// The longest a clawback waits for its request to settle before it
/// claws what was paid by then.
pub const SETTLEMENT_WAIT: Duration = Duration::from_secs(60);

/// One attempt's pay to take back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clawback {
    /// Once per key (the request, job and attempt).
    pub key: String,
    /// The request the attempt served (its settlement pays the provider).
    pub request_id: String,
    /// The account that paid for the request: refunded what it paid for
    /// the attempt's work when `refundable` (not prepaid capacity).
    pub payer: String,
    pub refundable: bool,
    /// The protocol fee the request was billed at.
    pub fee_bps: i64,
    /// The attempt's accepted work: its provider, prices and the server's
    /// counts of its tokens.
    pub work: Work,
    pub memo: String,
}

impl Clawback {
    /// What the user paid for the work, and the provider's pay for it.
    pub fn amounts(&self) -> (Amount, Amount) {
        let quote = Quote {
            provider_id: self.work.provider.clone(),
            model: String::new(),
            prices: self.work.prices,
            fee_bps: self.fee_bps,
            payout_bps: self.work.payout_bps,
            stages: Default::default(),
        };
        let cost = quote.cost(self.work.tokens).max(0);
        let pay = payees(self.fee_bps, cost, std::slice::from_ref(&self.work))
            .iter()
            .map(|p| p.1)
            .sum();
        (cost, pay)
    }
}

impl Ledger {
    /// Waits until `request_id` is settled (its usage recorded), at most
    /// `within`; whether it was.
    pub async fn settled(&self, request_id: &str, within: Duration) -> bool {
        // Subscribed before looking: a commit after the look wakes it.
        let mut commits = self.settled.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if matches!(self.usage_of(request_id).await, Ok(Some(_))) {
                return true;
            }
            match tokio::time::timeout_at(deadline, commits.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }

    /// Claws back `c` once its request has settled (or after `within`):
    /// the attempt's pay from its provider, and the user's money for it
    /// when refundable. Answers the journal transaction and the amount
    /// clawed (`None`: already done).
    pub async fn claw_back(
        &self,
        c: &Clawback,
        within: Duration,
    ) -> Result<Option<(String, Amount)>, LedgerError> {
        if !self.settled(&c.request_id, within).await {
            tracing::warn!(request_id = %c.request_id, "clawing back before the request settled");
        }
        let (cost, pay) = c.amounts();
        let refund = if c.refundable { cost } else { 0 };
        self.clawback(&c.key, &c.work.provider, &c.payer, pay, refund, &c.memo)
            .await
    }

    /// Claws back what a provider was paid for work that failed a spot
    /// check and refunds its user, once per `key` (a repeat does nothing
    /// and answers `None`): `pay` from the provider to the treasury, at
    /// most what the provider has available (the treasury bears the
    /// rest), and `refund` from the treasury to `payer`. One journal
    /// transaction of kind `clawback`; answers it and the amount clawed.
    pub async fn clawback(
        &self,
        key: &str,
        provider_id: &str,
        payer: &str,
        pay: Amount,
        refund: Amount,
        memo: &str,
    ) -> Result<Option<(String, Amount)>, LedgerError> {
        for a in [pay, refund].into_iter().filter(|&a| a != 0) {
            amount::check_amount("clawback", a).map_err(LedgerError::InvalidAmount)?;
        }
        let p = self.account(provider_id).await?;
        if p.kind != AccountKind::Provider.as_str() {
            return Err(LedgerError::WrongAccount(format!(
                "clawbacks apply to provider accounts, not `{provider_id}`"
            )));
        }
        let pay = pay.min(p.available().max(0));
        self.account(payer).await?;
        let mut tx = self.db.pool.begin().await?;
        let tx_id = format!("clawback:{key}");
        let fresh = sqlx::query(
            "INSERT INTO journal (id, kind, memo, created_at) VALUES ($1, 'clawback', $2, $3) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&tx_id)
        .bind(memo)
        .bind(now())
        .execute(&mut *tx)
        .await?;
        if fresh.rows_affected() == 0 {
            return Ok(None);
        }
        let mut moves = [
            (provider_id, -pay),
            (TREASURY, pay - refund),
            (payer, refund),
        ];
        moves.sort();
        for (id, delta) in moves.into_iter().filter(|m| m.1 != 0) {
            if !apply_move(&mut tx, id, delta).await? {
                drop(tx);
                return Err(self.transfer_refusal(id, delta).await);
            }
            sqlx::query("INSERT INTO entries (tx_id, account_id, amount) VALUES ($1, $2, $3)")
                .bind(&tx_id)
                .bind(id)
                .bind(delta)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some((tx_id, pay)))
    }
}
