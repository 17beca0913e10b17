//! The spot market in the simulation, on the production order book and
//! contracts (`money::market::book::Book`, `contracts::Contracts`): each
//! provider online rests an ask on its model's book (its output price
//! from the pricing engine, its capacity in tokens a second, until it
//! goes offline); tenants that buy capacity bid each round for what
//! they expect to use at their limit price; each fill is a contract the
//! bidder prepays (`billing::fill_cost`, the fee split by
//! `amount::split_fee`), and their requests run on a contract's seller,
//! already paid for, while its bucket has room (`Contracts::cover_at`,
//! on the virtual clock).

use std::collections::BTreeMap;

use money::ledger::amount::{Amount, TICKS_PER_UNIT, split_fee};
use money::market::billing::fill_cost;
use money::market::book::{Book, Order, Side};
use money::market::contracts::{Contract, Contracts, Cover};
use serde::{Deserialize, Serialize};

/// Who buys capacity, and how (`[market]` in the fleet file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketSpec {
    /// Share of tenants that buy capacity on the books.
    pub contract_share: f64,
    /// Their limit price per million output tokens (currency units).
    pub bid_price_per_mtok: f64,
    /// Seconds between bidding rounds (each bid lasts one round).
    pub bid_every_s: f64,
    /// Capacity bought, as a multiple of the tenant's mean tokens a
    /// second on the model.
    pub bid_cover: f64,
}

/// What the market did over a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MarketReport {
    pub asks_posted: u64,
    pub bids_posted: u64,
    pub fills: u64,
    /// Tokens a second x seconds of capacity bought.
    pub capacity_bought: f64,
    /// What bidders prepaid and sellers were paid (units).
    pub prepaid: f64,
    pub sellers_paid: f64,
    pub covered_requests: u64,
    /// The last trade price per model (units per million tokens), per
    /// round: (hour, model, price).
    pub prices: Vec<(f64, String, f64)>,
}

/// The books, the contracts and the resting asks.
#[derive(Debug)]
pub struct Market {
    pub spec: MarketSpec,
    books: Vec<Book>,
    contracts: Contracts,
    /// Each provider's resting ask id.
    asks: Vec<Option<String>>,
    seq: u64,
    pub report: MarketReport,
    /// Ticks prepaid and paid to sellers (exact).
    pub prepaid: i128,
    pub sellers_paid: i128,
}

/// Money a fill moved: (bidder paid, seller paid) in ticks.
pub type Traded = (Amount, Amount);

impl Market {
    pub fn new(spec: MarketSpec, models: usize, providers: usize) -> Self {
        Self {
            spec,
            books: (0..models).map(|_| Book::default()).collect(),
            contracts: Contracts::default(),
            asks: vec![None; providers],
            seq: 0,
            report: MarketReport::default(),
            prepaid: 0,
            sellers_paid: 0,
        }
    }

    /// A new order of `account` on `side`: `quantity` tokens a second at
    /// `price` until `until`.
    fn new_order(
        &mut self,
        side: Side,
        account: &str,
        (price, quantity): (Amount, u64),
        until: i64,
    ) -> Order {
        self.seq += 1;
        Order {
            id: format!("{}-{}", side.as_str(), self.seq),
            side,
            account_id: account.to_string(),
            price,
            quantity: quantity.max(1),
            remaining: quantity.max(1),
            priority: 0,
            interruptible: false,
            expires_at: until,
        }
    }

    /// Rests provider `p`'s ask on `model`'s book: `price` per million
    /// output tokens for `quantity` tokens a second until `until`.
    pub fn ask(
        &mut self,
        p: usize,
        account: &str,
        model: usize,
        (price, quantity): (Amount, u64),
        (now, until): (i64, i64),
    ) {
        self.withdraw(p, model);
        let order = self.new_order(Side::Ask, account, (price, quantity), until);
        self.asks[p] = Some(order.id.clone());
        self.report.asks_posted += 1;
        // Resting bids are swept each round, so an ask never meets one.
        let _ = self.books[model].submit(order, now);
    }

    /// Takes provider `p`'s ask off `model`'s book.
    pub fn withdraw(&mut self, p: usize, model: usize) {
        if let Some(id) = self.asks[p].take() {
            self.books[model].cancel(&id);
        }
    }

    /// A tenant's bid for `quantity` tokens a second on `model` (named
    /// `instrument`) until `until`; its fills become contracts. Returns
    /// the money each fill moved.
    pub fn bid(
        &mut self,
        tenant: &str,
        (model, instrument): (usize, &str),
        quantity: u64,
        (now, until): (i64, i64),
        fee_bps: i64,
    ) -> Vec<Traded> {
        let price = (self.spec.bid_price_per_mtok * TICKS_PER_UNIT as f64) as Amount;
        let order = self.new_order(Side::Bid, tenant, (price, quantity), until);
        let id = order.id.clone();
        self.report.bids_posted += 1;
        let (fills, _) = self.books[model].submit(order, now);
        // What is not filled now is not wanted later: a round's bid.
        self.books[model].cancel(&id);
        let mut moved = Vec::new();
        for f in fills {
            let cost = fill_cost(&f, now);
            let seller = split_fee(cost, fee_bps).provider;
            self.report.fills += 1;
            self.report.capacity_bought += f.quantity as f64 * (f.terms.until - now).max(1) as f64;
            self.prepaid += i128::from(cost);
            self.sellers_paid += i128::from(seller);
            self.contracts.add(Contract::new(
                format!("{}:{}", f.bid_id, f.ask_id),
                instrument.to_string(),
                (f.terms.bidder.clone(), f.terms.seller.clone()),
                f.price,
                f.quantity,
                f.terms.until,
            ));
            moved.push((cost, seller));
        }
        moved
    }

    /// Covers a request of `tenant` on `instrument` of `tokens` (at worst)
    /// from its contracts at virtual second `now`: the seller's account.
    pub fn cover(
        &mut self,
        tenant: &str,
        instrument: &str,
        tokens: u64,
        now: f64,
        can_serve: impl Fn(&str) -> bool,
    ) -> Option<Cover> {
        let c =
            self.contracts
                .cover_at(tenant, instrument, tokens, (now as i64, now), can_serve)?;
        self.report.covered_requests += 1;
        Some(c)
    }

    /// Records each book's last trade price at `hour`.
    pub fn record_prices(&mut self, hour: f64, names: &[String]) {
        for (b, name) in self.books.iter().zip(names) {
            if let Some(p) = b.last_price() {
                let units = p as f64 / TICKS_PER_UNIT as f64;
                self.report.prices.push((hour, name.clone(), units));
            }
        }
    }

    /// The report, its money in units.
    pub fn finish(mut self) -> MarketReport {
        self.report.prepaid = self.prepaid as f64 / TICKS_PER_UNIT as f64;
        self.report.sellers_paid = self.sellers_paid as f64 / TICKS_PER_UNIT as f64;
        self.report
    }
}

/// Each contract tenant's mean tokens a second per model over `trace`,
/// and its largest request: what it bids for (the mean times
/// `bid_cover`, and at least enough for its largest request to fit a
/// full bucket).
pub fn demand(
    trace: &[crate::workload::Request],
    tenants: &[String],
) -> BTreeMap<(String, String), (f64, u64)> {
    let span = trace.last().map_or(1.0, |r| r.at_s.max(1.0));
    let wanted: std::collections::HashSet<&String> = tenants.iter().collect();
    let mut tokens: BTreeMap<(String, String), (f64, u64)> = BTreeMap::new();
    for r in trace.iter().filter(|r| wanted.contains(&r.tenant)) {
        let t = tokens
            .entry((r.tenant.clone(), r.model.clone()))
            .or_default();
        let n = u64::from(r.prompt_tokens + r.output_tokens);
        t.0 += n as f64;
        t.1 = t.1.max(n);
    }
    tokens
        .into_iter()
        .map(|(k, (t, largest))| (k, (t / span, largest)))
        .collect()
}
