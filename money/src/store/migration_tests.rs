//! Migration 0006 (money in ticks) on both backends: every stored amount
//! and price written in micro-units is carried into ticks exactly, and a
//! value too large to carry stops the migration before anything changes.

use super::{Db, testing};

/// The last migration that counted micro-units.
const MICRO_UNITS: i64 = 5;

/// The largest micro-unit value that still fits in `i64` as ticks.
const LARGEST: i64 = i64::MAX / 10_000;

async fn at_micro_units() -> Vec<Db> {
    let mut out = Vec::new();
    for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
        let db = Db::open(&url).await.expect("open");
        db.migrator()
            .run_to(MICRO_UNITS, &db.pool)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        out.push(db);
    }
    out
}

async fn exec(db: &Db, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn scalar(db: &Db, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// One row in every table that holds money, in micro-units.
async fn fill(db: &Db, balance: i64) {
    for sql in [
        format!(
            "INSERT INTO accounts (id, kind, name, balance, held, credit_limit, created_at) \
             VALUES ('user:a', 'user', 'A', {balance}, 1000, 7, 0)"
        ),
        "INSERT INTO journal (id, kind, memo, created_at) VALUES ('tx1', 'topup', '', 0)".into(),
        format!(
            "INSERT INTO entries (tx_id, account_id, amount) VALUES ('tx1', 'user:a', {balance}), \
             ('tx1', 'deposits', -{balance})"
        ),
        "INSERT INTO instances (id, started_at, heartbeat_at) VALUES ('i', 0, 0)".into(),
        "INSERT INTO holds (request_id, account_id, model, provider_id, amount, price_input, \
         price_cached, price_output, fee_bps, payout_bps, instance_id, state, created_at, spent) \
         VALUES ('r1', 'user:a', 'm', 'provider:house', 1000, 5694, 569, 17408, 500, 10000, \
         'i', 'open', 0, 3)"
            .into(),
        "INSERT INTO usage_records (request_id, account_id, model, provider_id, prompt_tokens, \
         cached_tokens, completion_tokens, cost, provider_amount, fee, outcome, created_at) \
         VALUES ('r0', 'user:a', 'm', 'provider:house', 10, 0, 8, 313, 297, 16, 'finished', 0)"
            .into(),
        "INSERT INTO api_keys (id, name, prefix, secret_hash, created_at, updated_at, \
         account_id, budget, spent, held) VALUES \
         ('k1', 'k', 'sk', 'h1', 0, 0, 'user:a', 5000000, 12, 1000), \
         ('k2', 'k', 'sk', 'h2', 0, 0, 'user:a', NULL, 0, 0)"
            .into(),
        "INSERT INTO orders (id, side, instrument, account_id, price, quantity, remaining, \
         expires_at, state, created_at) VALUES ('o1', 'bid', 'm', 'user:a', 17408, 10, 10, 9, \
         'open', 0)"
            .into(),
        "INSERT INTO trades (id, instrument, price, quantity, bid_id, ask_id, created_at) \
         VALUES ('t1', 'm', 17408, 10, 'o1', 'o2', 0)"
            .into(),
        "INSERT INTO price_history (instrument, at, input_price, cached_price, output_price) \
         VALUES ('m', 0, 5694, 569, 17408)"
            .into(),
    ] {
        exec(db, &sql).await;
    }
}

#[tokio::test]
async fn money_is_carried_into_ticks_exactly() {
    for db in at_micro_units().await {
        fill(&db, LARGEST).await;
        db.migrator().run(&db.pool).await.expect("migrate");
        let checks = [
            ("SELECT balance FROM accounts WHERE id = 'user:a'", LARGEST),
            ("SELECT held FROM accounts WHERE id = 'user:a'", 1000),
            ("SELECT credit_limit FROM accounts WHERE id = 'user:a'", 7),
            (
                "SELECT amount FROM entries WHERE account_id = 'deposits'",
                -LARGEST,
            ),
            ("SELECT amount + spent FROM holds", 1003),
            (
                "SELECT price_input + price_cached + price_output FROM holds",
                23_671,
            ),
            ("SELECT cost FROM usage_records", 313),
            ("SELECT provider_amount + fee FROM usage_records", 313),
            ("SELECT budget FROM api_keys WHERE id = 'k1'", 5_000_000),
            ("SELECT spent + held FROM api_keys WHERE id = 'k1'", 1012),
            ("SELECT price FROM orders", 17_408),
            ("SELECT price FROM trades", 17_408),
            (
                "SELECT input_price + cached_price + output_price FROM price_history",
                23_671,
            ),
            (
                "SELECT depreciation_per_hour + network_per_hour FROM providers \
                 WHERE account_id = 'provider:house'",
                25_000,
            ),
        ];
        for (sql, micros) in checks {
            assert_eq!(scalar(&db, sql).await, micros * 10_000, "{sql}");
        }
        let unlimited = "SELECT COUNT(*) FROM api_keys WHERE id = 'k2' AND budget IS NULL";
        assert_eq!(scalar(&db, unlimited).await, 1, "no budget stays none");
        let kwh = "SELECT micros_per_kwh FROM region_prices WHERE region = 'us-east'";
        assert_eq!(
            scalar(&db, kwh).await,
            130_000,
            "electricity stays micro-units"
        );
        let sum = "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM entries";
        assert_eq!(scalar(&db, sum).await, 0);
    }
}

#[tokio::test]
async fn a_value_too_large_to_carry_stops_the_migration_and_changes_nothing() {
    for db in at_micro_units().await {
        fill(&db, LARGEST + 1).await;
        let err = db
            .migrator()
            .run(&db.pool)
            .await
            .expect_err("must refuse")
            .to_string();
        assert!(
            err.contains("amount_too_large_to_carry_into_ticks"),
            "{err}"
        );
        let balance = "SELECT balance FROM accounts WHERE id = 'user:a'";
        assert_eq!(scalar(&db, balance).await, LARGEST + 1);
        assert_eq!(scalar(&db, "SELECT price FROM orders").await, 17_408);
        let applied = "SELECT COUNT(*) FROM _sqlx_migrations WHERE version > 5";
        assert_eq!(scalar(&db, applied).await, 0);
    }
}
