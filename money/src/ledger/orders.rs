//! Money behind spot-market bids: a bid reserves its worst case as a hold
//! (instance `market`, so a server restart's recovery never touches it;
//! the market releases it when the bid ends), and each fill moves money
//! from the bidder to the seller and the treasury as one `trade` journal
//! transaction, taking its share out of that hold. Nothing here knows the
//! order book: the market passes amounts in.

use sqlx::Row;

use super::amount::{self, Amount, Prices, Quote, Stages};
use super::holds::HoldRequest;
use super::{HOUSE_PROVIDER, Ledger, LedgerError, TREASURY};
use crate::store::now;

/// The instance id of order holds (never a server's, never recovered).
pub const MARKET_INSTANCE: &str = "market";

/// The hold id of an order.
pub fn hold_id(order_id: &str) -> String {
    format!("order:{order_id}")
}

/// One fill, as money: the bidder pays `cost` (at most the fill's share
/// of its bid's hold: `quantity / bid_remaining` of what the hold still
/// has, all of it for the bid's last fill); the seller gets the cost less
/// the protocol fee.
#[derive(Debug, Clone)]
pub struct TradeMoney<'a> {
    pub trade_id: &'a str,
    pub bid_id: &'a str,
    pub bidder: &'a str,
    pub seller: &'a str,
    pub quantity: u64,
    /// The bid's remaining quantity before this fill.
    pub bid_remaining: u64,
    pub cost: Amount,
    pub fee_bps: i64,
}

impl Ledger {
    /// Reserves a bid's worst case (`0 < amount <= MAX_AMOUNT`) on the
    /// bidder's account and key budget, refused exactly as a request's
    /// hold is.
    pub async fn hold_order(
        &self,
        order_id: &str,
        account: &str,
        key: Option<&str>,
        amount: Amount,
    ) -> Result<(), LedgerError> {
        amount::check_amount("bid's worst-case cost", amount)
            .map_err(LedgerError::InvalidAmount)?;
        let id = hold_id(order_id);
        let quote = Quote {
            provider_id: HOUSE_PROVIDER.into(),
            model: "market".into(),
            prices: Prices {
                input: 0,
                cached_input: 0,
                output: 0,
            },
            fee_bps: 0,
            payout_bps: 0,
            stages: Stages::default(),
        };
        let h = HoldRequest {
            request_id: &id,
            account_id: account,
            key_id: key,
            quote: &quote,
            amount,
            max_completion: None,
        };
        self.hold_for(h, MARKET_INSTANCE).await
    }

    /// Moves one fill's money in one transaction; returns what the
    /// bidder paid. Refused (nothing written) unless the bid's hold is
    /// open; the cost is capped at the fill's share of the hold.
    pub async fn trade(&self, t: &TradeMoney<'_>) -> Result<Amount, LedgerError> {
        if t.cost < 0 || t.quantity == 0 || t.quantity > t.bid_remaining {
            return Err(LedgerError::InvalidAmount(format!(
                "not a fill: cost {}, quantity {} of {}",
                t.cost, t.quantity, t.bid_remaining
            )));
        }
        let hold = hold_id(t.bid_id);
        let mut tx = self.db.pool.begin().await?;
        // A write first, so SQLite takes its write lock now (a read first
        // could not upgrade if another writer committed meanwhile).
        let row = sqlx::query(
            "UPDATE holds SET amount = amount WHERE request_id = $1 AND state = 'open' \
             RETURNING amount, key_id",
        )
        .bind(&hold)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| {
            LedgerError::InvalidAmount(format!("bid `{}` has no open hold", t.bid_id))
        })?;
        let held: Amount = row.try_get("amount")?;
        let key: Option<String> = row.try_get("key_id")?;
        let portion = if t.quantity == t.bid_remaining {
            held
        } else {
            let share = i128::from(held) * i128::from(t.quantity);
            let whole = i128::from(t.bid_remaining);
            i64::try_from((share + whole - 1) / whole)
                .unwrap_or(held)
                .min(held)
        };
        let cost = t.cost.min(portion);
        // The condition on `amount` makes a concurrent change a refusal.
        let done = sqlx::query(
            "UPDATE holds SET amount = amount - $1, spent = spent + $2 WHERE request_id = $3 \
             AND state = 'open' AND amount = $4",
        )
        .bind(portion)
        .bind(cost)
        .bind(&hold)
        .bind(held)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(LedgerError::InvalidAmount(format!(
                "the hold of bid `{}` changed meanwhile",
                t.bid_id
            )));
        }
        let split = amount::split_fee(cost, t.fee_bps);
        let mut moves = vec![
            (t.bidder, -cost, -portion),
            (t.seller, split.provider, 0),
            (TREASURY, split.treasury, 0),
        ];
        moves.sort_unstable();
        for (id, balance, held) in moves {
            sqlx::query(
                "UPDATE accounts SET balance = balance + $1, held = held + $2 WHERE id = $3",
            )
            .bind(balance)
            .bind(held)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        if let Some(key) = &key {
            // The key's budget moves like the account: held down, spent up.
            sqlx::query("UPDATE api_keys SET held = held - $1, spent = spent + $2 WHERE id = $3")
                .bind(portion)
                .bind(cost)
                .bind(key)
                .execute(&mut *tx)
                .await?;
        }
        if cost > 0 {
            insert_trade_journal(&mut tx, t, split).await?;
        }
        tx.commit().await?;
        Ok(cost)
    }

    /// Releases what is left of a bid's hold (the bid is filled, cancelled
    /// or expired); a second release does nothing.
    pub async fn release_order(&self, order_id: &str) -> Result<(), LedgerError> {
        self.release(&hold_id(order_id)).await.map(|_| ())
    }

    /// Ids of the orders whose holds are open.
    pub async fn held_orders(&self) -> Result<Vec<String>, LedgerError> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT request_id FROM holds WHERE state = 'open' AND instance_id = $1",
        )
        .bind(MARKET_INSTANCE)
        .fetch_all(&self.db.pool)
        .await?;
        Ok(ids
            .into_iter()
            .filter_map(|i| i.strip_prefix("order:").map(str::to_string))
            .collect())
    }
}

async fn insert_trade_journal(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    t: &TradeMoney<'_>,
    split: amount::Split,
) -> Result<(), sqlx::Error> {
    let tx_id = format!("trade:{}", t.trade_id);
    sqlx::query(
        "INSERT INTO journal (id, kind, ref, memo, created_at) VALUES ($1, 'trade', $2, '', $3)",
    )
    .bind(&tx_id)
    .bind(&tx_id)
    .bind(now())
    .execute(&mut **tx)
    .await?;
    // The seller and the treasury may be one account only in tests; sum
    // per account so the primary key holds.
    let mut entries: Vec<(&str, Amount)> = Vec::new();
    for (acct, amount) in [
        (t.bidder, -split.cost),
        (t.seller, split.provider),
        (TREASURY, split.treasury),
    ] {
        match entries.iter_mut().find(|e| e.0 == acct) {
            Some(e) => e.1 += amount,
            None => entries.push((acct, amount)),
        }
    }
    for (acct, amount) in entries.into_iter().filter(|e| e.1 != 0) {
        sqlx::query("INSERT INTO entries (tx_id, account_id, amount) VALUES ($1, $2, $3)")
            .bind(&tx_id)
            .bind(acct)
            .bind(amount)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}
