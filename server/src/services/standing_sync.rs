//! Persisting providers' measured standing: every few seconds what this
//! server counted (attempts delivered and lost, connected seconds) is
//! added to `provider_standing` as increments, so several replicas add
//! up, and the fleet's totals are read back into the registry's
//! `Standing`. The measured reputation and uptime are also written onto
//! the market's provider rows, where the house's payout reads them.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;

use crate::fleet::registry::Registry;
use crate::fleet::standing::{Delta, Record};
use money::market::Market;
use money::store::{Db, now};

/// How often counts are persisted and totals read back.
pub const EVERY: Duration = Duration::from_secs(5);

/// Adds one provider's pending counts; returns the totals.
async fn add(db: &Db, provider: &str, d: &Delta) -> Result<Record, sqlx::Error> {
    let t = now();
    let first = if d.first_seen == 0 { t } else { d.first_seen };
    sqlx::query(
        "INSERT INTO provider_standing (provider_id, jobs_ok, jobs_lost, connected_s, first_seen, \
         updated_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (provider_id) DO UPDATE SET \
         jobs_ok = provider_standing.jobs_ok + excluded.jobs_ok, \
         jobs_lost = provider_standing.jobs_lost + excluded.jobs_lost, \
         connected_s = provider_standing.connected_s + excluded.connected_s, \
         first_seen = CASE WHEN excluded.first_seen < provider_standing.first_seen \
           THEN excluded.first_seen ELSE provider_standing.first_seen END, \
         updated_at = excluded.updated_at",
    )
    .bind(provider)
    .bind(i64::try_from(d.jobs_ok).unwrap_or(i64::MAX))
    .bind(i64::try_from(d.jobs_lost).unwrap_or(i64::MAX))
    .bind(d.connected_s.max(0))
    .bind(first)
    .bind(t)
    .execute(&db.pool)
    .await?;
    let row = sqlx::query(
        "SELECT jobs_ok, jobs_lost, connected_s, first_seen FROM provider_standing \
         WHERE provider_id = $1",
    )
    .bind(provider)
    .fetch_one(&db.pool)
    .await?;
    Ok(Record {
        jobs_ok: u64::try_from(row.try_get::<i64, _>("jobs_ok")?).unwrap_or(0),
        jobs_lost: u64::try_from(row.try_get::<i64, _>("jobs_lost")?).unwrap_or(0),
        connected_s: row.try_get("connected_s")?,
        first_seen: row.try_get("first_seen")?,
        ..Record::default()
    })
}

/// Every persisted record.
pub async fn load(db: &Db, fleet: &Registry) -> Result<usize, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT provider_id, jobs_ok, jobs_lost, connected_s, first_seen FROM provider_standing",
    )
    .fetch_all(&db.pool)
    .await?;
    for row in &rows {
        let r = Record {
            jobs_ok: u64::try_from(row.try_get::<i64, _>("jobs_ok")?).unwrap_or(0),
            jobs_lost: u64::try_from(row.try_get::<i64, _>("jobs_lost")?).unwrap_or(0),
            connected_s: row.try_get("connected_s")?,
            first_seen: row.try_get("first_seen")?,
            ..Record::default()
        };
        let id: String = row.try_get("provider_id")?;
        fleet.standing.absorb(&id, &r);
    }
    Ok(rows.len())
}

/// Persists what is pending and reads every total back; counts that
/// could not be written stay pending for the next round.
pub async fn flush(db: &Db, fleet: &Registry, market: Option<&Market>) {
    let pending = fleet.standing.take_pending(now());
    let mut failed = Vec::new();
    for (provider, d) in pending {
        match add(db, &provider, &d).await {
            Ok(totals) => {
                fleet.standing.absorb(&provider, &totals);
                if let Some(m) = market {
                    let r = fleet.standing.get(&provider);
                    m.set_standing(&provider, r.reputation_bps(), r.uptime_bps(now()))
                        .await;
                }
            }
            Err(e) => {
                tracing::warn!(provider = %provider, error = %e, "standing not persisted; kept");
                failed.push((provider, d));
            }
        }
    }
    fleet.standing.restore_pending(failed);
    // Other replicas' counts too, for providers with nothing pending here.
    if let Err(e) = load(db, fleet).await {
        tracing::warn!(error = %e, "provider standing not read back");
    }
}

/// Loads the records, then flushes every `EVERY` for good.
pub async fn run(db: Db, fleet: Arc<Registry>, market: Option<Arc<Market>>) {
    if let Err(e) = load(&db, &fleet).await {
        tracing::warn!(error = %e, "provider standing not loaded");
    }
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        flush(&db, &fleet, market.as_deref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use money::store::testing;

    #[tokio::test]
    async fn two_replicas_add_up_and_a_restart_keeps_the_record() {
        for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
            let db = Db::connect(&url).await.expect("db");
            let (a, b) = (Registry::default(), Registry::default());
            let p = "provider:house";
            a.standing.connected(p, now() - 100);
            for lost in [false, false, true] {
                a.standing.attempt(p, lost);
            }
            b.standing.attempt(p, false);
            flush(&db, &a, None).await;
            flush(&db, &b, None).await;
            // `b` read back both replicas' counts; `a` sees them next round.
            let rb = b.standing.get(p);
            assert_eq!((rb.jobs_ok, rb.jobs_lost), (3, 1), "{url}");
            assert!(rb.connected_s >= 100);
            flush(&db, &a, None).await;
            assert_eq!(a.standing.get(p).jobs_ok, 3);
            // Nothing pending: nothing written twice.
            flush(&db, &b, None).await;
            assert_eq!(b.standing.get(p).jobs_ok, 3);
            // A restarted server starts from the record.
            let c = Registry::default();
            assert_eq!(load(&db, &c).await.expect("load"), 1);
            let rc = c.standing.get(p);
            assert_eq!((rc.jobs_ok, rc.jobs_lost), (3, 1));
            assert_eq!(rc.reputation_bps(), rb.reputation_bps());
        }
    }
}
