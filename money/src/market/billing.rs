//! The market's money: what a bid must hold (its worst case, capacity x
//! price x time), what a fill costs, and the ledger calls that hold,
//! trade and release. Fills are billed after the book and its store have
//! changed; a fill the ledger refuses is logged loudly and left unbilled
//! (the book never waits on money it cannot take).

use super::MarketError;
use super::book::{Fill, Order, Side};
use crate::ledger::amount::{self, Amount};
use crate::ledger::orders::TradeMoney;
use crate::ledger::{Ledger, LedgerError};

/// The most a bid can cost: its whole quantity at its price until it
/// expires (at least one second).
pub fn bid_worst_case(o: &Order, now: i64) -> Result<Amount, MarketError> {
    amount::capacity_cost(o.price, o.quantity, (o.expires_at - now).max(1))
        .filter(|c| *c <= amount::MAX_AMOUNT)
        .ok_or_else(|| {
            MarketError::Invalid(
                "quantity",
                format!(
                    "this bid could cost more than {} (quantity x price x time); post a smaller one",
                    amount::show_units(amount::MAX_AMOUNT)
                ),
            )
        })
}

/// What a fill costs: its quantity at its price until the traded
/// capacity ends (at least one second).
pub fn fill_cost(f: &Fill, now: i64) -> Amount {
    amount::capacity_cost(f.price, f.quantity, (f.terms.until - now).max(1))
        .unwrap_or(amount::MAX_AMOUNT)
}

/// Bills each fill, then releases the holds of bids that ended: the
/// incoming order if it is a bid that does not rest, bids filled to the
/// end, and expired bids met on the way.
pub async fn settle(
    ledger: &Ledger,
    fee_bps: i64,
    placed: &Order,
    rests: bool,
    fills: &[Fill],
    expired: &[Order],
    now: i64,
) {
    let mut ended: Vec<&str> = Vec::new();
    for f in fills {
        let trade_id = format!("{}:{}", f.bid_id, f.ask_id);
        let t = TradeMoney {
            trade_id: &trade_id,
            bid_id: &f.bid_id,
            bidder: &f.terms.bidder,
            seller: &f.terms.seller,
            quantity: f.quantity,
            bid_remaining: f.terms.bid_remaining,
            cost: fill_cost(f, now),
            fee_bps,
        };
        bill(ledger, &t).await;
        if f.quantity == f.terms.bid_remaining {
            ended.push(&f.bid_id);
        }
    }
    if placed.side == Side::Bid && !rests {
        ended.push(&placed.id);
    }
    ended.extend(
        expired
            .iter()
            .filter(|o| o.side == Side::Bid)
            .map(|o| o.id.as_str()),
    );
    ended.sort_unstable();
    ended.dedup();
    for id in ended {
        release(ledger, id).await;
    }
}

/// Bills one fill, retrying a database failure a few times; a fill that
/// still fails is logged loudly (the seller goes unpaid for it).
async fn bill(ledger: &Ledger, t: &TradeMoney<'_>) {
    for attempt in 1..=4u64 {
        match ledger.trade(t).await {
            Ok(_) => return,
            Err(LedgerError::Sql(e)) if attempt < 4 => {
                tracing::warn!(trade = t.trade_id, error = %e, attempt, "fill billing failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(20 * attempt)).await;
            }
            Err(e) => {
                tracing::error!(trade = t.trade_id, error = %e, "fill not billed");
                return;
            }
        }
    }
}

/// Releases a bid's hold (logged, never fatal: recovery at start-up
/// releases what is left).
pub async fn release(ledger: &Ledger, order_id: &str) {
    if let Err(e) = ledger.release_order(order_id).await {
        tracing::error!(order = order_id, error = %e, "bid hold not released");
    }
}
