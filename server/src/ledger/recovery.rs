//! Crash recovery. Every server instance registers itself and writes a
//! heartbeat; holds carry the instance that placed them. When an instance
//! has been silent longer than `stale_after` (killed, crashed, cut off),
//! any live instance releases its open holds (a request whose settlement
//! committed is no longer open, so nothing is billed twice). A settlement
//! and its usage record commit in one transaction, so an open hold never
//! has a usage record to settle from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;

use super::{LedgerConfig, LedgerError, Micros};
use crate::store::{Db, now};

/// Records this instance as alive.
pub async fn register(db: &Db, instance: &str) -> Result<(), LedgerError> {
    let t = now();
    sqlx::query("INSERT INTO instances (id, started_at, heartbeat_at) VALUES ($1, $2, $3)")
        .bind(instance)
        .bind(t)
        .bind(t)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Beats until the process ends; every few beats, releases what dead
/// instances left open.
pub async fn heartbeat(db: Db, instance: Arc<str>, config: LedgerConfig) {
    let mut tick = tokio::time::interval(config.heartbeat);
    let mut beats = 0u64;
    loop {
        tick.tick().await;
        beats += 1;
        let r = sqlx::query("UPDATE instances SET heartbeat_at = $1 WHERE id = $2")
            .bind(now())
            .bind(&*instance)
            .execute(&db.pool)
            .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "ledger heartbeat failed");
        }
        if beats.is_multiple_of(3) {
            match release_dead(&db, config.stale_after).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(released = n, "released holds of a stopped server"),
                Err(e) => tracing::warn!(error = %e, "releasing dead holds failed"),
            }
        }
    }
}

/// Releases the open holds of every instance silent for `stale_after`,
/// then forgets those instances. Returns how many holds it released.
pub async fn release_dead(db: &Db, stale_after: Duration) -> Result<u64, LedgerError> {
    let cutoff = now() - stale_after.as_secs().max(1) as i64;
    let mut tx = db.pool.begin().await?;
    let rows = sqlx::query(
        "UPDATE holds SET state = 'released', closed_at = $1 WHERE state = 'open' AND instance_id IN \
         (SELECT id FROM instances WHERE heartbeat_at < $2) RETURNING account_id, key_id, amount",
    )
    .bind(now())
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    let mut accounts: HashMap<String, Micros> = HashMap::new();
    let mut keys: HashMap<String, Micros> = HashMap::new();
    for r in &rows {
        let amount: Micros = r.try_get("amount")?;
        *accounts.entry(r.try_get("account_id")?).or_default() += amount;
        if let Some(k) = r.try_get::<Option<String>, _>("key_id")? {
            *keys.entry(k).or_default() += amount;
        }
    }
    for (table, deltas) in [("accounts", accounts), ("api_keys", keys)] {
        let mut deltas: Vec<_> = deltas.into_iter().collect();
        deltas.sort();
        for (id, amount) in deltas {
            let sql = match table {
                "accounts" => "UPDATE accounts SET held = held - $1 WHERE id = $2",
                _ => "UPDATE api_keys SET held = held - $1 WHERE id = $2",
            };
            sqlx::query(sql)
                .bind(amount)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
    }
    sqlx::query(
        "DELETE FROM instances WHERE heartbeat_at < $1 \
         AND id NOT IN (SELECT instance_id FROM holds WHERE state = 'open')",
    )
    .bind(cutoff)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows.len() as u64)
}
