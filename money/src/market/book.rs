//! One instrument's order book, in memory: bids (highest price first, then
//! higher priority, then earlier) and asks (lowest price first, then
//! earlier). An incoming order matches the opposite side while prices
//! cross, at the resting order's price, with partial fills; what is left
//! rests until it is filled, cancelled or expires. Expired resting orders
//! are skipped (and removed) when met, and swept by `expire`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::ledger::amount::Amount;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Bid,
    Ask,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bid => "bid",
            Self::Ask => "ask",
        }
    }
}

/// An order as the book keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Order {
    pub id: String,
    pub side: Side,
    pub account_id: String,
    /// Limit price per million tokens (the most a bid pays, the least an
    /// ask takes).
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub price: Amount,
    /// Capacity in tokens per second.
    pub quantity: u64,
    pub remaining: u64,
    /// Among bids at one price, higher priority matches first.
    pub priority: i64,
    /// Preemptible capacity (asks).
    pub interruptible: bool,
    /// Unix seconds after which the order no longer matches.
    pub expires_at: i64,
}

/// One match between a bid and an ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Fill {
    pub bid_id: String,
    pub ask_id: String,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub price: Amount,
    pub quantity: u64,
    /// What the money side needs (not part of the answer): the two
    /// accounts, the bid's remaining quantity before this fill, and when
    /// the traded capacity ends (the earlier expiry of the two orders).
    #[serde(skip)]
    #[schema(ignore)]
    pub terms: FillTerms,
}

/// The parties and extent of a fill.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FillTerms {
    pub bidder: String,
    pub seller: String,
    pub bid_remaining: u64,
    pub until: i64,
}

/// Where a resting order sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Bid(BidKey),
    Ask(AskKey),
}

type BidKey = (Reverse<Amount>, Reverse<i64>, u64);
type AskKey = (Amount, u64);

/// Aggregated quantity at one price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Level {
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub price: Amount,
    pub quantity: u64,
    pub orders: usize,
}

#[derive(Debug, Default)]
pub struct Book {
    bids: BTreeMap<BidKey, Order>,
    asks: BTreeMap<AskKey, Order>,
    index: HashMap<String, Slot>,
    seq: u64,
    last_price: Option<Amount>,
}

impl Book {
    /// Matches `order` (at `now`) and rests what is left; returns the fills
    /// and the expired resting orders it removed on the way.
    pub fn submit(&mut self, mut order: Order, now: i64) -> (Vec<Fill>, Vec<Order>) {
        let mut fills = Vec::new();
        let mut expired = Vec::new();
        while order.remaining > 0 {
            let Some(mut best) = self.pop_best(order.side, &order, now, &mut expired) else {
                break;
            };
            let q = order.remaining.min(best.remaining);
            let (bid, ask) = match order.side {
                Side::Bid => (&order, &best),
                Side::Ask => (&best, &order),
            };
            fills.push(Fill {
                bid_id: bid.id.clone(),
                ask_id: ask.id.clone(),
                price: best.price,
                quantity: q,
                terms: FillTerms {
                    bidder: bid.account_id.clone(),
                    seller: ask.account_id.clone(),
                    bid_remaining: bid.remaining,
                    until: bid.expires_at.min(ask.expires_at),
                },
            });
            order.remaining -= q;
            best.remaining -= q;
            self.last_price = Some(best.price);
            if best.remaining > 0 {
                self.rest(best);
            }
        }
        if order.remaining > 0 && order.expires_at > now {
            self.rest(order);
        }
        (fills, expired)
    }

    /// The best opposite order crossing `incoming`, removed from the book;
    /// expired ones met on the way are removed into `expired`.
    fn pop_best(
        &mut self,
        side: Side,
        incoming: &Order,
        now: i64,
        expired: &mut Vec<Order>,
    ) -> Option<Order> {
        loop {
            let best = match side {
                Side::Bid => self
                    .asks
                    .first_entry()
                    .filter(|e| e.get().price <= incoming.price)?
                    .remove(),
                Side::Ask => self
                    .bids
                    .first_entry()
                    .filter(|e| e.get().price >= incoming.price)?
                    .remove(),
            };
            self.index.remove(&best.id);
            if best.expires_at > now {
                return Some(best);
            }
            expired.push(best);
        }
    }

    fn rest(&mut self, order: Order) {
        self.seq += 1;
        let slot = match order.side {
            Side::Bid => Slot::Bid((Reverse(order.price), Reverse(order.priority), self.seq)),
            Side::Ask => Slot::Ask((order.price, self.seq)),
        };
        self.index.insert(order.id.clone(), slot);
        match slot {
            Slot::Bid(k) => self.bids.insert(k, order),
            Slot::Ask(k) => self.asks.insert(k, order),
        };
    }

    /// Restores a resting order (loading the book); no matching.
    pub fn restore(&mut self, order: Order) {
        self.rest(order);
    }

    /// Removes a resting order.
    pub fn cancel(&mut self, id: &str) -> Option<Order> {
        match self.index.remove(id)? {
            Slot::Bid(k) => self.bids.remove(&k),
            Slot::Ask(k) => self.asks.remove(&k),
        }
    }

    pub fn get(&self, id: &str) -> Option<&Order> {
        match self.index.get(id)? {
            Slot::Bid(k) => self.bids.get(k),
            Slot::Ask(k) => self.asks.get(k),
        }
    }

    /// The resting bids.
    pub fn resting_bids(&self) -> impl Iterator<Item = Order> + '_ {
        self.bids.values().cloned()
    }

    /// Every resting order: bids best first, then asks best first.
    pub fn resting(&self) -> Vec<Order> {
        self.bids
            .values()
            .chain(self.asks.values())
            .cloned()
            .collect()
    }

    /// Ids of every resting order.
    pub fn order_ids(&self) -> impl Iterator<Item = String> + '_ {
        self.index.keys().cloned()
    }

    /// Ids of the resting orders of `account`.
    pub fn orders_of(&self, account: &str) -> Vec<String> {
        self.bids
            .values()
            .chain(self.asks.values())
            .filter(|o| o.account_id == account)
            .map(|o| o.id.clone())
            .collect()
    }

    /// Removes every order expired at `now`.
    pub fn expire(&mut self, now: i64) -> Vec<Order> {
        let ids: Vec<String> = self
            .bids
            .values()
            .chain(self.asks.values())
            .filter(|o| o.expires_at <= now)
            .map(|o| o.id.clone())
            .collect();
        ids.iter().filter_map(|id| self.cancel(id)).collect()
    }

    pub fn best_bid(&self) -> Option<Amount> {
        self.bids.values().next().map(|o| o.price)
    }

    pub fn best_ask(&self) -> Option<Amount> {
        self.asks.values().next().map(|o| o.price)
    }

    pub fn last_price(&self) -> Option<Amount> {
        self.last_price
    }

    pub fn set_last_price(&mut self, p: Option<Amount>) {
        self.last_price = p;
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The best `n` price levels of each side: (bids, asks).
    pub fn depth(&self, n: usize) -> (Vec<Level>, Vec<Level>) {
        (levels(self.bids.values(), n), levels(self.asks.values(), n))
    }

    /// The book's invariants: not crossed, every resting order live and
    /// indexed where it sits. An error names the first broken one.
    pub fn check(&self) -> Result<(), String> {
        if let (Some(b), Some(a)) = (self.best_bid(), self.best_ask())
            && b >= a
        {
            return Err(format!("crossed book: bid {b} >= ask {a}"));
        }
        if self.index.len() != self.bids.len() + self.asks.len() {
            return Err("index size differs from the book".into());
        }
        let sides = self.bids.iter().map(|(k, o)| (Slot::Bid(*k), o));
        for (slot, o) in sides.chain(self.asks.iter().map(|(k, o)| (Slot::Ask(*k), o))) {
            if self.index.get(&o.id) != Some(&slot) {
                return Err(format!("order {} is not indexed where it sits", o.id));
            }
            if o.remaining == 0 || o.remaining > o.quantity {
                return Err(format!("order {} has remaining {}", o.id, o.remaining));
            }
        }
        Ok(())
    }
}

fn levels<'a>(orders: impl Iterator<Item = &'a Order>, n: usize) -> Vec<Level> {
    let mut out: Vec<Level> = Vec::new();
    for o in orders {
        if let Some(l) = out.last_mut().filter(|l| l.price == o.price) {
            l.quantity += o.remaining;
            l.orders += 1;
        } else if out.len() == n {
            break;
        } else {
            out.push(Level {
                price: o.price,
                quantity: o.remaining,
                orders: 1,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn order(id: &str, side: Side, price: Amount, qty: u64) -> Order {
        Order {
            id: id.into(),
            side,
            account_id: "a".into(),
            price,
            quantity: qty,
            remaining: qty,
            priority: 0,
            interruptible: false,
            expires_at: 1_000,
        }
    }

    #[test]
    fn price_then_time_priority_with_partial_fills() {
        let mut b = Book::default();
        b.submit(order("a1", Side::Ask, 110, 5), 0);
        b.submit(order("a2", Side::Ask, 100, 5), 0);
        b.submit(order("a3", Side::Ask, 100, 5), 0);
        let (fills, _) = b.submit(order("b1", Side::Bid, 105, 8), 0);
        let got: Vec<_> = fills
            .iter()
            .map(|f| (f.ask_id.as_str(), f.price, f.quantity))
            .collect();
        assert_eq!(got, [("a2", 100, 5), ("a3", 100, 3)]);
        assert_eq!(b.get("a3").map(|o| o.remaining), Some(2));
        assert_eq!(
            (b.best_bid(), b.best_ask(), b.last_price()),
            (None, Some(100), Some(100))
        );
        b.check().expect("consistent");
    }

    #[test]
    fn bid_priority_breaks_ties_at_one_price() {
        let mut b = Book::default();
        b.submit(order("low", Side::Bid, 100, 1), 0);
        b.submit(
            Order {
                priority: 5,
                ..order("high", Side::Bid, 100, 1)
            },
            0,
        );
        let (fills, _) = b.submit(order("ask", Side::Ask, 90, 1), 0);
        assert_eq!(fills[0].bid_id, "high");
        assert_eq!(fills[0].price, 100, "at the resting price");
    }

    #[test]
    fn cancel_and_expiry_remove_orders() {
        let mut b = Book::default();
        b.submit(
            Order {
                expires_at: 10,
                ..order("old", Side::Ask, 100, 5)
            },
            0,
        );
        b.submit(order("live", Side::Ask, 120, 5), 0);
        let (fills, expired) = b.submit(order("bid", Side::Bid, 130, 1), 20);
        assert_eq!(
            expired.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
            ["old"]
        );
        assert_eq!(fills[0].ask_id, "live");
        assert!(b.cancel("live").is_some() && b.cancel("live").is_none());
        b.submit(
            Order {
                expires_at: 30,
                ..order("soon", Side::Bid, 50, 1)
            },
            20,
        );
        assert_eq!(b.expire(30).len(), 1);
        assert!(b.is_empty());
        // An order that arrives expired never rests.
        b.submit(
            Order {
                expires_at: 5,
                ..order("late", Side::Bid, 50, 1)
            },
            20,
        );
        assert!(b.is_empty());
    }

    #[test]
    fn random_order_flow_keeps_the_book_consistent_and_conserves_quantity() {
        for seed in 0..20u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut b = Book::default();
            let mut submitted = 0u64;
            let mut filled = 0u64;
            let mut removed = 0u64;
            for i in 0..2_000 {
                let now = i / 10;
                match rng.random_range(0..10) {
                    0 if !b.is_empty() => {
                        let id = format!("o{}", rng.random_range(0..i.max(1)));
                        removed += b.cancel(&id).map_or(0, |o| o.remaining);
                    }
                    1 => removed += b.expire(now).iter().map(|o| o.remaining).sum::<u64>(),
                    _ => {
                        let side = if rng.random_bool(0.5) {
                            Side::Bid
                        } else {
                            Side::Ask
                        };
                        let qty = rng.random_range(1..50);
                        let o = Order {
                            priority: rng.random_range(0..3),
                            expires_at: now + rng.random_range(0..40),
                            ..order(&format!("o{i}"), side, rng.random_range(90..110), qty)
                        };
                        submitted += qty;
                        let arrives_expired = o.expires_at <= now;
                        let (fills, expired) = b.submit(o, now);
                        assert!(fills.iter().all(|f| f.quantity > 0));
                        let matched: u64 = fills.iter().map(|f| f.quantity).sum();
                        filled += 2 * matched;
                        if arrives_expired {
                            removed += qty - matched;
                        }
                        removed += expired.iter().map(|o| o.remaining).sum::<u64>();
                    }
                }
                b.check()
                    .unwrap_or_else(|e| panic!("seed {seed} step {i}: {e}"));
            }
            // Every unit submitted was matched, removed, or still rests.
            let resting: u64 = b
                .bids
                .values()
                .chain(b.asks.values())
                .map(|o| o.remaining)
                .sum();
            assert_eq!(filled + removed + resting, submitted, "seed {seed}");
        }
    }
}
