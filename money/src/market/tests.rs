//! Market tests on both backends: quotes from the seeded house provider and
//! the region table; admin updates; a seeded random order flow whose
//! persisted book, reloaded, equals the one in memory, with every order's
//! trades adding up to what it filled.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::ledger::{HOUSE_PROVIDER, Ledger};
use crate::store::testing;

async fn dbs() -> Vec<Db> {
    let mut out = Vec::new();
    for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
        out.push(
            Db::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}")),
        );
    }
    out
}

const IDLE: Occupancy = Occupancy {
    running: 0,
    waiting: 0,
    capacity: 16,
};

#[tokio::test]
async fn quotes_follow_the_region_table_and_provider_profiles() {
    for db in dbs().await {
        let m = Market::load(db.clone(), 700).await.expect("market");
        let q = m.quote(HOUSE_PROVIDER, "m", IDLE, false).expect("quote");
        assert_eq!(
            (q.fee_bps, q.payout_bps),
            (700, 10_000),
            "full uptime earns placement, never a multiple of the user's money"
        );
        assert!(q.prices.cached_input < q.prices.input && q.prices.input < q.prices.output);
        let busy = m.quote(
            HOUSE_PROVIDER,
            "m",
            Occupancy {
                running: 16,
                waiting: 16,
                capacity: 16,
            },
            false,
        );
        let (idle, full) = (q.prices.output, busy.expect("busy").prices.output);
        assert!(
            (4 * idle - 3..=4 * idle).contains(&full),
            "x4 from idle to a full queue: {idle} {full}"
        );
        m.set_region_price("us-east", 260_000)
            .await
            .expect("region");
        assert!(
            m.quote(HOUSE_PROVIDER, "m", IDLE, false)
                .expect("quote")
                .prices
                .output
                > q.prices.output
        );
        assert!(matches!(
            m.set_region_price("x", 0).await,
            Err(MarketError::Invalid("price_per_kwh", _))
        ));
        let mut p = m.providers()[0].clone();
        p.profile.region = "mars".into();
        assert!(matches!(
            m.set_provider(p.clone()).await,
            Err(MarketError::UnknownRegion(_))
        ));
        p.profile.region = "eu-north".into();
        p.reputation_bps = 5_000;
        m.set_provider(p).await.expect("provider");
        let again = Market::load(db, 700).await.expect("reload");
        assert_eq!(again.regions()["us-east"], 260_000);
        assert_eq!(
            again
                .quote(HOUSE_PROVIDER, "m", IDLE, false)
                .expect("q")
                .payout_bps,
            5_000
        );
        assert!(matches!(
            again.quote("provider:none", "m", IDLE, false),
            Err(MarketError::UnknownProvider(_))
        ));
        assert!(
            Market::load(again.db.clone(), 2_000).await.is_err(),
            "fee outside 5-10%"
        );
    }
}

#[tokio::test]
async fn random_order_flow_persists_exactly_what_the_book_holds() {
    for db in dbs().await {
        let ledger = Ledger::offline(db.clone());
        let user = ledger
            .create_account(crate::ledger::accounts::AccountKind::User, "t", 0)
            .await
            .expect("user");
        let m = Market::load(db.clone(), 500).await.expect("market");
        let mut rng = StdRng::seed_from_u64(7);
        let mut ids: Vec<String> = Vec::new();
        let mut fills_total = 0u64;
        for _ in 0..150 {
            if rng.random_range(0..6) == 0 && !ids.is_empty() {
                let id: String = ids[rng.random_range(0..ids.len())].clone();
                let _ = m.cancel(&id, Some(&user.id)).await;
                continue;
            }
            let side = if rng.random_bool(0.5) {
                Side::Bid
            } else {
                Side::Ask
            };
            let new = NewOrder {
                key_id: None,
                side,
                instrument: "smol".into(),
                account_id: user.id.clone(),
                price: rng.random_range(90..110),
                quantity: rng.random_range(1..40),
                priority: rng.random_range(0..3),
                interruptible: false,
                expires_at: now() + 3600,
            };
            let (placed, fills) = m.submit(new).await.expect("submit");
            fills_total += fills.iter().map(|f| f.quantity).sum::<u64>();
            ids.push(placed.id);
        }
        assert!(fills_total > 0);
        let live = m.spot("smol", 100).await;
        let reloaded = Market::load(db.clone(), 500)
            .await
            .expect("reload")
            .spot("smol", 100)
            .await;
        assert_eq!(live, reloaded);
        // Every order's trades add up to what it filled.
        let bad: Vec<String> = sqlx::query_scalar(
            "SELECT o.id FROM orders o WHERE o.quantity - o.remaining <> CAST(COALESCE((SELECT SUM(t.quantity) \
             FROM trades t WHERE t.bid_id = o.id OR t.ask_id = o.id), 0) AS BIGINT)",
        )
        .fetch_all(&db.pool)
        .await
        .expect("check");
        assert!(bad.is_empty(), "{bad:?}");
        let traded = m.trades("smol", 1_000).await.expect("trades");
        assert_eq!(
            traded.iter().map(|t| t.quantity as u64).sum::<u64>(),
            fills_total
        );
        assert!(matches!(
            m.cancel("ord_missing", None).await,
            Err(MarketError::OrderNotFound(_))
        ));
    }
}

/// A ledger with no background recovery (the tests drive it).
async fn quiet_ledger(db: &Db) -> Ledger {
    let config = crate::ledger::LedgerConfig {
        heartbeat: std::time::Duration::from_secs(3600),
        stale_after: std::time::Duration::from_secs(3600),
        earnings_window: crate::ledger::EARNINGS_WINDOW,
    };
    Ledger::start(db.clone(), config).await.expect("ledger")
}

/// A market with money, on a fresh ledger.
async fn funded_market(db: Db) -> (Market, Ledger) {
    let l = quiet_ledger(&db).await;
    let m = Market::load(db, 700)
        .await
        .expect("market")
        .with_ledger(l.clone())
        .await
        .expect("with ledger");
    m.record_prices(
        "m",
        Prices {
            input: 100_000,
            cached_input: 10_000,
            output: 400_000,
        },
    )
    .await
    .expect("reference");
    (m, l)
}

/// A user account (`bidder`) and a provider account (`gpu`).
async fn bidder_and_seller(
    l: &Ledger,
) -> (
    crate::ledger::accounts::Account,
    crate::ledger::accounts::Account,
) {
    use crate::ledger::accounts::AccountKind;
    let user = l
        .create_account(AccountKind::User, "bidder", 0)
        .await
        .expect("user");
    let seller = l
        .create_account(AccountKind::Provider, "gpu", 0)
        .await
        .expect("p");
    (user, seller)
}

fn order(side: Side, account: &str, price: Amount, quantity: u64, ttl: i64) -> NewOrder {
    NewOrder {
        key_id: None,
        side,
        instrument: "m".into(),
        account_id: account.into(),
        price,
        quantity,
        priority: 0,
        interruptible: false,
        expires_at: now() + ttl,
    }
}

#[tokio::test]
async fn bids_hold_their_worst_case_and_fills_move_money_once() {
    for db in dbs().await {
        let (m, l) = funded_market(db).await;
        let (user, seller) = bidder_and_seller(&l).await;
        // 100 tok/s for an hour at 0.4 units per million tokens: 0.144 units.
        l.top_up(&user.id, 200_000, "bids").await.expect("top up");
        for (price, why) in [
            (i64::MAX, "past MAX_PRICE"),
            (400_000 * 11, "out of band"),
            (30_000, "out of band"),
        ] {
            let r = m.submit(order(Side::Bid, &user.id, price, 100, 3600)).await;
            assert!(
                matches!(r, Err(MarketError::Invalid("price", _))),
                "{why}: {r:?}"
            );
        }
        let broke = m
            .submit(order(Side::Bid, &user.id, 400_000, 1_000, 3600))
            .await;
        assert!(
            matches!(
                broke,
                Err(MarketError::Ledger(
                    crate::ledger::LedgerError::InsufficientQuota { .. }
                ))
            ),
            "{broke:?}"
        );
        let (bid, fills) = m
            .submit(order(Side::Bid, &user.id, 400_000, 100, 3600))
            .await
            .expect("bid");
        assert!(fills.is_empty());
        let a = l.account(&user.id).await.expect("a");
        assert_eq!((a.balance, a.held), (200_000, 144_000));
        // An ask fills 40 of the 100 at the resting bid's price, for the
        // bid's hour (the earlier expiry).
        let (_, fills) = m
            .submit(order(Side::Ask, &seller.id, 300_000, 40, 7200))
            .await
            .expect("ask");
        assert_eq!(fills.len(), 1);
        let a = l.account(&user.id).await.expect("a");
        let paid = 200_000 - a.balance;
        assert!((57_500..=57_600).contains(&paid), "{paid}");
        assert!(a.held <= 144_000 * 60 / 100 + 1 && a.held > 0, "{}", a.held);
        let p = l.account(&seller.id).await.expect("p");
        assert!(p.balance > 0 && p.balance < paid);
        // Cancelling releases the rest; nothing stays held, nothing twice.
        m.cancel(&bid.id, Some(&user.id)).await.expect("cancel");
        l.flush().await;
        let a = l.account(&user.id).await.expect("a");
        assert_eq!((a.balance, a.held), (200_000 - paid, 0));
        let audit = l.audit().await.expect("audit");
        assert!(audit.violations.is_empty(), "{:?}", audit.violations);
        assert_eq!(audit.open_holds, 0);
        // A bid filled at once holds nothing afterwards.
        m.submit(order(Side::Ask, &seller.id, 350_000, 1_000, 600))
            .await
            .expect("ask");
        let (b, fills) = m
            .submit(order(Side::Bid, &user.id, 400_000, 10, 60))
            .await
            .expect("bid");
        assert_eq!((b.remaining, fills.len()), (0, 1));
        l.flush().await;
        assert_eq!(l.account(&user.id).await.expect("a").held, 0);
        assert!(l.audit().await.expect("audit").violations.is_empty());
    }
}

#[tokio::test]
async fn bids_resting_without_a_hold_are_held_or_cancelled_when_money_connects() {
    use crate::ledger::accounts::AccountKind;
    for db in dbs().await {
        let l = quiet_ledger(&db).await;
        let rich = l
            .create_account(AccountKind::User, "rich", 0)
            .await
            .expect("a");
        let poor = l
            .create_account(AccountKind::User, "poor", 0)
            .await
            .expect("a");
        l.top_up(&rich.id, 1_000_000, "t").await.expect("top up");
        // Bids placed by a market without money (as before bids held any).
        let bare = Market::load(db.clone(), 700).await.expect("market");
        let (kept, _) = bare
            .submit(order(Side::Bid, &rich.id, 400_000, 10, 3600))
            .await
            .expect("bid");
        let (gone, _) = bare
            .submit(order(Side::Bid, &poor.id, 400_000, 10, 3600))
            .await
            .expect("bid");
        let m = Market::load(db, 700)
            .await
            .expect("reload")
            .with_ledger(l.clone())
            .await
            .expect("with ledger");
        assert!(
            l.account(&rich.id).await.expect("a").held > 0,
            "the funded bid is held"
        );
        assert!(
            m.cancel(&gone.id, None).await.is_err(),
            "the unfunded bid is cancelled"
        );
        m.cancel(&kept.id, None).await.expect("cancel");
        l.flush().await;
        assert_eq!(l.account(&rich.id).await.expect("a").held, 0);
        assert!(l.audit().await.expect("audit").violations.is_empty());
    }
}

#[tokio::test]
async fn a_keys_budget_bounds_its_bids_and_counts_their_fills() {
    use crate::ledger::accounts::AccountKind;
    use crate::store::keys::NewKey;
    for db in dbs().await {
        let (m, l) = funded_market(db).await;
        let seller = l
            .create_account(AccountKind::Provider, "gpu", 0)
            .await
            .expect("p");
        // 10 tok/s for 100 s at 400,000 ticks per million: 400 ticks.
        let new = NewKey {
            budget: Some(500),
            ..NewKey::named("trader")
        };
        let (key, _) = l.db.create_key(&new).await.expect("key");
        l.top_up(&key.account_id, 1_000_000, "t")
            .await
            .expect("top up");
        let bid = |quantity| NewOrder {
            key_id: Some(key.id.clone()),
            ..order(Side::Bid, &key.account_id, 400_000, quantity, 100)
        };
        let over = m.submit(bid(20)).await;
        assert!(
            matches!(
                over,
                Err(MarketError::Ledger(
                    crate::ledger::LedgerError::BudgetExceeded { .. }
                ))
            ),
            "{over:?}"
        );
        let (b, _) = m.submit(bid(10)).await.expect("within the budget");
        m.submit(order(Side::Ask, &seller.id, 300_000, 4, 600))
            .await
            .expect("ask");
        m.cancel(&b.id, None).await.expect("cancel");
        l.flush().await;
        let k =
            l.db.list_keys()
                .await
                .expect("keys")
                .into_iter()
                .find(|k| k.id == key.id)
                .expect("key");
        assert!(k.spent > 0 && k.spent <= 500, "{}", k.spent);
        let audit = l.audit().await.expect("audit");
        assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    }
}

#[tokio::test]
async fn each_fill_is_a_contract_that_covers_its_bidder_and_survives_a_restart() {
    for db in dbs().await {
        let (m, l) = funded_market(db.clone()).await;
        let (user, seller) = bidder_and_seller(&l).await;
        l.top_up(&user.id, 200_000, "bids").await.expect("top up");
        m.submit(order(Side::Ask, &seller.id, 350_000, 30, 600))
            .await
            .expect("ask");
        let (_, fills) = m
            .submit(order(Side::Bid, &user.id, 400_000, 20, 60))
            .await
            .expect("bid");
        assert_eq!(fills.len(), 1);
        let [c] = &m.contracts(Some(&user.id)).await[..] else {
            panic!("one contract");
        };
        assert_eq!(
            (c.seller.as_str(), c.price, c.quantity),
            (seller.id.as_str(), 350_000, 20)
        );
        assert!(m.contracts(Some(&seller.id)).await.is_empty());
        // It covers its bidder's requests while it has room (ten seconds
        // of 20 tok/s), for a seller that can serve them.
        let yes = |_: &str| true;
        assert!(
            m.cover(&seller.id, "m", 10, yes).await.is_none(),
            "not the seller's"
        );
        assert!(m.cover(&user.id, "m", 10, |_| false).await.is_none());
        let cover = m.cover(&user.id, "m", 150, yes).await.expect("covered");
        assert_eq!((cover.seller, cover.price), (seller.id.clone(), 350_000));
        assert!(
            m.cover(&user.id, "m", 100, yes).await.is_none(),
            "past its room"
        );
        // What is left shows (the bucket refills 20 tok/s meanwhile).
        let left = m.contracts(Some(&user.id)).await[0].room;
        assert!((50..60).contains(&left), "{left}");
        // A server started on the same database knows the contract (on
        // PostgreSQL with what is left of its bucket: 50 tokens).
        let again = Market::load(db, 700).await.expect("market");
        assert_eq!(again.contracts(Some(&user.id)).await.len(), 1);
        assert!(again.cover(&user.id, "m", 40, yes).await.is_some());
    }
}

#[tokio::test]
async fn replicas_on_one_postgres_trade_on_the_same_book_and_never_fill_twice() {
    use crate::ledger::accounts::AccountKind;
    let db = Db::connect(&testing::fresh_postgres_url().await)
        .await
        .expect("db");
    let (a, l) = funded_market(db.clone()).await;
    let (b, _) = funded_market(db.clone()).await;
    let seller = l
        .create_account(AccountKind::Provider, "gpu", 0)
        .await
        .expect("p");
    let mut users = Vec::new();
    for i in 0..8 {
        let u = l
            .create_account(AccountKind::User, &format!("u{i}"), 0)
            .await
            .expect("user");
        l.top_up(&u.id, 1_000_000, "bids").await.expect("top up");
        users.push(u.id);
    }
    // An ask on replica A is on replica B's book.
    a.submit(order(Side::Ask, &seller.id, 350_000, 40, 600))
        .await
        .expect("ask");
    assert_eq!(b.spot("m", 5).await.best_ask, Some(350_000));
    // Eight bids of 10 at once, half on each replica, against 40: exactly
    // 40 fill, never more.
    let (a, b) = (std::sync::Arc::new(a), std::sync::Arc::new(b));
    let tasks: Vec<_> = users
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let m = if i % 2 == 0 { a.clone() } else { b.clone() };
            let o = order(Side::Bid, u, 400_000, 10, 60);
            tokio::spawn(async move { m.submit(o).await })
        })
        .collect();
    let mut filled = 0;
    for t in tasks {
        let (_, fills) = t.await.expect("task").expect("bid");
        filled += fills.iter().map(|f| f.quantity).sum::<u64>();
    }
    assert_eq!(filled, 40);
    assert_eq!(a.spot("m", 5).await.best_ask, None);
    // The unfilled bids rest on both replicas' books; one cancels on the
    // other replica.
    let spot = b.spot("m", 5).await;
    assert_eq!(spot.bids.iter().map(|l| l.quantity).sum::<u64>(), 40);
    let resting = store::open_books(&db, now()).await.expect("books")["m"]
        .resting_bids()
        .next()
        .expect("a resting bid");
    a.cancel(&resting.id, Some(&resting.account_id))
        .await
        .expect("cancel on the other replica");
    assert_eq!(
        b.spot("m", 5)
            .await
            .bids
            .iter()
            .map(|l| l.quantity)
            .sum::<u64>(),
        30
    );
    l.flush().await;
    let audit = l.audit().await.expect("audit");
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
}

#[tokio::test]
async fn replicas_share_a_contracts_bucket_and_never_cover_more_than_was_bought() {
    let db = Db::connect(&testing::fresh_postgres_url().await)
        .await
        .expect("db");
    let (a, l) = funded_market(db.clone()).await;
    let (b, _) = funded_market(db).await;
    let (user, seller) = bidder_and_seller(&l).await;
    l.top_up(&user.id, 200_000, "bids").await.expect("top up");
    a.submit(order(Side::Ask, &seller.id, 350_000, 30, 600))
        .await
        .expect("ask");
    b.submit(order(Side::Bid, &user.id, 400_000, 20, 60))
        .await
        .expect("bid");
    // 20 tok/s banks 200 tokens: at most six requests of 30 between both
    // replicas (seven with what refills while they run), never twelve.
    let yes = |_: &str| true;
    let mut covered = 0;
    for _ in 0..10 {
        for m in [&a, &b] {
            covered += usize::from(m.cover(&user.id, "m", 30, yes).await.is_some());
        }
    }
    assert!((6..=7).contains(&covered), "{covered}");
}
