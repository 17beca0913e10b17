//! The console overview's history points (a JSON sample every ten
//! seconds), kept so that a restarted server still shows the last hour.
//! Bounded: points older than a day are pruned as new ones come.

use sqlx::Row;

use super::{Db, StoreError};

/// How long points are kept (milliseconds).
const KEEP_MS: i64 = 24 * 3600 * 1000;

impl Db {
    /// Keeps the point taken at `t_ms` (a replica's point at the same
    /// millisecond replaces it) and prunes points older than a day.
    pub async fn save_point(&self, t_ms: i64, sample: &str) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM overview_points WHERE t = $1 OR t < $2")
            .bind(t_ms)
            .bind(t_ms - KEEP_MS)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO overview_points (t, sample) VALUES ($1, $2)")
            .bind(t_ms)
            .bind(sample)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The points taken since `since_ms`, oldest first.
    pub async fn points_since(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT sample FROM overview_points WHERE t >= $1 ORDER BY t")
            .bind(since_ms)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| r.try_get("sample"))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[tokio::test]
    async fn points_are_kept_in_order_and_pruned_past_a_day() {
        for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
            let db = Db::connect(&url).await.expect("db");
            let t = 1_800_000_000_000_i64;
            db.save_point(t - KEEP_MS - 1, "ancient")
                .await
                .expect("save");
            db.save_point(t - 20_000, "a").await.expect("save");
            db.save_point(t - 10_000, "b").await.expect("save");
            db.save_point(t - 10_000, "b2").await.expect("replace");
            db.save_point(t, "c").await.expect("save");
            let all = db.points_since(0).await.expect("read");
            assert_eq!(all, ["a", "b2", "c"], "the ancient one pruned");
            assert_eq!(
                db.points_since(t - 10_000).await.expect("read"),
                ["b2", "c"]
            );
        }
    }
}
