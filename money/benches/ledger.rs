//! Settlement throughput of the ledger on SQLite and on PostgreSQL: holds
//! placed for N requests, then all settled at once by C concurrent callers
//! (the batching writer commits them in as few transactions as it can).
//! Every settlement is checked (billed once) and the audit must be clean.
//!
//! `cargo bench -p money --bench ledger [-- N C]` (default 20000 256).

use std::time::Instant;

use money::ledger::accounts::AccountKind;
use money::ledger::holds::HoldRequest;
use money::ledger::{Closed, HOUSE_PROVIDER, Ledger, LedgerConfig, Outcome, Prices, Quote, Tokens};
use money::store::{Db, testing};

fn quote() -> Quote {
    Quote {
        provider_id: HOUSE_PROVIDER.into(),
        model: "bench".into(),
        prices: Prices {
            input: 150_000,
            cached_input: 15_000,
            output: 600_000,
        },
        fee_bps: 700,
        payout_bps: 10_000,
        stages: money::ledger::amount::Stages::one("cpu"),
    }
}

async fn run(name: &str, url: &str, n: usize, concurrency: usize) {
    let db = Db::connect(url).await.expect("database");
    let ledger = Ledger::start(db, LedgerConfig::default())
        .await
        .expect("ledger");
    let user = ledger
        .create_account(AccountKind::User, "bench", 0)
        .await
        .expect("account");
    let q = quote();
    let each = q.worst_case(512, 256);
    ledger
        .top_up(&user.id, each * n as i64, "bench")
        .await
        .expect("top up");
    let ids: Vec<String> = (0..n)
        .map(|i| format!("bench-{}-{i}", ledger.instance()))
        .collect();
    let t = Instant::now();
    for chunk in ids.chunks(concurrency) {
        let holds = chunk.iter().map(|id| {
            ledger.hold(HoldRequest {
                request_id: id,
                account_id: &user.id,
                key_id: None,
                quote: &q,
                amount: each,
                max_completion: None,
            })
        });
        for r in futures_util::future::join_all(holds).await {
            r.expect("hold");
        }
    }
    let hold_rate = n as f64 / t.elapsed().as_secs_f64();
    let tokens = Tokens {
        prompt: 512,
        cached: 128,
        completion: 200,
    };
    let t = Instant::now();
    let mut billed = 0;
    for chunk in ids.chunks(concurrency) {
        let settles = chunk
            .iter()
            .map(|id| ledger.settle(id, tokens, Outcome::Finished));
        for r in futures_util::future::join_all(settles).await {
            if matches!(r.expect("settle"), Closed::Billed { .. }) {
                billed += 1;
            }
        }
    }
    let settle_rate = n as f64 / t.elapsed().as_secs_f64();
    assert_eq!(billed, n, "every request billed once");
    let audit = ledger.audit().await.expect("audit");
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    println!(
        "{name:<9} {n} requests, {concurrency} concurrent: holds {hold_rate:>8.0}/s  settlements {settle_rate:>8.0}/s"
    );
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(20_000);
    let c = args.get(1).copied().unwrap_or(256);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        run("sqlite", &testing::sqlite_url(), n, c).await;
        run("postgres", &testing::fresh_postgres_url().await, n, c).await;
    });
}
