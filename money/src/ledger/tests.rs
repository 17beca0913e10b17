//! Ledger tests on both backends: a seeded random walk of top-ups, holds,
//! settlements, releases, repeated settlements, market orders and
//! cancellations, checked against a model, the audit and the order books
//! after every step; concurrent holds that must never
//! overdraw; key budgets; recovery of a dead instance's holds; penalties
//! and payouts, racing too.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::accounts::{Account, AccountKind};
use super::amount::{self, BPS, Prices};
use super::holds::HoldRequest;
use super::*;
use crate::store::keys::NewKey;
use crate::store::testing;

/// No background recovery during the tests (they drive it themselves).
const QUIET: LedgerConfig = LedgerConfig {
    heartbeat: Duration::from_secs(3600),
    stale_after: Duration::from_secs(3600),
    // Earnings final at once (the window has its own test).
    earnings_window: Duration::ZERO,
};

async fn ledgers() -> Vec<Ledger> {
    ledgers_with(QUIET).await
}

async fn ledgers_with(config: LedgerConfig) -> Vec<Ledger> {
    let mut out = Vec::new();
    for url in [testing::sqlite_url(), testing::fresh_postgres_url().await] {
        let db = Db::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        out.push(Ledger::start(db, config).await.expect("ledger"));
    }
    out
}

fn quote(payout_bps: i64) -> Quote {
    Quote {
        provider_id: HOUSE_PROVIDER.into(),
        model: "m".into(),
        prices: Prices {
            input: 150_000,
            cached_input: 15_000,
            output: 600_000,
        },
        fee_bps: 700,
        payout_bps,
        stages: amount::Stages::default(),
    }
}

/// A hold of `amount` for request `id` on `account`, with no key.
async fn hold_plain(
    l: &Ledger,
    id: &str,
    account: &str,
    q: &Quote,
    amount: Amount,
) -> Result<(), LedgerError> {
    let h = HoldRequest {
        request_id: id,
        account_id: account,
        key_id: None,
        quote: q,
        amount,
        max_completion: None,
    };
    l.hold(h).await
}

/// A user account topped up with `funds` and a provider account.
async fn user_and_provider(
    l: &Ledger,
    tag: &str,
    funds: Amount,
) -> (accounts::Account, accounts::Account) {
    let user = l
        .create_account(AccountKind::User, tag, 0)
        .await
        .expect("user");
    let provider = l
        .create_account(AccountKind::Provider, tag, 0)
        .await
        .expect("provider");
    l.top_up(&user.id, funds, tag).await.expect("top up");
    (user, provider)
}

async fn assert_clean(l: &Ledger) {
    let audit = l.audit().await.expect("audit");
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
}

/// A hold of `amount` for request `id` on `user` (no key).
fn user_hold<'a>(id: &'a str, user: &'a str, q: &'a Quote, amount: Amount) -> HoldRequest<'a> {
    HoldRequest {
        request_id: id,
        account_id: user,
        key_id: None,
        quote: q,
        amount,
        max_completion: None,
    }
}

/// A request in flight in the random walk.
struct Open {
    id: String,
    account: String,
    quote: Quote,
    amount: Amount,
    prompt: u64,
    max: u64,
}

/// What the model expects of each user account: (balance, held, limit).
type Expect = HashMap<String, (Amount, Amount, Amount)>;

#[tokio::test]
async fn random_walks_keep_every_invariant_on_both_backends() {
    for l in ledgers().await {
        for seed in [1u64, 2] {
            random_walk(&l, seed, 250).await;
        }
    }
}

async fn random_walk(l: &Ledger, seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut expect = Expect::new();
    let mut users = Vec::new();
    for limit in [0, 0, 1_000, 5_000] {
        let a = l
            .create_account(AccountKind::User, "walk", limit)
            .await
            .expect("account");
        expect.insert(a.id.clone(), (0, 0, limit));
        users.push(a.id);
    }
    // A second provider, whose workers share some requests' work.
    let worker = l
        .create_account(AccountKind::Provider, "worker", 0)
        .await
        .expect("provider")
        .id;
    let mut open: Vec<Open> = Vec::new();
    let mut closed: Vec<String> = Vec::new();
    // Holds refused and accepted: a walk must see both.
    let mut outcomes = [0usize; 2];
    for step in 0..steps {
        let user = users[rng.random_range(0..users.len())].clone();
        match rng.random_range(0..10) {
            0 if rng.random_bool(0.3) => extreme_step(l, &mut rng, &mut expect, &user).await,
            0 | 1 => {
                let amount = rng.random_range(1..2_500);
                l.top_up(&user, amount, "walk").await.expect("top up");
                expect.get_mut(&user).expect("user").0 += amount;
            }
            2..=4 => {
                let ok = try_hold(l, &mut rng, &mut expect, &mut open, &user, seed, step).await;
                outcomes[usize::from(ok)] += 1;
            }
            5..=7 if !open.is_empty() => {
                let o = open.swap_remove(rng.random_range(0..open.len()));
                settle_one(l, &mut rng, &mut expect, &o, &worker).await;
                closed.push(o.id);
            }
            8 if !open.is_empty() => {
                let o = open.swap_remove(rng.random_range(0..open.len()));
                assert_eq!(l.release(&o.id).await.expect("release"), Closed::Released);
                expect.get_mut(&o.account).expect("user").1 -= o.amount;
                closed.push(o.id);
            }
            9 if !closed.is_empty() && rng.random_bool(0.25) => {
                // A spot check failed on a closed request: claw the
                // worker's pay back (at most what it has), refund the user,
                // once per key.
                let id = &closed[rng.random_range(0..closed.len())];
                let (pay, refund) = (rng.random_range(0..5_000), rng.random_range(0..5_000));
                let key = format!("{id}:{step}");
                let before = l.account(&worker).await.expect("worker").balance;
                let got = l
                    .clawback(&key, &worker, &user, pay, refund, "walk")
                    .await
                    .expect("clawback");
                let (_, clawed) = got.expect("a fresh key");
                assert!(
                    clawed <= pay && clawed <= before.max(0),
                    "{clawed} of {pay}"
                );
                expect.get_mut(&user).expect("user").0 += refund;
                let again = l.clawback(&key, &worker, &user, pay, refund, "walk").await;
                assert_eq!(again.expect("repeat"), None);
            }
            9 if rng.random_bool(0.5) => market_step(l, &mut rng, &user).await,
            _ if !closed.is_empty() => {
                let id = &closed[rng.random_range(0..closed.len())];
                let t = Tokens {
                    prompt: 1,
                    cached: 0,
                    completion: 1,
                };
                assert_eq!(
                    l.settle(id, t, Outcome::Finished).await.expect("again"),
                    Closed::AlreadyClosed
                );
                assert_eq!(l.release(id).await.expect("again"), Closed::AlreadyClosed);
            }
            _ => {}
        }
        assert_clean(l).await;
        market(l)
            .await
            .check()
            .await
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        if step % 25 == 0 {
            for (id, &(balance, held, _)) in &expect {
                let a = l.account(id).await.expect("account");
                assert_eq!((a.balance, a.held), (balance, held), "{id} at step {step}");
            }
        }
    }
    assert!(
        outcomes[0] > 5 && outcomes[1] > 5 && closed.len() > 20,
        "{outcomes:?}"
    );
}

/// Amounts at and past every bound: each must be refused (and change
/// nothing) or fit the bounds, never wrap or corrupt a balance.
const EXTREMES: [Amount; 9] = [
    i64::MAX,
    i64::MIN,
    -1,
    0,
    amount::MAX_AMOUNT,
    amount::MAX_AMOUNT + 1,
    amount::MAX_BALANCE,
    i64::MAX / 2 + 1,
    9_223_372_036_854_000_000,
];

/// An extreme top-up, credit limit or hold; the model says what must
/// happen, and a refusal must leave the account as it was.
async fn extreme_step(l: &Ledger, rng: &mut StdRng, expect: &mut Expect, user: &str) {
    let amount = EXTREMES[rng.random_range(0..EXTREMES.len())];
    let before = l.account(user).await.expect("account");
    let e = expect.get_mut(user).expect("user");
    match rng.random_range(0..4) {
        0 => {
            let fits = amount::check_amount("x", amount).is_ok()
                && e.0
                    .checked_add(amount)
                    .is_some_and(|b| b <= amount::MAX_BALANCE);
            let r = l.top_up(user, amount, "extreme").await;
            assert_eq!(r.is_ok(), fits, "top-up of {amount}: {r:?}");
            if fits {
                e.0 += amount;
            } else {
                assert!(matches!(r, Err(LedgerError::InvalidAmount(_))), "{r:?}");
            }
        }
        1 => {
            let r = l.top_up(DEPOSITS, amount.max(1), "extreme").await;
            assert!(r.is_err(), "a top-up of deposits: {r:?}");
            let r = l.top_up(TREASURY, amount.max(1), "extreme").await;
            assert!(r.is_err(), "a top-up of the treasury: {r:?}");
        }
        2 => {
            let fits = (0..=amount::MAX_AMOUNT).contains(&amount) && e.0 - e.1 >= -amount;
            let r = l.set_credit_limit(user, amount).await;
            assert_eq!(r.is_ok(), fits, "credit limit {amount}: {r:?}");
            if fits {
                e.2 = amount;
            }
        }
        _ => {
            let q = quote(BPS);
            let id = format!("extreme-{}-{}", l.instance(), rng.random::<u64>());
            let r = l.hold(user_hold(&id, user, &q, amount)).await;
            if (0..=amount::MAX_AMOUNT).contains(&amount) {
                let covers = e.0 - e.1 + e.2 >= amount;
                match r {
                    Ok(()) if covers => {
                        assert_eq!(l.release(&id).await.expect("release"), Closed::Released);
                    }
                    Err(LedgerError::InsufficientQuota { .. }) if !covers => {}
                    r => panic!("hold of {amount} (covered: {covers}): {r:?}"),
                }
            } else {
                assert!(matches!(r, Err(LedgerError::InvalidAmount(_))), "{r:?}");
            }
        }
    }
    let after = l.account(user).await.expect("account");
    assert_eq!(
        (after.balance, after.held),
        (e.0, e.1),
        "{user} after {amount}"
    );
    assert_eq!(after.credit_limit, e.2);
    if amount <= 0 || amount > amount::MAX_BALANCE {
        assert_eq!(after, before, "nothing changes");
    }
    l.accounts().await.expect("every account still reads");
}

/// The walk's market (one per database, loaded on first use).
async fn market(l: &Ledger) -> std::sync::Arc<crate::market::Market> {
    use std::sync::{Arc, Mutex};
    static MARKETS: Mutex<Vec<(String, Arc<crate::market::Market>)>> = Mutex::new(Vec::new());
    let key = l.instance().to_string();
    let found = MARKETS
        .lock()
        .expect("markets")
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, m)| m.clone());
    if let Some(m) = found {
        return m;
    }
    let m = Arc::new(
        crate::market::Market::load(l.db.clone(), 700)
            .await
            .expect("market"),
    );
    MARKETS.lock().expect("markets").push((key, m.clone()));
    m
}

/// A bid or ask from the walk's user (or a cancellation of a random order).
async fn market_step(l: &Ledger, rng: &mut StdRng, user: &str) {
    use crate::market::NewOrder;
    use crate::market::book::Side;
    let m = market(l).await;
    if rng.random_bool(0.2) {
        m.cancel_all("walk", user).await.expect("cancel");
        return;
    }
    let side = if rng.random_bool(0.5) {
        Side::Bid
    } else {
        Side::Ask
    };
    let order = NewOrder {
        key_id: None,
        side,
        instrument: "walk".into(),
        account_id: user.to_string(),
        price: rng.random_range(95..105),
        quantity: rng.random_range(1..30),
        priority: rng.random_range(0..3),
        interruptible: rng.random_bool(0.3),
        expires_at: crate::store::now() + rng.random_range(1..5),
    };
    m.submit(order).await.expect("order");
}

async fn try_hold(
    l: &Ledger,
    rng: &mut StdRng,
    expect: &mut Expect,
    open: &mut Vec<Open>,
    user: &str,
    seed: u64,
    step: usize,
) -> bool {
    let mut q = quote([5_000, BPS, 12_000][rng.random_range(0..3)]);
    q.fee_bps = rng.random_range(500..=1_000);
    let (prompt, max) = (rng.random_range(1..4_000), rng.random_range(1..2_000));
    let amount = q.worst_case(prompt, max);
    let id = format!("req-{}-{seed}-{step}", l.instance());
    let mut h = user_hold(&id, user, &q, amount);
    h.max_completion = Some(max);
    let (balance, held, limit) = expect[user];
    let fits = balance - held - amount >= -limit;
    match l.hold(h).await {
        Ok(()) => {
            assert!(
                fits,
                "hold of {amount} accepted with {balance}/{held}/{limit}"
            );
            expect.get_mut(user).expect("user").1 += amount;
            let account = user.to_string();
            open.push(Open {
                id,
                account,
                quote: q,
                amount,
                prompt,
                max,
            });
            true
        }
        Err(LedgerError::InsufficientQuota { need, available }) => {
            assert!(!fits);
            assert_eq!((need, available), (amount, balance - held + limit));
            false
        }
        Err(e) => panic!("hold: {e}"),
    }
}

async fn settle_one(l: &Ledger, rng: &mut StdRng, expect: &mut Expect, o: &Open, worker: &str) {
    let t = Tokens {
        prompt: o.prompt,
        cached: rng.random_range(0..=o.prompt),
        completion: rng.random_range(0..=o.max),
    };
    let outcome = [Outcome::Finished, Outcome::Cut, Outcome::Failed][rng.random_range(0..3)];
    let want = if outcome == Outcome::Failed {
        0
    } else {
        o.quote.cost(t)
    };
    // Half the requests ran (partly) on executors of other providers:
    // the house, the worker's provider, and names that are no provider
    // account (their part stays with the treasury), each at its prices.
    let names = [HOUSE_PROVIDER, worker, "provider:ghost", "user:local"];
    let work: Vec<settle::Work> = (0..rng.random_range(0..4))
        .map(|_| settle::Work {
            provider: names[rng.random_range(0..names.len())].to_string(),
            prices: o.quote.prices,
            payout_bps: rng.random_range(0..=20_000),
            tokens: Tokens {
                prompt: o.prompt,
                cached: 0,
                completion: rng.random_range(0..=t.completion.max(1)),
            },
        })
        .collect();
    let got = if rng.random_bool(0.5) {
        l.settle(&o.id, t, outcome).await
    } else {
        let who = settle::Attribution { work, stages: None };
        l.settle_shared(&o.id, t, outcome, who).await
    }
    .expect("settle");
    assert_eq!(got, Closed::Billed { cost: want });
    let e = expect.get_mut(&o.account).expect("user");
    e.0 -= want;
    e.1 -= o.amount;
    let rec = l.usage_of(&o.id).await.expect("usage").expect("recorded");
    assert_eq!(
        (rec.cost, rec.completion_tokens as u64),
        (want, t.completion)
    );
    assert_eq!(rec.provider_amount + rec.fee, want);
    // Whatever the work, its multipliers and its prices: the providers
    // are paid at most what the user paid less the protocol fee.
    let fee = amount::split_fee(want, o.quote.fee_bps).treasury;
    assert!(
        rec.provider_amount >= 0 && rec.fee >= fee,
        "{rec:?} for {want}"
    );
}

#[tokio::test]
async fn the_audit_reports_overpaid_providers_and_tokens_past_max_tokens() {
    for l in ledgers().await {
        let user = l
            .create_account(AccountKind::User, "u", 0)
            .await
            .expect("user");
        let provider = l
            .create_account(AccountKind::Provider, "p", 0)
            .await
            .expect("provider");
        l.top_up(&user.id, 1_000_000, "t").await.expect("top up");
        let q = quote(BPS);
        let id = format!("audit-{}", l.instance());
        let mut h = user_hold(&id, &user.id, &q, q.worst_case(1_000, 100));
        h.max_completion = Some(100);
        l.hold(h).await.expect("hold");
        let t = Tokens {
            prompt: 1_000,
            cached: 0,
            completion: 100,
        };
        let who = settle::Attribution {
            work: vec![settle::Work {
                provider: provider.id.clone(),
                prices: q.prices,
                payout_bps: BPS,
                tokens: t,
            }],
            stages: None,
        };
        l.settle_shared(&id, t, Outcome::Finished, who)
            .await
            .expect("settle");
        assert_clean(&l).await;
        // What a payout multiplier over 1x once wrote: the provider paid
        // more than the user, a negative fee (the books still balance).
        let pool = &l.db.pool;
        sqlx::query(
            "UPDATE usage_records SET provider_amount = cost + 5, fee = -5 WHERE request_id = $1",
        )
        .bind(&id)
        .execute(pool)
        .await
        .expect("tamper");
        let tx = format!("usage:{id}");
        for (acct, delta) in [(provider.id.as_str(), 5 + 1), (TREASURY, -(5 + 1))] {
            sqlx::query(
                "UPDATE entries SET amount = amount + $1 WHERE tx_id = $2 AND account_id = $3",
            )
            .bind(delta)
            .bind(&tx)
            .bind(acct)
            .execute(pool)
            .await
            .expect("tamper");
            sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
                .bind(delta)
                .bind(acct)
                .execute(pool)
                .await
                .expect("tamper");
        }
        sqlx::query("UPDATE usage_records SET completion_tokens = 101 WHERE request_id = $1")
            .bind(&id)
            .execute(pool)
            .await
            .expect("tamper");
        let v = l.audit().await.expect("audit").violations;
        for want in [
            "providers paid more than the user paid less the protocol fee",
            "completion tokens billed past the request's max_tokens",
        ] {
            assert!(v.iter().any(|x| x.starts_with(want)), "{want}: {v:?}");
        }
        assert!(
            !v.iter().any(|x| x.contains("sum to zero")),
            "the double entry still balances: {v:?}"
        );
    }
}

#[tokio::test]
async fn concurrent_holds_never_overdraw_and_concurrent_settlements_bill_once() {
    for l in ledgers().await {
        let user = l
            .create_account(AccountKind::User, "race", 0)
            .await
            .expect("user");
        let q = quote(BPS);
        let each = q.worst_case(1000, 100);
        l.top_up(&user.id, each * 25, "race").await.expect("top up");
        let tasks: Vec<_> = (0..60)
            .map(|i| {
                let (l, q, account) = (l.clone(), q.clone(), user.id.clone());
                tokio::spawn(async move {
                    let id = format!("race-{}-{i}", l.instance());
                    hold_plain(&l, &id, &account, &q, each).await.map(|()| id)
                })
            })
            .collect();
        let mut held = Vec::new();
        for t in tasks {
            match t.await.expect("task") {
                Ok(id) => held.push(id),
                Err(LedgerError::InsufficientQuota { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(held.len(), 25, "exactly the funded number of holds");
        // Every hold settled three times at once: billed once each.
        let t = Tokens {
            prompt: 1000,
            cached: 0,
            completion: 100,
        };
        let settles: Vec<_> = held
            .iter()
            .flat_map(|id| (0..3).map(move |_| id.clone()))
            .map(|id| {
                let l = l.clone();
                tokio::spawn(async move { l.settle(&id, t, Outcome::Finished).await })
            })
            .collect();
        let mut billed = 0;
        for s in settles {
            if let Closed::Billed { cost } = s.await.expect("task").expect("settle") {
                assert_eq!(cost, each);
                billed += 1;
            }
        }
        assert_eq!(billed, 25);
        let a = l.account(&user.id).await.expect("account");
        assert_eq!((a.balance, a.held), (0, 0));
        assert_clean(&l).await;
    }
}

#[tokio::test]
async fn key_budgets_cap_spending() {
    for l in ledgers().await {
        let q = quote(BPS);
        let each = q.worst_case(100, 10);
        let new = NewKey {
            budget: Some(each * 2),
            ..NewKey::named("budget")
        };
        let (key, _) = l.db.create_key(&new).await.expect("key");
        l.top_up(&key.account_id, each * 10, "budget")
            .await
            .expect("top up");
        let mut results = Vec::new();
        for i in 0..3 {
            let id = format!("budget-{}-{i}", l.instance());
            let h = HoldRequest {
                request_id: &id,
                account_id: &key.account_id,
                key_id: Some(&key.id),
                quote: &q,
                amount: each,
                max_completion: None,
            };
            results.push(l.hold(h).await.map(|()| id));
        }
        assert!(
            matches!(results[2], Err(LedgerError::BudgetExceeded { .. })),
            "{:?}",
            results[2]
        );
        let first = results[0].as_ref().expect("first");
        let t = Tokens {
            prompt: 100,
            cached: 0,
            completion: 5,
        };
        let Closed::Billed { cost } = l.settle(first, t, Outcome::Cut).await.expect("settle")
        else {
            panic!("not billed");
        };
        assert!(cost < each, "a cut request pays for what it used");
        // Releasing the other hold makes room for a full request again.
        l.release(results[1].as_ref().expect("second"))
            .await
            .expect("release");
        let id = format!("budget-{}-3", l.instance());
        let h = HoldRequest {
            request_id: &id,
            account_id: &key.account_id,
            key_id: Some(&key.id),
            quote: &q,
            amount: each,
            max_completion: None,
        };
        l.hold(h).await.expect("room again");
        assert_clean(&l).await;
    }
}

#[tokio::test]
async fn holds_of_a_dead_instance_are_settled_from_checkpoints_or_released_never_twice() {
    for l in ledgers().await {
        let user = l
            .create_account(AccountKind::User, "crash", 0)
            .await
            .expect("user");
        l.top_up(&user.id, 1_000_000, "crash")
            .await
            .expect("top up");
        let q = quote(BPS);
        let ids: Vec<String> = (0..3)
            .map(|i| format!("crash-{}-{i}", l.instance()))
            .collect();
        for id in &ids {
            let h = HoldRequest {
                request_id: id,
                account_id: &user.id,
                key_id: None,
                quote: &q,
                amount: 1000,
                max_completion: None,
            };
            l.hold(h).await.expect("hold");
        }
        let t = Tokens {
            prompt: 10,
            cached: 0,
            completion: 10,
        };
        l.settle(&ids[0], t, Outcome::Finished)
            .await
            .expect("settle");
        // A running request checkpoints what it used so far.
        let used = Tokens {
            prompt: 10,
            cached: 0,
            completion: 4,
        };
        l.checkpoint_later(&ids[2], used);
        l.flush().await;
        // A second instance is alive: a live instance's holds are kept.
        let other = Ledger::start(l.db.clone(), QUIET).await.expect("second");
        let none = recovery::recover_dead(&other.db, Duration::from_secs(15))
            .await
            .expect("sweep");
        assert_eq!(none, recovery::Recovered::default());
        // The first instance goes silent.
        sqlx::query("UPDATE instances SET heartbeat_at = 0 WHERE id = $1")
            .bind(l.instance())
            .execute(&l.db.pool)
            .await
            .expect("silence");
        let r = recovery::recover_dead(&other.db, Duration::from_secs(15))
            .await
            .expect("sweep");
        assert_eq!((r.settled, r.released), (1, 1));
        assert_eq!(
            other
                .settle(&ids[1], t, Outcome::Finished)
                .await
                .expect("late"),
            Closed::AlreadyClosed
        );
        let rec = other
            .usage_of(&ids[2])
            .await
            .expect("usage")
            .expect("billed");
        assert_eq!((rec.outcome.as_str(), rec.completion_tokens), ("cut", 4));
        let a = other.account(&user.id).await.expect("account");
        assert_eq!(a.held, 0);
        assert_eq!(a.balance, 1_000_000 - q.cost(t) - q.cost(used));
        assert_clean(&other).await;
    }
}

#[tokio::test]
async fn providers_pay_penalties_to_the_treasury_within_their_funds() {
    for l in ledgers().await {
        let user = l
            .create_account(AccountKind::User, "pen", 0)
            .await
            .expect("user");
        let provider = l
            .create_account(AccountKind::Provider, "gpu", 0)
            .await
            .expect("provider");
        l.top_up(&user.id, 1_000_000, "pen").await.expect("top up");
        let q = Quote {
            provider_id: provider.id.clone(),
            ..quote(BPS)
        };
        let id = format!("pen-{}", l.instance());
        let amount = q.worst_case(10_000, 10_000);
        let h = HoldRequest {
            request_id: &id,
            account_id: &user.id,
            key_id: None,
            quote: &q,
            amount,
            max_completion: None,
        };
        l.hold(h).await.expect("hold");
        let t = Tokens {
            prompt: 10_000,
            cached: 0,
            completion: 10_000,
        };
        l.settle(&id, t, Outcome::Finished).await.expect("settle");
        let earned = l.account(&provider.id).await.expect("provider").balance;
        assert!(earned > 100, "{earned}");
        l.penalize(&provider.id, 100, "late")
            .await
            .expect("penalty");
        assert_eq!(
            l.account(&provider.id).await.expect("p").balance,
            earned - 100
        );
        let too_much = l.penalize(&provider.id, earned, "again").await;
        assert!(
            matches!(too_much, Err(LedgerError::InsufficientQuota { .. })),
            "{too_much:?}"
        );
        assert!(matches!(
            l.penalize(&user.id, 1, "x").await,
            Err(LedgerError::WrongAccount(_))
        ));
        let j = l
            .journal(Some(&provider.id), None, 10)
            .await
            .expect("journal");
        assert_eq!(j.len(), 2);
        assert_eq!(j.iter().filter(|t| t.kind == "penalty").count(), 1);
        let only = l
            .journal(Some(&provider.id), Some("penalty"), 10)
            .await
            .expect("journal");
        assert_eq!(only.len(), 1, "the kind filter");
        assert_eq!(only[0].kind, "penalty");
        let none = l
            .journal(None, Some("no-such-kind"), 10)
            .await
            .expect("journal");
        assert!(none.is_empty());
        assert_clean(&l).await;
    }
}

/// Earnings pending for an hour.
const WINDOWED: LedgerConfig = LedgerConfig {
    earnings_window: Duration::from_secs(3600),
    ..QUIET
};

/// A user, and a provider holding `final_funds` of old money and the
/// pending pay of one request (`tokens` prompt and completion tokens,
/// settled); the request's id.
async fn with_pending_pay(
    l: &Ledger,
    tag: &str,
    final_funds: Amount,
    tokens: u64,
) -> (Account, Account, String) {
    let (user, provider) = user_and_provider(l, tag, 1_000_000).await;
    l.top_up(&provider.id, final_funds, "old money")
        .await
        .expect("final funds");
    let q = Quote {
        provider_id: provider.id.clone(),
        ..quote(BPS)
    };
    let id = format!("{tag}-{}", l.instance());
    l.hold(user_hold(&id, &user.id, &q, q.worst_case(tokens, tokens)))
        .await
        .expect("hold");
    let t = Tokens {
        prompt: tokens,
        cached: 0,
        completion: tokens,
    };
    l.settle(&id, t, Outcome::Finished).await.expect("settle");
    (user, provider, id)
}

#[tokio::test]
async fn earnings_stay_pending_for_the_window_clawable_but_not_penalizable() {
    for l in ledgers_with(WINDOWED).await {
        let (user, provider, id) = with_pending_pay(&l, "w", 50, 10_000).await;
        let balance = l.account(&provider.id).await.expect("p").balance;
        let pending = l.pending_earnings(&provider.id).await.expect("pending");
        assert_eq!(pending, balance - 50, "the settlement's pay is pending");
        // Only the final 50 can be taken by a penalty.
        assert!(matches!(
            l.penalize(&provider.id, 51, "fine").await,
            Err(LedgerError::InsufficientQuota { available: 50, .. })
        ));
        l.penalize(&provider.id, 50, "fine")
            .await
            .expect("final funds");
        // A clawback reaches the pending pay.
        let key = format!("{id}:1:1");
        let (_, clawed) = l
            .clawback(&key, &provider.id, &user.id, pending, pending, "caught")
            .await
            .expect("clawback")
            .expect("done");
        assert_eq!(clawed, pending);
        assert_eq!(l.account(&provider.id).await.expect("p").balance, 0);
        assert_clean(&l).await;
    }
}

#[tokio::test]
async fn spend_sums_each_bucket_of_one_account_or_all() {
    for l in ledgers().await {
        let (user, provider) = user_and_provider(&l, "spend", 1_000_000).await;
        let q = Quote {
            provider_id: provider.id.clone(),
            ..quote(BPS)
        };
        let mut total = 0;
        for i in 0..3 {
            let id = format!("spend-{i}-{}", l.instance());
            l.hold(user_hold(&id, &user.id, &q, q.worst_case(100, 100)))
                .await
                .expect("hold");
            let t = Tokens {
                prompt: 100,
                cached: 0,
                completion: 10 * (i + 1),
            };
            l.settle(&id, t, Outcome::Finished).await.expect("settle");
            total += q.cost(t);
        }
        let mine = l
            .spend(Some(&user.id), None, 0, 86_400)
            .await
            .expect("spend");
        assert_eq!(mine.len(), 1, "one day's bucket: {mine:?}");
        assert_eq!((mine[0].cost, mine[0].requests), (total, 3));
        assert_eq!(mine[0].at % 86_400, 0);
        let nobody = l
            .spend(Some("user:nobody"), None, 0, 3600)
            .await
            .expect("spend");
        assert!(nobody.is_empty());
        let later = l
            .spend(None, None, crate::store::now() + 10, 3600)
            .await
            .expect("spend");
        assert!(later.is_empty(), "nothing after now");
        let earned = l
            .earned_by_time(&provider.id, 0, 86_400)
            .await
            .expect("earned");
        assert_eq!(earned.len(), 1, "{earned:?}");
        assert_eq!(earned[0].jobs, 3);
        let paid = l.account(&provider.id).await.expect("provider").balance;
        assert_eq!(earned[0].earned, paid, "every credit counted once");
    }
}

#[tokio::test]
async fn a_payout_moves_final_funds_out_once_and_leaves_pending_pay() {
    for l in ledgers_with(WINDOWED).await {
        let (user, provider, _) = with_pending_pay(&l, "pay", 70, 1_000).await;
        let pending = l.pending_earnings(&provider.id).await.expect("pending");
        assert!(pending > 0);
        assert_eq!(l.final_funds(&provider.id).await.expect("final"), 70);
        assert!(matches!(
            l.payout(&provider.id, 71, "too much").await,
            Err(LedgerError::InsufficientQuota { available: 70, .. })
        ));
        assert!(matches!(
            l.payout(&user.id, 1, "a user").await,
            Err(LedgerError::WrongAccount(_))
        ));
        assert!(l.payout(&provider.id, 0, "nothing").await.is_err());
        l.payout(&provider.id, 30, "to my bank")
            .await
            .expect("payout");
        l.payout(&provider.id, 40, "the rest")
            .await
            .expect("payout");
        assert!(l.payout(&provider.id, 1, "again").await.is_err());
        let p = l.account(&provider.id).await.expect("p");
        assert_eq!(p.balance, pending, "only the pending pay is left");
        assert_eq!(
            l.account(super::PAYOUTS).await.expect("payouts").balance,
            70
        );
        let paid = l
            .journal(Some(&provider.id), Some("payout"), 10)
            .await
            .expect("journal");
        assert_eq!(paid.len(), 2);
        assert_clean(&l).await;
    }
}

/// Payouts and penalties racing for one provider's final funds: each
/// passes the first check alone, and only the check inside the transfer
/// keeps the pending pay out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_payouts_and_penalties_never_reach_pending_pay() {
    for l in ledgers_with(WINDOWED).await {
        let (_, provider, _) = with_pending_pay(&l, "race", 100, 1_000).await;
        let pending = l.pending_earnings(&provider.id).await.expect("pending");
        assert!(pending > 0);
        for round in 0..4 {
            let before = l.final_funds(&provider.id).await.expect("final");
            let take = before * 2 / 3;
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let (l, p) = (l.clone(), provider.id.clone());
                    tokio::spawn(async move {
                        if i % 2 == 0 {
                            l.payout(&p, take, "race").await
                        } else {
                            l.penalize(&p, take, "race").await
                        }
                    })
                })
                .collect();
            let mut won = 0;
            for t in tasks {
                match t.await.expect("task") {
                    Ok(_) => won += 1,
                    Err(LedgerError::InsufficientQuota { .. }) => {}
                    Err(e) => panic!("round {round}: {e}"),
                }
            }
            assert_eq!(
                won, 1,
                "round {round}: {take} of {before} taken {won} times"
            );
            let after = l.final_funds(&provider.id).await.expect("final");
            assert_eq!(after, before - take, "round {round}");
            assert_eq!(l.pending_earnings(&provider.id).await.expect("p"), pending);
            l.top_up(&provider.id, 100, "more").await.expect("top up");
        }
        assert_clean(&l).await;
    }
}

#[tokio::test]
async fn a_clawback_takes_the_pay_back_and_refunds_the_user_once() {
    for l in ledgers().await {
        let user = l
            .create_account(AccountKind::User, "claw", 0)
            .await
            .expect("user");
        let provider = l
            .create_account(AccountKind::Provider, "cheat", 0)
            .await
            .expect("provider");
        l.top_up(&provider.id, 1_000, "earned")
            .await
            .expect("top up");
        let balance = |id: String| {
            let l = l.clone();
            async move { l.account(&id).await.expect("account").balance }
        };
        let key = format!("req-{}:1:1", l.instance());
        let (_, clawed) = l
            .clawback(&key, &provider.id, &user.id, 300, 400, "caught")
            .await
            .expect("clawback")
            .expect("done");
        assert_eq!(clawed, 300);
        assert_eq!(balance(provider.id.clone()).await, 700);
        assert_eq!(balance(user.id.clone()).await, 400);
        // Once per key.
        let again = l
            .clawback(&key, &provider.id, &user.id, 300, 400, "caught")
            .await
            .expect("repeat");
        assert_eq!(again, None);
        assert_eq!(balance(provider.id.clone()).await, 700);
        // Never more than the provider has (the treasury bears the rest);
        // prepaid capacity refunds nothing.
        let key2 = format!("req2-{}:1:1", l.instance());
        let (_, clawed) = l
            .clawback(&key2, &provider.id, &user.id, 5_000, 0, "caught")
            .await
            .expect("no refund")
            .expect("done");
        assert_eq!(clawed, 700);
        assert_eq!(balance(provider.id.clone()).await, 0);
        assert_eq!(balance(user.id.clone()).await, 400);
        // Only providers are clawed from; amounts are checked.
        assert!(matches!(
            l.clawback("k3", &user.id, &provider.id, 1, 1, "x").await,
            Err(LedgerError::WrongAccount(_))
        ));
        assert!(matches!(
            l.clawback("k4", &provider.id, &user.id, -1, 1, "x").await,
            Err(LedgerError::InvalidAmount(_))
        ));
        let j = l
            .journal(Some(&provider.id), None, 10)
            .await
            .expect("journal");
        assert_eq!(j.iter().filter(|t| t.kind == "clawback").count(), 2);
        assert_clean(&l).await;
    }
}

#[tokio::test]
async fn a_clawback_awaits_its_requests_settlement_and_takes_back_exactly_the_attempts_pay() {
    use super::clawback::Clawback;
    use super::settle::Work;
    for l in ledgers().await {
        let (user, provider) = user_and_provider(&l, "claw", 1_000_000).await;
        let q = Quote {
            provider_id: provider.id.clone(),
            ..quote(BPS)
        };
        let id = format!("await-{}", l.instance());
        l.hold(user_hold(&id, &user.id, &q, q.worst_case(1_000, 1_000)))
            .await
            .expect("hold");
        let tokens = Tokens {
            prompt: 1_000,
            cached: 0,
            completion: 1_000,
        };
        let c = Clawback {
            key: format!("{id}:1:1"),
            request_id: id.clone(),
            payer: user.id.clone(),
            refundable: true,
            fee_bps: q.fee_bps,
            work: Work {
                provider: provider.id.clone(),
                prices: q.prices,
                payout_bps: BPS,
                tokens,
            },
            memo: "caught".into(),
        };
        let claw = {
            let (l, c) = (l.clone(), c.clone());
            tokio::spawn(async move { l.claw_back(&c, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!claw.is_finished(), "it waits for the pay to land");
        let settled_at = std::time::Instant::now();
        l.settle(&id, tokens, Outcome::Finished)
            .await
            .expect("settle");
        let (_, clawed) = claw.await.expect("task").expect("clawback").expect("done");
        assert!(
            settled_at.elapsed() < Duration::from_secs(5),
            "woken by the settlement"
        );
        let (cost, pay) = c.amounts();
        assert!(pay > 0 && pay < cost, "{pay} of {cost}");
        // All of it clawed and nothing left: the settlement paid exactly
        // `pay` (the clawback may land before this reads the balance).
        assert_eq!(clawed, pay, "what was paid comes back");
        let balance = |id: String| {
            let l = l.clone();
            async move { l.account(&id).await.expect("account").balance }
        };
        assert_eq!(balance(provider.id.clone()).await, 0);
        assert_eq!(balance(user.id.clone()).await, 1_000_000, "refunded");
        // A request that never settles: the wait ends at its bound.
        let t = std::time::Instant::now();
        assert!(!l.settled("never-settled", Duration::from_millis(200)).await);
        assert!(t.elapsed() >= Duration::from_millis(200));
        assert_clean(&l).await;
    }
}

#[tokio::test]
async fn charges_bill_known_costs_once_and_never_overdraw() {
    for l in ledgers().await {
        let user = l
            .create_account(AccountKind::User, "hits", 0)
            .await
            .expect("user");
        l.top_up(&user.id, 100, "hits").await.expect("top up");
        let q = quote(BPS);
        let t = Tokens {
            prompt: 100,
            cached: 0,
            completion: 50,
        };
        let cost = q.cost(t);
        let charge = |i: usize| {
            let (l, q, account) = (l.clone(), q.clone(), user.id.clone());
            async move {
                let id = format!("hit-{}-{i}", l.instance());
                let h = HoldRequest {
                    request_id: &id,
                    account_id: &account,
                    key_id: None,
                    quote: &q,
                    amount: cost,
                    max_completion: None,
                };
                l.charge(h, t).await
            }
        };
        // More charges than the funds cover, all checked before any commits.
        let results = futures_util::future::join_all((0..200).map(charge)).await;
        let accepted = results.iter().filter(|r| r.is_ok()).count();
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(()) | Err(LedgerError::InsufficientQuota { .. }))),
            "a charge is accepted or refused for funds"
        );
        l.flush().await;
        let a = l.account(&user.id).await.expect("account");
        let billed = l.usage(&user.id, 1000).await.expect("usage");
        assert_eq!(a.balance, 100 - cost * billed.len() as i64);
        assert!(a.balance >= 0 && a.held == 0, "{a:?}");
        assert_eq!(
            billed.len() as i64,
            100 / cost,
            "exactly what the funds covered"
        );
        assert!(accepted >= billed.len(), "{accepted} accepted");
        // Now the check refuses up front.
        assert!(matches!(
            charge(999).await,
            Err(LedgerError::InsufficientQuota { .. })
        ));
        assert_clean(&l).await;
    }
}

#[tokio::test]
async fn a_charge_over_the_key_budget_at_commit_is_not_billed_and_leaves_nothing_held() {
    for l in ledgers().await {
        let q = quote(BPS);
        let t = Tokens {
            prompt: 1000,
            cached: 0,
            completion: 100,
        };
        let cost = q.cost(t);
        let new = NewKey {
            budget: Some(cost),
            ..NewKey::named("one-hit")
        };
        let (key, _) = l.db.create_key(&new).await.expect("key");
        l.top_up(&key.account_id, cost * 10, "hits")
            .await
            .expect("top up");
        // Two charges queued straight to the writer (as if both had passed
        // the up-front check before either committed): the second finds
        // the budget spent when its batch commits.
        for i in 0..2 {
            let charge = settle::Charge {
                account_id: key.account_id.clone(),
                key_id: Some(key.id.clone()),
                quote: q.clone(),
                amount: cost,
                instance: l.instance().to_string(),
            };
            let item = settle::Item {
                request_id: format!("kb-{}-{i}", l.instance()),
                usage: Some((t, Outcome::Finished)),
                charge: Some(charge),
                who: Default::default(),
            };
            l.jobs
                .send(settle::Job::Close(Box::new(item), None))
                .expect("queued");
        }
        l.flush().await;
        let a = l.account(&key.account_id).await.expect("account");
        assert_eq!(
            (a.balance, a.held),
            (cost * 9, 0),
            "one billed, nothing left held"
        );
        assert_eq!(l.usage(&key.account_id, 10).await.expect("usage").len(), 1);
        // And now the up-front check refuses at once.
        let id = format!("kb-{}-late", l.instance());
        let h = HoldRequest {
            request_id: &id,
            account_id: &key.account_id,
            key_id: Some(&key.id),
            quote: &q,
            amount: cost,
            max_completion: None,
        };
        assert!(matches!(
            l.charge(h, t).await,
            Err(LedgerError::BudgetExceeded { .. })
        ));
        assert_clean(&l).await;
    }
}

/// Two servers on one Postgres settle batches over the same accounts (two
/// users, the treasury, the house provider) at once: every batch commits
/// (rows are locked in id order, so no deadlock), each hold is billed
/// once, and the books balance.
#[tokio::test]
async fn two_servers_settling_over_the_same_accounts_never_deadlock() {
    let url = testing::fresh_postgres_url().await;
    let mut ledgers = Vec::new();
    for _ in 0..2 {
        let db = Db::connect(&url).await.expect("postgres");
        ledgers.push(Ledger::start(db, QUIET).await.expect("ledger"));
    }
    let q = quote(BPS);
    let each = q.worst_case(100, 10);
    let mut users = Vec::new();
    for name in ["u1", "u2"] {
        let u = ledgers[0]
            .create_account(AccountKind::User, name, 0)
            .await
            .expect("user");
        ledgers[0]
            .top_up(&u.id, each * 200, "t")
            .await
            .expect("top up");
        users.push(u.id);
    }
    let t = Tokens {
        prompt: 100,
        cached: 0,
        completion: 10,
    };
    let tasks: Vec<_> = (0..160)
        .map(|i| {
            let l = ledgers[i % 2].clone();
            let (q, account) = (q.clone(), users[(i / 2) % 2].clone());
            tokio::spawn(async move {
                let id = format!("dl-{}-{i}", l.instance());
                hold_plain(&l, &id, &account, &q, each).await?;
                l.settle(&id, t, Outcome::Finished).await
            })
        })
        .collect();
    let mut billed = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(Closed::Billed { .. }) => billed += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(billed, 160);
    for l in &ledgers {
        assert_clean(l).await;
    }
}

/// A real deadlock between two Postgres transactions is what `retryable`
/// recognizes (and what a hold or a settlement then runs again).
#[tokio::test]
async fn a_postgres_deadlock_is_recognized_as_retryable() {
    let db = Db::connect(&testing::fresh_postgres_url().await)
        .await
        .expect("postgres");
    for sql in [
        "CREATE TABLE deadlock_probe (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
        "INSERT INTO deadlock_probe (id, n) VALUES (1, 0), (2, 0)",
    ] {
        sqlx::query(sql).execute(&db.pool).await.expect("setup");
    }
    let bump = "UPDATE deadlock_probe SET n = n + 1 WHERE id = $1";
    let (mut a, mut b) = (
        db.pool.begin().await.expect("a"),
        db.pool.begin().await.expect("b"),
    );
    sqlx::query(bump)
        .bind(1)
        .execute(&mut *a)
        .await
        .expect("a 1");
    sqlx::query(bump)
        .bind(2)
        .execute(&mut *b)
        .await
        .expect("b 2");
    let (ra, rb) = tokio::join!(
        sqlx::query(bump).bind(2).execute(&mut *a),
        sqlx::query(bump).bind(1).execute(&mut *b),
    );
    let e = ra.err().or(rb.err()).expect("one of them deadlocks");
    assert!(retryable(&e), "{e}");
    assert!(!retryable(&sqlx::Error::RowNotFound));
}
