//! The market: what a token costs and who trades capacity. It owns the
//! region electricity table and provider cost profiles (prices come from
//! `pricing`), the spot order books (`book`, one per instrument, in memory
//! and persisted with every change), their trades and price history, and
//! the capacity each fill bought (`contracts`).
//! It knows nothing of HTTP or the engine: callers pass in the load.

pub mod billing;
pub mod book;
pub mod contracts;
pub mod pricing;
mod shared;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

use serde::Serialize;
use tokio::sync::Mutex;

use crate::ledger::Ledger;
use crate::ledger::amount::{Amount, BPS, MAX_PRICE, Prices, Quote, Stages, show_units};
use crate::store::{Db, now};
use book::{Book, Fill, Level, Order, Side};
use pricing::{CostProfile, Occupancy};

/// What the market refuses or fails with.
#[derive(Debug, thiserror::Error)]
pub enum MarketError {
    #[error("no electricity price for region `{0}`")]
    UnknownRegion(String),
    #[error("no provider `{0}`")]
    UnknownProvider(String),
    #[error("{1}")]
    Invalid(&'static str, String),
    #[error("no open order `{0}`")]
    OrderNotFound(String),
    /// The ledger refused the bid's hold (funds, bounds).
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
}

/// A provider's costs and standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Provider {
    pub account_id: String,
    pub profile: CostProfile,
    /// 0.5-2.0 (bps).
    pub reputation_bps: i64,
    /// Fraction of time up (bps).
    pub uptime_bps: i64,
}

/// A new order, as a client posts it.
#[derive(Debug, Clone)]
pub struct NewOrder {
    pub side: Side,
    pub instrument: String,
    pub account_id: String,
    /// The API key a bid is posted with: its budget is held too.
    pub key_id: Option<String>,
    pub price: Amount,
    pub quantity: u64,
    pub priority: i64,
    pub interruptible: bool,
    pub expires_at: i64,
}

/// A recorded trade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Trade {
    pub id: String,
    pub instrument: String,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub price: Amount,
    pub quantity: i64,
    pub bid_id: String,
    pub ask_id: String,
    pub created_at: i64,
}

/// One sample of posted prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PricePoint {
    pub at: i64,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub input: Amount,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub cached_input: Amount,
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub output: Amount,
}

/// The spot view of an instrument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Spot {
    #[serde(with = "crate::ledger::units::opt")]
    #[schema(value_type = Option<String>, example = "0.0004")]
    pub best_bid: Option<Amount>,
    #[serde(with = "crate::ledger::units::opt")]
    #[schema(value_type = Option<String>, example = "0.0004")]
    pub best_ask: Option<Amount>,
    #[serde(with = "crate::ledger::units::opt")]
    #[schema(value_type = Option<String>, example = "0.0004")]
    pub last_trade: Option<Amount>,
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
}

/// The market service (shared behind an `Arc`).
#[derive(Debug)]
pub struct Market {
    db: Db,
    /// Protocol fee (bps).
    pub fee_bps: i64,
    regions: RwLock<BTreeMap<String, Amount>>,
    providers: RwLock<HashMap<String, Provider>>,
    books: Mutex<HashMap<String, Book>>,
    /// Bids hold their worst case and fills move money here; without a
    /// ledger (tests of the book alone) orders trade without money.
    ledger: Option<Ledger>,
    /// The latest posted output price of each instrument: orders priced
    /// more than `BAND` times away from it are refused, so no one account
    /// can push the market's prices anywhere.
    reference: RwLock<HashMap<String, Amount>>,
    /// Capacity bought on the books (each fill), covering its bidder's
    /// requests.
    contracts: std::sync::Mutex<contracts::Contracts>,
    /// When contracts were last read from a shared database.
    contracts_read: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How far from the reference price an order may be (a factor).
pub const BAND: i64 = 10;

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Market {
    /// Loads the region table, the providers and the open orders.
    pub async fn load(db: Db, fee_bps: i64) -> Result<Self, MarketError> {
        if !(pricing::FEE_MIN_BPS..=pricing::FEE_MAX_BPS).contains(&fee_bps) {
            return Err(MarketError::Invalid(
                "fee_bps",
                "the protocol fee is 5-10% (500-1000 bps)".into(),
            ));
        }
        let regions = store::regions(&db).await?;
        let providers = store::providers(&db).await?;
        let books = store::open_books(&db, now()).await?;
        let mut bought = contracts::Contracts::default();
        for c in store::live_contracts(&db, now()).await? {
            bought.add(c);
        }
        Ok(Self {
            db,
            fee_bps,
            regions: RwLock::new(regions),
            providers: RwLock::new(
                providers
                    .into_iter()
                    .map(|p| (p.account_id.clone(), p))
                    .collect(),
            ),
            books: Mutex::new(books),
            ledger: None,
            reference: RwLock::new(HashMap::new()),
            contracts: std::sync::Mutex::new(bought),
            contracts_read: std::sync::Mutex::new(None),
        })
    }

    /// Connects the money: bids hold their worst case and fills are billed
    /// through `ledger`. Releases the holds of bids that ended while no
    /// server ran (expired, or closed without their release).
    /// Resting bids without a hold (placed before bids held money) are
    /// held now, or cancelled when their account cannot cover them.
    pub async fn with_ledger(mut self, ledger: Ledger) -> Result<Self, MarketError> {
        use std::collections::HashSet;
        let held: HashSet<String> = ledger.held_orders().await?.into_iter().collect();
        let books = self.books.get_mut();
        let resting: HashSet<String> = books.values().flat_map(Book::order_ids).collect();
        for id in held.difference(&resting) {
            billing::release(&ledger, id).await;
        }
        let t = now();
        for book in books.values_mut() {
            let unheld: Vec<Order> = book
                .resting_bids()
                .filter(|o| !held.contains(&o.id))
                .collect();
            for o in unheld {
                let placed = match billing::bid_worst_case(&o, t) {
                    Ok(a) => ledger
                        .hold_order(&o.id, &o.account_id, None, a)
                        .await
                        .map_err(Into::into),
                    Err(e) => Err(e),
                };
                if let Err(e) = placed {
                    tracing::warn!(order = %o.id, error = %e, "resting bid without funds: cancelled");
                    book.cancel(&o.id);
                    store::close_order(&self.db, &o.id, "cancelled").await?;
                }
            }
        }
        self.ledger = Some(ledger);
        Ok(self)
    }

    /// Current prices of `provider` under `load`, with its payout terms.
    pub fn quote(
        &self,
        provider: &str,
        model: &str,
        load: Occupancy,
        preemptible: bool,
    ) -> Result<Quote, MarketError> {
        let p = read(&self.providers)
            .get(provider)
            .cloned()
            .ok_or_else(|| MarketError::UnknownProvider(provider.to_string()))?;
        let kwh = *read(&self.regions)
            .get(&p.profile.region)
            .ok_or_else(|| MarketError::UnknownRegion(p.profile.region.clone()))?;
        Ok(Quote {
            provider_id: provider.to_string(),
            model: model.to_string(),
            prices: pricing::prices(&p.profile, kwh, load, self.fee_bps, preemptible),
            fee_bps: self.fee_bps,
            payout_bps: pricing::payout_bps(p.reputation_bps),
            stages: Stages::default(),
        })
    }

    pub fn regions(&self) -> BTreeMap<String, Amount> {
        read(&self.regions).clone()
    }

    /// Sets (or adds) a region's electricity price.
    pub async fn set_region_price(
        &self,
        region: &str,
        micros_per_kwh: i64,
    ) -> Result<(), MarketError> {
        if region.trim().is_empty() || region.len() > 64 {
            return Err(MarketError::Invalid(
                "region",
                "a region name is 1-64 characters".into(),
            ));
        }
        if !(1..=pricing::MAX_MICROS_PER_KWH).contains(&micros_per_kwh) {
            return Err(MarketError::Invalid(
                "price_per_kwh",
                format!(
                    "an electricity price is positive and at most {} per kWh",
                    crate::ledger::units::micros::show(pricing::MAX_MICROS_PER_KWH)
                ),
            ));
        }
        store::set_region(&self.db, region, micros_per_kwh).await?;
        write(&self.regions).insert(region.to_string(), micros_per_kwh);
        Ok(())
    }

    pub fn providers(&self) -> Vec<Provider> {
        let mut v: Vec<Provider> = read(&self.providers).values().cloned().collect();
        v.sort_by(|a, b| a.account_id.cmp(&b.account_id));
        v
    }

    /// Sets a provider's cost profile and standing (the account must exist).
    pub async fn set_provider(&self, p: Provider) -> Result<(), MarketError> {
        p.profile
            .validate()
            .map_err(|(f, m)| MarketError::Invalid(f, m))?;
        if !read(&self.regions).contains_key(&p.profile.region) {
            return Err(MarketError::UnknownRegion(p.profile.region.clone()));
        }
        for (field, v) in [
            ("reputation_bps", p.reputation_bps),
            ("uptime_bps", p.uptime_bps),
        ] {
            if !(0..=2 * BPS).contains(&v) {
                return Err(MarketError::Invalid(
                    field,
                    format!("{field} is between 0 and 20000"),
                ));
            }
        }
        store::set_provider(&self.db, &p).await?;
        write(&self.providers).insert(p.account_id.clone(), p);
        Ok(())
    }

    /// Covers a request of `tokens` (at worst) by `account` on
    /// `instrument` from capacity it bought, if a live contract whose
    /// seller `can_serve` has room: it runs at the trade price, prepaid.
    pub async fn cover(
        &self,
        account: &str,
        instrument: &str,
        tokens: u64,
        can_serve: impl Fn(&str) -> bool,
    ) -> Option<contracts::Cover> {
        if shared::shared(&self.db) && self.contracts_stale() {
            // Fills on other replicas: take them in (buckets are kept).
            match store::live_contracts(&self.db, now()).await {
                Ok(fresh) => self
                    .contracts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .merge(fresh),
                Err(e) => tracing::warn!(error = %e, "contracts not reloaded"),
            }
        }
        if !shared::shared(&self.db) {
            let mut bought = self.contracts.lock().unwrap_or_else(|e| e.into_inner());
            return bought.cover(account, instrument, tokens, now(), can_serve);
        }
        // Replicas share each contract's bucket in the database.
        let candidates = self
            .contracts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .candidates(account, instrument, now(), can_serve);
        for c in candidates {
            match shared::take(
                &self.db,
                &c.trade_id,
                c.quantity,
                contracts::BURST_S,
                tokens,
            )
            .await
            {
                Ok(true) => {
                    return Some(contracts::Cover {
                        trade_id: c.trade_id,
                        seller: c.seller,
                        price: c.price,
                    });
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(trade = %c.trade_id, error = %e, "contract not taken from")
                }
            }
        }
        None
    }

    /// Whether contracts were last read from the database over a second
    /// ago (and, if so, that they are being read now).
    fn contracts_stale(&self) -> bool {
        let mut at = self
            .contracts_read
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if at.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1)) {
            return false;
        }
        *at = Some(std::time::Instant::now());
        true
    }

    /// The live contracts of `account` (every one without it).
    /// On a shared database each one's `room` is read from its shared
    /// bucket.
    pub async fn contracts(&self, account: Option<&str>) -> Vec<contracts::Contract> {
        let mut live = self
            .contracts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .of(account, now());
        if shared::shared(&self.db) {
            for c in &mut live {
                match shared::room(&self.db, &c.trade_id, c.quantity, contracts::BURST_S).await {
                    Ok(room) => c.room = room,
                    Err(e) => {
                        tracing::warn!(trade = %c.trade_id, error = %e, "contract room not read")
                    }
                }
            }
        }
        live
    }

    /// Records a provider's measured reputation and uptime (basis
    /// points, clamped to their ranges) on its row, if it has one; a
    /// failure to persist is logged (the next round writes it again).
    pub async fn set_standing(&self, provider: &str, reputation_bps: i64, uptime_bps: i64) {
        let (rep, up) = (
            reputation_bps.clamp(BPS / 2, 2 * BPS),
            uptime_bps.clamp(0, BPS),
        );
        let known = {
            let mut m = write(&self.providers);
            match m.get_mut(provider) {
                Some(p) => {
                    p.reputation_bps = rep;
                    p.uptime_bps = up;
                    true
                }
                None => false,
            }
        };
        if known && let Err(e) = store::set_standing(&self.db, provider, rep, up).await {
            tracing::warn!(provider, error = %e, "provider standing not persisted");
        }
    }

    /// The measured standing of `provider` (1.0x and full uptime when it
    /// has no row).
    pub fn standing_of(&self, provider: &str) -> (i64, i64) {
        read(&self.providers)
            .get(provider)
            .map_or((BPS, BPS), |p| (p.reputation_bps, p.uptime_bps))
    }

    /// Matches and rests an order; persists it, its fills and any expired
    /// orders met on the way, in one transaction.
    pub async fn submit(&self, new: NewOrder) -> Result<(Order, Vec<Fill>), MarketError> {
        validate(&new)?;
        self.check_band(&new.instrument, new.price)?;
        let order = Order {
            id: sortable_id("ord", 0),
            side: new.side,
            account_id: new.account_id,
            price: new.price,
            quantity: new.quantity,
            remaining: new.quantity,
            priority: new.priority,
            interruptible: new.interruptible,
            expires_at: new.expires_at,
        };
        let t = now();
        let mut books = self.books.lock().await;
        // Replicas on one database match one at a time on its orders.
        let _lock = shared::lock(&self.db, &new.instrument).await?;
        if let Some(b) = shared::reload(&self.db, &new.instrument).await? {
            books.insert(new.instrument.clone(), b);
        }
        if let (Some(l), Side::Bid) = (&self.ledger, order.side) {
            l.hold_order(
                &order.id,
                &order.account_id,
                new.key_id.as_deref(),
                billing::bid_worst_case(&order, t)?,
            )
            .await?;
        }
        let book = books.entry(new.instrument.clone()).or_default();
        let (fills, expired) = book.submit(order.clone(), t);
        let rests = book.get(&order.id).is_some();
        let placed = book.get(&order.id).cloned().unwrap_or_else(|| Order {
            remaining: order.quantity - fills.iter().map(|f| f.quantity).sum::<u64>(),
            ..order
        });
        let stored =
            store::record_submit(&self.db, &new.instrument, &placed, &fills, &expired).await;
        if let Some(l) = &self.ledger {
            billing::settle(l, self.fee_bps, &placed, rests, &fills, &expired, t).await;
        }
        {
            let mut bought = self.contracts.lock().unwrap_or_else(|e| e.into_inner());
            for f in &fills {
                bought.add(contracts::Contract::new(
                    format!("{}:{}", f.bid_id, f.ask_id),
                    new.instrument.clone(),
                    (f.terms.bidder.clone(), f.terms.seller.clone()),
                    f.price,
                    f.quantity,
                    f.terms.until,
                ));
            }
        }
        // The book and the money have moved: answer with what happened,
        // even if the order table missed it (a retry would bid twice).
        if let Err(e) = stored {
            tracing::error!(order = %placed.id, error = %e, "order book change not persisted");
        }
        Ok((placed, fills))
    }

    /// Whether `price` could be listed on `instrument` now.
    pub fn in_band(&self, instrument: &str, price: Amount) -> bool {
        self.check_band(instrument, price).is_ok()
    }

    /// Refuses a price past `MAX_PRICE` or more than `BAND` times away
    /// from the instrument's reference price.
    fn check_band(&self, instrument: &str, price: Amount) -> Result<(), MarketError> {
        if price > MAX_PRICE {
            return Err(MarketError::Invalid(
                "price",
                format!(
                    "a price is at most {} per million tokens",
                    show_units(MAX_PRICE)
                ),
            ));
        }
        if let Some(r) = read(&self.reference).get(instrument).copied() {
            let (low, high) = ((r / BAND).max(1), r.saturating_mul(BAND));
            if !(low..=high).contains(&price) {
                return Err(MarketError::Invalid(
                    "price",
                    format!(
                        "`{instrument}` trades between {} and {} per million tokens now (within \
                         {BAND}x of its posted price {}); {} is outside",
                        show_units(low),
                        show_units(high),
                        show_units(r),
                        show_units(price)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Cancels an open order (of `account`, when given).
    pub async fn cancel(&self, id: &str, account: Option<&str>) -> Result<Order, MarketError> {
        let mut books = self.books.lock().await;
        let mut _lock = None;
        if shared::shared(&self.db) {
            let instrument = store::instrument_of_open(&self.db, id)
                .await?
                .ok_or_else(|| MarketError::OrderNotFound(id.to_string()))?;
            _lock = Some(shared::lock(&self.db, &instrument).await?);
            if let Some(b) = shared::reload(&self.db, &instrument).await? {
                books.insert(instrument, b);
            }
        }
        let owned = |o: &Order| account.is_none_or(|a| a == o.account_id);
        let book = books
            .values_mut()
            .find(|b| b.get(id).is_some_and(owned))
            .ok_or_else(|| MarketError::OrderNotFound(id.to_string()))?;
        let order = book
            .cancel(id)
            .ok_or_else(|| MarketError::OrderNotFound(id.to_string()))?;
        self.ended(&order).await;
        store::close_order(&self.db, id, "cancelled").await?;
        Ok(order)
    }

    /// Cancels every open order of `account` on `instrument`.
    pub async fn cancel_all(&self, instrument: &str, account: &str) -> Result<usize, MarketError> {
        let mut books = self.books.lock().await;
        let _lock = shared::lock(&self.db, instrument).await?;
        if let Some(b) = shared::reload(&self.db, instrument).await? {
            books.insert(instrument.to_string(), b);
        }
        let Some(book) = books.get_mut(instrument) else {
            return Ok(0);
        };
        let mine: Vec<String> = book.orders_of(account);
        for id in &mine {
            if let Some(o) = book.cancel(id) {
                self.ended(&o).await;
                store::close_order(&self.db, id, "cancelled").await?;
            }
        }
        Ok(mine.len())
    }

    /// Releases the hold of a bid that left the book unfilled.
    async fn ended(&self, o: &Order) {
        if let (Some(l), Side::Bid) = (&self.ledger, o.side) {
            billing::release(l, &o.id).await;
        }
    }

    /// Removes expired orders from every book (on a shared database, every
    /// open order past its expiry, whichever replica placed it).
    pub async fn expire(&self) -> Result<usize, MarketError> {
        let mut books = self.books.lock().await;
        let mut n = 0;
        if shared::shared(&self.db) {
            for o in store::expired_open(&self.db, now()).await? {
                self.ended(&o).await;
                store::close_order(&self.db, &o.id, "expired").await?;
                n += 1;
            }
        }
        for book in books.values_mut() {
            for o in book.expire(now()) {
                self.ended(&o).await;
                if let Err(e) = store::close_order(&self.db, &o.id, "expired").await {
                    tracing::warn!(order = %o.id, error = %e, "expiry not persisted");
                }
                n += 1;
            }
        }
        Ok(n)
    }

    /// Every book's invariants (not crossed, consistently indexed).
    pub async fn check(&self) -> Result<(), String> {
        let books = self.books.lock().await;
        for (instrument, b) in books.iter() {
            b.check().map_err(|e| format!("{instrument}: {e}"))?;
        }
        Ok(())
    }

    /// The resting orders of `instrument` (bids, then asks, best first).
    pub async fn orders(&self, instrument: &str) -> Vec<Order> {
        let mut books = self.books.lock().await;
        if let Ok(Some(b)) = shared::reload(&self.db, instrument).await {
            books.insert(instrument.to_string(), b);
        }
        books.get(instrument).map(Book::resting).unwrap_or_default()
    }

    /// Best bid and ask, last trade and `depth` levels of each side.
    pub async fn spot(&self, instrument: &str, depth: usize) -> Spot {
        let mut books = self.books.lock().await;
        match shared::reload(&self.db, instrument).await {
            Ok(Some(b)) => {
                books.insert(instrument.to_string(), b);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(instrument, error = %e, "book not reloaded; showing the last one")
            }
        }
        let Some(b) = books.get(instrument) else {
            return Spot {
                best_bid: None,
                best_ask: None,
                last_trade: None,
                bids: vec![],
                asks: vec![],
            };
        };
        let (bids, asks) = b.depth(depth);
        Spot {
            best_bid: b.best_bid(),
            best_ask: b.best_ask(),
            last_trade: b.last_price(),
            bids,
            asks,
        }
    }

    pub async fn trades(&self, instrument: &str, limit: i64) -> Result<Vec<Trade>, MarketError> {
        store::trades(&self.db, instrument, limit).await
    }

    /// Records posted prices (one sample per instrument per second at most).
    /// Also makes `p.output` the instrument's reference price.
    pub async fn record_prices(&self, instrument: &str, p: Prices) -> Result<(), MarketError> {
        write(&self.reference).insert(instrument.to_string(), p.output);
        store::record_prices(&self.db, instrument, now(), p).await
    }

    pub async fn history(
        &self,
        instrument: &str,
        limit: i64,
    ) -> Result<Vec<PricePoint>, MarketError> {
        store::history(&self.db, instrument, limit).await
    }
}

/// `<prefix>_<unix micros, hex>_<n>_<random>`: ids that sort by time, so
/// "ORDER BY id" replays arrival order (and time priority) after a reload.
pub(crate) fn sortable_id(prefix: &str, n: usize) -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let r = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{micros:016x}_{n:04}_{}", &r[..12])
}

fn validate(o: &NewOrder) -> Result<(), MarketError> {
    let bad = |f: &'static str, m: &str| Err(MarketError::Invalid(f, m.to_string()));
    if o.instrument.trim().is_empty() || o.instrument.len() > 128 {
        return bad(
            "instrument",
            "an instrument (model or resource class) is 1-128 characters",
        );
    }
    if o.price <= 0 {
        return bad("price", "a price is positive (ticks per million tokens)");
    }
    if o.quantity == 0 || o.quantity > 1_000_000_000 {
        return bad("quantity", "a quantity is 1 to 1e9 tokens per second");
    }
    if o.expires_at <= now() {
        return bad("expires_at", "the order would already be expired");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
