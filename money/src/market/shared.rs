//! Books shared by replicas. On PostgreSQL several `synor serve` replicas
//! may trade on the same orders, so the database is the book's source of
//! truth: every change to an instrument's book first takes a
//! transaction-scoped advisory lock on the instrument (held until the
//! change is persisted, released however the change ends, a crashed
//! replica's with its connection) and reloads the instrument's open
//! orders, so replicas match one at a time on the same orders and never
//! fill one twice. Reads reload too. On SQLite (one node) the in-memory
//! books are the truth and none of this runs.

use sqlx::Any;

use super::MarketError;
use super::book::Book;
use crate::store::{Backend, Db};

/// A held lock on one instrument's book (released when dropped).
pub struct BookLock(#[allow(dead_code)] Option<sqlx::Transaction<'static, Any>>);

/// A stable 63-bit key for an instrument's advisory lock.
fn key(instrument: &str) -> i64 {
    // FNV-1a: the same on every replica and build.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in "synor:book:".bytes().chain(instrument.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 1) as i64
}

/// Whether books are shared (the database may have other replicas).
pub fn shared(db: &Db) -> bool {
    db.backend == Backend::Postgres
}

/// Takes `instrument`'s lock (a no-op where books are not shared).
pub async fn lock(db: &Db, instrument: &str) -> Result<BookLock, MarketError> {
    if !shared(db) {
        return Ok(BookLock(None));
    }
    let mut tx = db.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(key(instrument))
        .execute(&mut *tx)
        .await?;
    Ok(BookLock(Some(tx)))
}

/// `instrument`'s book as the database has it now, or `None` where books
/// are not shared (the in-memory one stands).
pub async fn reload(db: &Db, instrument: &str) -> Result<Option<Book>, MarketError> {
    if !shared(db) {
        return Ok(None);
    }
    let mut books = super::store::open_books_of(db, Some(instrument), crate::store::now()).await?;
    Ok(Some(books.remove(instrument).unwrap_or_default()))
}

/// Takes `tokens` from a contract's shared bucket (`quantity` tokens a
/// second, `burst_s` seconds of it at most), in one conditional UPDATE;
/// false when it has not that much room. Only where books are shared.
pub async fn take(
    db: &Db,
    trade_id: &str,
    quantity: u64,
    burst_s: u64,
    tokens: u64,
) -> Result<bool, MarketError> {
    let rate = i64::try_from(quantity).unwrap_or(i64::MAX / 1_000_000);
    let cap = rate.saturating_mul(1_000).saturating_mul(burst_s as i64);
    let want = i64::try_from(tokens)
        .unwrap_or(i64::MAX / 1_000)
        .saturating_mul(1_000);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    sqlx::query(
        "INSERT INTO contract_use (trade_id, level, at_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (trade_id) DO NOTHING",
    )
    .bind(trade_id)
    .bind(cap)
    .bind(now_ms)
    .execute(&db.pool)
    .await?;
    // Refill for the time since (at most a full bucket's worth), then
    // take, only if it fits.
    let refilled = "LEAST($1, level + LEAST(GREATEST($2 - at_ms, 0), $3) * $4)";
    let sql = format!(
        "UPDATE contract_use SET level = {refilled} - $5, at_ms = $6 \
         WHERE trade_id = $7 AND {refilled} >= $8"
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(cap)
        .bind(now_ms)
        .bind(burst_s as i64 * 1_000)
        .bind(rate)
        .bind(want)
        .bind(now_ms)
        .bind(trade_id)
        .bind(want)
        .execute(&db.pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Tokens a contract's shared bucket can cover now (a full bucket when it
/// was never taken from).
pub async fn room(
    db: &Db,
    trade_id: &str,
    quantity: u64,
    burst_s: u64,
) -> Result<u64, MarketError> {
    let full = quantity.saturating_mul(burst_s);
    let row: Option<(i64, i64)> =
        sqlx::query_as("SELECT level, at_ms FROM contract_use WHERE trade_id = $1")
            .bind(trade_id)
            .fetch_optional(&db.pool)
            .await?;
    let Some((level, at_ms)) = row else {
        return Ok(full);
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let elapsed = (now_ms - at_ms).clamp(0, burst_s as i64 * 1_000);
    let milli = i128::from(level) + i128::from(elapsed) * i128::from(quantity);
    Ok(u64::try_from(milli / 1_000).unwrap_or(0).min(full))
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn lock_keys_are_stable_positive_and_distinct() {
        assert_eq!(key("m"), key("m"));
        assert_ne!(key("m"), key("n"));
        assert!(key("anything") >= 0);
    }
}
