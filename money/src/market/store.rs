//! The market's tables: region prices, providers, orders, trades and the
//! price history (queries only; the rules live in `mod.rs` and `book`).

use std::collections::{BTreeMap, HashMap};

use sqlx::Row;
use sqlx::any::AnyRow;

use super::book::{Book, Fill, Order, Side};
use super::pricing::CostProfile;
use super::{MarketError, PricePoint, Provider, Trade};
use crate::ledger::amount::{Amount, Prices};
use crate::store::{Db, now};

pub async fn regions(db: &Db) -> Result<BTreeMap<String, Amount>, MarketError> {
    let rows = sqlx::query("SELECT region, micros_per_kwh FROM region_prices")
        .fetch_all(&db.pool)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("region")?, r.try_get("micros_per_kwh")?)))
        .collect()
}

pub async fn set_region(db: &Db, region: &str, micros: i64) -> Result<(), MarketError> {
    sqlx::query(
        "INSERT INTO region_prices (region, micros_per_kwh, updated_at) VALUES ($1, $2, $3) \
         ON CONFLICT (region) DO UPDATE SET micros_per_kwh = excluded.micros_per_kwh, \
         updated_at = excluded.updated_at",
    )
    .bind(region)
    .bind(micros)
    .bind(now())
    .execute(&db.pool)
    .await?;
    Ok(())
}

fn provider(r: &AnyRow) -> Result<Provider, sqlx::Error> {
    Ok(Provider {
        account_id: r.try_get("account_id")?,
        profile: CostProfile {
            region: r.try_get("region")?,
            watts: r.try_get("watts")?,
            pue_milli: r.try_get("pue_milli")?,
            depreciation_per_hour: r.try_get("depreciation_per_hour")?,
            network_per_hour: r.try_get("network_per_hour")?,
            prefill_tokens_per_hour: r.try_get("prefill_tokens_per_hour")?,
            decode_tokens_per_hour: r.try_get("decode_tokens_per_hour")?,
            cached_bps: r.try_get("cached_bps")?,
            preemptible_discount_bps: r.try_get("preemptible_discount_bps")?,
        },
        reputation_bps: r.try_get("reputation_bps")?,
        uptime_bps: r.try_get("uptime_bps")?,
    })
}

pub async fn providers(db: &Db) -> Result<Vec<Provider>, MarketError> {
    let rows = sqlx::query("SELECT * FROM providers ORDER BY account_id")
        .fetch_all(&db.pool)
        .await?;
    Ok(rows.iter().map(provider).collect::<Result<_, _>>()?)
}

/// The instrument of an open order.
pub async fn instrument_of_open(db: &Db, id: &str) -> Result<Option<String>, MarketError> {
    Ok(
        sqlx::query_scalar("SELECT instrument FROM orders WHERE id = $1 AND state = 'open'")
            .bind(id)
            .fetch_optional(&db.pool)
            .await?,
    )
}

/// Open orders past their expiry at `at`.
pub async fn expired_open(db: &Db, at: i64) -> Result<Vec<Order>, MarketError> {
    let rows = sqlx::query("SELECT * FROM orders WHERE state = 'open' AND expires_at <= $1")
        .bind(at)
        .fetch_all(&db.pool)
        .await?;
    Ok(rows
        .iter()
        .map(order)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(|(_, o)| o)
        .collect())
}

/// The contracts of fills whose capacity has not ended at `at`.
pub async fn live_contracts(
    db: &Db,
    at: i64,
) -> Result<Vec<super::contracts::Contract>, MarketError> {
    let rows = sqlx::query(
        "SELECT t.bid_id, t.ask_id, t.instrument, t.price, t.quantity, b.account_id AS bidder, \
         a.account_id AS seller, CASE WHEN b.expires_at < a.expires_at THEN b.expires_at \
         ELSE a.expires_at END AS until FROM trades t JOIN orders b ON b.id = t.bid_id \
         JOIN orders a ON a.id = t.ask_id WHERE b.expires_at > $1 AND a.expires_at > $2 \
         ORDER BY t.created_at",
    )
    .bind(at)
    .bind(at)
    .fetch_all(&db.pool)
    .await?;
    let mut out = Vec::new();
    for r in rows {
        let (bid, ask): (String, String) = (r.try_get("bid_id")?, r.try_get("ask_id")?);
        out.push(super::contracts::Contract::new(
            format!("{bid}:{ask}"),
            r.try_get("instrument")?,
            (r.try_get("bidder")?, r.try_get("seller")?),
            r.try_get("price")?,
            u64::try_from(r.try_get::<i64, _>("quantity")?).unwrap_or(0),
            r.try_get("until")?,
        ));
    }
    Ok(out)
}

pub async fn set_standing(
    db: &Db,
    provider: &str,
    reputation_bps: i64,
    uptime_bps: i64,
) -> Result<(), MarketError> {
    sqlx::query(
        "UPDATE providers SET reputation_bps = $1, uptime_bps = $2, updated_at = $3          WHERE account_id = $4",
    )
    .bind(reputation_bps)
    .bind(uptime_bps)
    .bind(crate::store::now())
    .bind(provider)
    .execute(&db.pool)
    .await?;
    Ok(())
}

pub async fn set_provider(db: &Db, p: &Provider) -> Result<(), MarketError> {
    let kind: Option<String> = sqlx::query_scalar("SELECT kind FROM accounts WHERE id = $1")
        .bind(&p.account_id)
        .fetch_optional(&db.pool)
        .await?;
    if kind.as_deref() != Some("provider") {
        return Err(MarketError::UnknownProvider(p.account_id.clone()));
    }
    let f = &p.profile;
    sqlx::query(
        "INSERT INTO providers (account_id, region, watts, pue_milli, depreciation_per_hour, \
         network_per_hour, prefill_tokens_per_hour, decode_tokens_per_hour, cached_bps, \
         preemptible_discount_bps, reputation_bps, uptime_bps, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
         ON CONFLICT (account_id) DO UPDATE SET region = excluded.region, watts = excluded.watts, \
         pue_milli = excluded.pue_milli, depreciation_per_hour = excluded.depreciation_per_hour, \
         network_per_hour = excluded.network_per_hour, \
         prefill_tokens_per_hour = excluded.prefill_tokens_per_hour, \
         decode_tokens_per_hour = excluded.decode_tokens_per_hour, cached_bps = excluded.cached_bps, \
         preemptible_discount_bps = excluded.preemptible_discount_bps, \
         reputation_bps = excluded.reputation_bps, uptime_bps = excluded.uptime_bps, \
         updated_at = excluded.updated_at",
    )
    .bind(&p.account_id)
    .bind(&f.region)
    .bind(f.watts)
    .bind(f.pue_milli)
    .bind(f.depreciation_per_hour)
    .bind(f.network_per_hour)
    .bind(f.prefill_tokens_per_hour)
    .bind(f.decode_tokens_per_hour)
    .bind(f.cached_bps)
    .bind(f.preemptible_discount_bps)
    .bind(p.reputation_bps)
    .bind(p.uptime_bps)
    .bind(now())
    .execute(&db.pool)
    .await?;
    Ok(())
}

fn order(r: &AnyRow) -> Result<(String, Order), sqlx::Error> {
    let side: String = r.try_get("side")?;
    let order = Order {
        id: r.try_get("id")?,
        side: if side == "bid" { Side::Bid } else { Side::Ask },
        account_id: r.try_get("account_id")?,
        price: r.try_get("price")?,
        quantity: r.try_get::<i64, _>("quantity")?.max(0) as u64,
        remaining: r.try_get::<i64, _>("remaining")?.max(0) as u64,
        priority: r.try_get("priority")?,
        interruptible: r.try_get::<i64, _>("interruptible")? != 0,
        expires_at: r.try_get("expires_at")?,
    };
    Ok((r.try_get("instrument")?, order))
}

/// The books as the database has them: open, unexpired orders in the order
/// they arrived, and each instrument's last trade price.
pub async fn open_books(db: &Db, at: i64) -> Result<HashMap<String, Book>, MarketError> {
    open_books_of(db, None, at).await
}

/// `open_books`, of one instrument only when given.
pub async fn open_books_of(
    db: &Db,
    instrument: Option<&str>,
    at: i64,
) -> Result<HashMap<String, Book>, MarketError> {
    let rows = sqlx::query(
        "SELECT * FROM orders WHERE state = 'open' AND expires_at > $1 \
         AND (CAST($2 AS TEXT) IS NULL OR instrument = $3) ORDER BY id",
    )
    .bind(at)
    .bind(instrument)
    .bind(instrument)
    .fetch_all(&db.pool)
    .await?;
    let mut books: HashMap<String, Book> = HashMap::new();
    for r in &rows {
        let (instrument, o) = order(r)?;
        books.entry(instrument).or_default().restore(o);
    }
    let last = sqlx::query(
        "SELECT t.instrument, t.price FROM trades t WHERE t.id = (SELECT t2.id FROM trades t2 \
         WHERE t2.instrument = t.instrument ORDER BY t2.id DESC LIMIT 1) \
         AND (CAST($1 AS TEXT) IS NULL OR t.instrument = $2)",
    )
    .bind(instrument)
    .bind(instrument)
    .fetch_all(&db.pool)
    .await?;
    for r in &last {
        let instrument: String = r.try_get("instrument")?;
        books
            .entry(instrument)
            .or_default()
            .set_last_price(Some(r.try_get("price")?));
    }
    Ok(books)
}

/// Persists a submitted order (as placed), its fills (trades, and the
/// remaining quantity of the resting orders they hit) and expired orders.
pub async fn record_submit(
    db: &Db,
    instrument: &str,
    placed: &Order,
    fills: &[Fill],
    expired: &[Order],
) -> Result<(), MarketError> {
    let mut tx = db.pool.begin().await?;
    let t = now();
    sqlx::query(
        "INSERT INTO orders (id, side, instrument, account_id, price, quantity, remaining, priority, \
         interruptible, expires_at, state, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(&placed.id)
    .bind(placed.side.as_str())
    .bind(instrument)
    .bind(&placed.account_id)
    .bind(placed.price)
    .bind(placed.quantity as i64)
    .bind(placed.remaining as i64)
    .bind(placed.priority)
    .bind(i64::from(placed.interruptible))
    .bind(placed.expires_at)
    .bind(if placed.remaining == 0 { "filled" } else if placed.expires_at <= t { "expired" } else { "open" })
    .bind(t)
    .execute(&mut *tx)
    .await?;
    for (i, f) in fills.iter().enumerate() {
        let resting = if f.bid_id == placed.id {
            &f.ask_id
        } else {
            &f.bid_id
        };
        sqlx::query(
            "UPDATE orders SET remaining = remaining - $1, \
             state = CASE WHEN remaining - $2 = 0 THEN 'filled' ELSE state END WHERE id = $3",
        )
        .bind(f.quantity as i64)
        .bind(f.quantity as i64)
        .bind(resting)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO trades (id, instrument, price, quantity, bid_id, ask_id, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(super::sortable_id("trd", i))
        .bind(instrument)
        .bind(f.price)
        .bind(f.quantity as i64)
        .bind(&f.bid_id)
        .bind(&f.ask_id)
        .bind(t)
        .execute(&mut *tx)
        .await?;
    }
    for o in expired {
        sqlx::query("UPDATE orders SET state = 'expired' WHERE id = $1")
            .bind(&o.id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

pub async fn close_order(db: &Db, id: &str, state: &str) -> Result<(), MarketError> {
    sqlx::query("UPDATE orders SET state = $1 WHERE id = $2 AND state = 'open'")
        .bind(state)
        .bind(id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

pub async fn trades(db: &Db, instrument: &str, limit: i64) -> Result<Vec<Trade>, MarketError> {
    let rows = sqlx::query("SELECT * FROM trades WHERE instrument = $1 ORDER BY id DESC LIMIT $2")
        .bind(instrument)
        .bind(limit)
        .fetch_all(&db.pool)
        .await?;
    let trade = |r: &AnyRow| -> Result<Trade, sqlx::Error> {
        Ok(Trade {
            id: r.try_get("id")?,
            instrument: r.try_get("instrument")?,
            price: r.try_get("price")?,
            quantity: r.try_get("quantity")?,
            bid_id: r.try_get("bid_id")?,
            ask_id: r.try_get("ask_id")?,
            created_at: r.try_get("created_at")?,
        })
    };
    Ok(rows.iter().map(trade).collect::<Result<_, _>>()?)
}

pub async fn record_prices(
    db: &Db,
    instrument: &str,
    at: i64,
    p: Prices,
) -> Result<(), MarketError> {
    sqlx::query(
        "INSERT INTO price_history (instrument, at, input_price, cached_price, output_price) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (instrument, at) DO NOTHING",
    )
    .bind(instrument)
    .bind(at)
    .bind(p.input)
    .bind(p.cached_input)
    .bind(p.output)
    .execute(&db.pool)
    .await?;
    Ok(())
}

pub async fn history(
    db: &Db,
    instrument: &str,
    limit: i64,
) -> Result<Vec<PricePoint>, MarketError> {
    let rows = sqlx::query(
        "SELECT at, input_price, cached_price, output_price FROM price_history \
         WHERE instrument = $1 ORDER BY at DESC LIMIT $2",
    )
    .bind(instrument)
    .bind(limit)
    .fetch_all(&db.pool)
    .await?;
    let point = |r: &AnyRow| -> Result<PricePoint, sqlx::Error> {
        Ok(PricePoint {
            at: r.try_get("at")?,
            input: r.try_get("input_price")?,
            cached_input: r.try_get("cached_price")?,
            output: r.try_get("output_price")?,
        })
    };
    Ok(rows.iter().map(point).collect::<Result<_, _>>()?)
}
