//! Crash recovery. Every server instance registers itself and writes a
//! heartbeat; holds carry the instance that placed them. When an instance
//! has been silent longer than `stale_after` (killed, crashed, cut off),
//! any live instance closes its open holds: running requests checkpoint
//! their usage onto their hold, so a hold is settled from its last
//! checkpoint, or released if nothing was used. A request whose settlement
//! committed is no longer open, so nothing is billed twice.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;

use super::settle::{Item, close_batch};
use super::{Closed, LedgerConfig, LedgerError, Outcome, Tokens};
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

/// Beats until the process ends; every few beats, closes what dead
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
            match recover_dead(&db, config.stale_after).await {
                Ok(r) if r == Recovered::default() => {}
                Ok(r) => tracing::warn!(?r, "closed the holds of a stopped server"),
                Err(e) => tracing::warn!(error = %e, "recovering dead holds failed"),
            }
        }
    }
}

/// What recovery did with a dead instance's open holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Settled from their last usage checkpoint.
    pub settled: u64,
    /// Released (nothing used yet).
    pub released: u64,
}

/// Closes the open holds of every instance silent for `stale_after`: a
/// hold with a usage checkpoint is settled from it (outcome `cut`), one
/// without is released; then forgets those instances. Closing goes through
/// the settlement transaction, so a hold closed meanwhile (by its own
/// instance, or by another replica's recovery) is left alone.
pub async fn recover_dead(db: &Db, stale_after: Duration) -> Result<Recovered, LedgerError> {
    let cutoff = now() - stale_after.as_secs().max(1) as i64;
    let rows = sqlx::query(
        "SELECT request_id, used_prompt, used_cached, used_completion FROM holds \
         WHERE state = 'open' AND instance_id IN (SELECT id FROM instances WHERE heartbeat_at < $1)",
    )
    .bind(cutoff)
    .fetch_all(&db.pool)
    .await?;
    let mut items = Vec::with_capacity(rows.len());
    for r in &rows {
        let used = |c: &str| r.try_get::<i64, _>(c).map(|v| v.max(0) as u64);
        let t = Tokens {
            prompt: used("used_prompt")?,
            cached: used("used_cached")?,
            completion: used("used_completion")?,
        };
        let usage = (t.prompt + t.completion > 0).then_some((t, Outcome::Cut));
        items.push(Item {
            request_id: r.try_get("request_id")?,
            usage,
            charge: None,
            who: Default::default(),
        });
    }
    let mut done = Recovered::default();
    for chunk in items.chunks(256) {
        for c in close_batch(db, chunk).await? {
            match c {
                Closed::Billed { .. } => done.settled += 1,
                Closed::Released => done.released += 1,
                Closed::AlreadyClosed => {}
            }
        }
    }
    sqlx::query(
        "DELETE FROM instances WHERE heartbeat_at < $1 \
         AND id NOT IN (SELECT instance_id FROM holds WHERE state = 'open')",
    )
    .bind(cutoff)
    .execute(&db.pool)
    .await?;
    Ok(done)
}
