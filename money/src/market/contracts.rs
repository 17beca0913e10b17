//! Capacity bought on the book. A fill is a contract: its bidder paid
//! the seller for `quantity` tokens a second until `until` at the trade
//! price (`money`), so the bidder's requests on that instrument run on it,
//! prepaid at the trade price, while the contract has room: a token
//! bucket refilled at `quantity` a second and holding at most `BURST_S`
//! seconds of it. A request that does not fit pays the spot price.
//! Buckets refill by a clock in seconds: the process's monotonic one, or
//! the simulator's virtual one (`cover_at`).

use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;

use crate::ledger::amount::Amount;

/// Seconds of capacity a contract can bank.
pub const BURST_S: u64 = 10;

/// A fill, as the capacity it bought.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Contract {
    /// `<bid id>:<ask id>`.
    pub trade_id: String,
    pub instrument: String,
    pub bidder: String,
    pub seller: String,
    /// Per million tokens.
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub price: Amount,
    /// Tokens per second.
    pub quantity: u64,
    /// Unix seconds.
    pub until: i64,
    /// Tokens it can cover now.
    pub room: u64,
    #[serde(skip)]
    #[schema(ignore)]
    level: f64,
    #[serde(skip)]
    #[schema(ignore)]
    refilled: Option<f64>,
}

/// Seconds on the process's monotonic clock.
fn clock() -> f64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// A request covered by a contract: it runs at the trade price on the
/// seller's capacity, already paid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cover {
    pub trade_id: String,
    pub seller: String,
    pub price: Amount,
}

impl Contract {
    pub fn new(
        trade_id: String,
        instrument: String,
        parties: (String, String),
        price: Amount,
        quantity: u64,
        until: i64,
    ) -> Self {
        let (bidder, seller) = parties;
        Self {
            trade_id,
            instrument,
            bidder,
            seller,
            price,
            quantity,
            until,
            room: 0,
            level: (quantity.saturating_mul(BURST_S)) as f64,
            refilled: None,
        }
    }

    fn capacity(&self) -> f64 {
        self.quantity.saturating_mul(BURST_S) as f64
    }

    /// Refills the bucket for the time since it was last looked at.
    fn refill(&mut self, at: f64) {
        if let Some(last) = self.refilled {
            let secs = (at - last).max(0.0);
            self.level = (self.level + secs * self.quantity as f64).min(self.capacity());
        }
        self.refilled = Some(at);
        self.room = self.level as u64;
    }
}

/// Every live contract.
#[derive(Debug, Default)]
pub struct Contracts(Vec<Contract>);

impl Contracts {
    pub fn add(&mut self, c: Contract) {
        self.0.push(c);
    }

    /// Covers `tokens` of a request by `account` on `instrument` at unix
    /// time `now` (its worst case: prompt and `max_tokens`) from the first
    /// of its live contracts with room whose seller `can_serve`; drops
    /// contracts that ended.
    pub fn cover(
        &mut self,
        account: &str,
        instrument: &str,
        tokens: u64,
        now: i64,
        can_serve: impl Fn(&str) -> bool,
    ) -> Option<Cover> {
        self.cover_at(account, instrument, tokens, (now, clock()), can_serve)
    }

    /// `cover` with the buckets' clock `at` (seconds) given: the
    /// simulator's virtual time.
    pub fn cover_at(
        &mut self,
        account: &str,
        instrument: &str,
        tokens: u64,
        (now, at): (i64, f64),
        can_serve: impl Fn(&str) -> bool,
    ) -> Option<Cover> {
        self.0.retain(|c| c.until > now);
        let mut fits = self
            .0
            .iter_mut()
            .filter(|c| c.bidder == account && c.instrument == instrument)
            .filter(|c| can_serve(&c.seller));
        let c = fits.find_map(|c| {
            c.refill(at);
            (c.level >= tokens as f64).then_some(c)
        })?;
        c.level -= tokens as f64;
        c.room = c.level as u64;
        Some(Cover {
            trade_id: c.trade_id.clone(),
            seller: c.seller.clone(),
            price: c.price,
        })
    }

    /// The live contracts of `account` on `instrument` whose seller
    /// `can_serve`, in the order they were bought (their buckets are
    /// elsewhere: a shared database).
    pub fn candidates(
        &mut self,
        account: &str,
        instrument: &str,
        now: i64,
        can_serve: impl Fn(&str) -> bool,
    ) -> Vec<Contract> {
        self.0.retain(|c| c.until > now);
        self.0
            .iter()
            .filter(|c| c.bidder == account && c.instrument == instrument)
            .filter(|c| can_serve(&c.seller))
            .cloned()
            .collect()
    }

    /// Takes in contracts read from the database: new ones are added,
    /// known ones keep their bucket.
    pub fn merge(&mut self, fresh: Vec<Contract>) {
        for c in fresh {
            if !self.0.iter().any(|k| k.trade_id == c.trade_id) {
                self.0.push(c);
            }
        }
    }

    /// The live contracts of `account` (all, without one).
    pub fn of(&mut self, account: Option<&str>, now: i64) -> Vec<Contract> {
        self.0.retain(|c| c.until > now);
        let at = clock();
        self.0
            .iter_mut()
            .filter(|c| account.is_none_or(|a| a == c.bidder))
            .map(|c| {
                c.refill(at);
                c.clone()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(bidder: &str, quantity: u64, until: i64) -> Contract {
        Contract::new(
            format!("b:{bidder}"),
            "m".into(),
            (bidder.into(), "seller".into()),
            500,
            quantity,
            until,
        )
    }

    #[test]
    fn a_contract_covers_its_bidders_requests_up_to_its_rate_until_it_ends() {
        let mut cs = Contracts::default();
        cs.add(contract("u", 10, 1_000));
        let yes = |_: &str| true;
        // Ten seconds of 10 tok/s banked: 100 tokens, then no more.
        assert!(cs.cover("u", "m", 60, 0, yes).is_some());
        let c = cs.cover("u", "m", 40, 0, yes).expect("cover");
        assert_eq!((c.seller.as_str(), c.price), ("seller", 500));
        assert!(cs.cover("u", "m", 5, 0, yes).is_none(), "empty");
        // On a clock of its own (the simulator's), five seconds later: 50
        // tokens refilled at 10 a second.
        let later = (0, clock() + 5.0);
        assert!(cs.cover_at("u", "m", 50, later, yes).is_some());
        assert!(cs.cover_at("u", "m", 5, later, yes).is_none());
        // Another account, instrument, or a seller that cannot serve: no.
        cs.add(contract("v", 10, 1_000));
        assert!(cs.cover("u", "m", 1, 0, yes).is_none());
        assert!(cs.cover("v", "other", 1, 0, yes).is_none());
        assert!(cs.cover("v", "m", 1, 0, |_| false).is_none());
        assert!(cs.cover("v", "m", 1, 0, yes).is_some());
        // Ended contracts cover nothing and are dropped.
        assert!(cs.cover("v", "m", 1, 1_000, yes).is_none());
        assert!(cs.of(None, 1_000).is_empty());
    }

    #[test]
    fn the_bucket_refills_at_the_contract_rate() {
        let mut c = contract("u", 1_000, 10);
        let t0 = 100.0;
        c.refill(t0);
        c.level = 0.0;
        c.refill(t0 + 0.5);
        assert!((c.level - 500.0).abs() < 1.0, "{}", c.level);
        c.refill(t0 + 60.0);
        assert_eq!(c.level, c.capacity(), "at most BURST_S seconds banked");
    }
}
