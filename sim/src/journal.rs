//! A run's money through the production ledger: every settlement the
//! simulator recorded is replayed into a real `money::ledger::Ledger`
//! (SQLite or PostgreSQL) as the server would make it (an account per
//! tenant and provider, a hold at the request's worst case, a settlement
//! of the tokens the server counted, a clawback of each caught cheat's
//! attempt), then the ledger's own audit runs and its balances are set
//! against the simulator's totals. It is how a test shows that the
//! simulated market's money obeys the ledger's invariants, not a copy of
//! them.

use std::collections::BTreeMap;

use money::ledger::accounts::AccountKind;
use money::ledger::audit::Audit;
use money::ledger::holds::HoldRequest;
use money::ledger::settle::{Attribution, Work};
use money::ledger::{Ledger, Outcome, Prices, Quote, Tokens};
use money::store::Db;

/// One request's settlement as the simulator made it.
#[derive(Debug, Clone)]
pub struct Settled {
    pub request: usize,
    pub tenant: String,
    pub provider: String,
    pub model: String,
    pub prices: Prices,
    pub fee_bps: i64,
    pub payout_bps: i64,
    pub tokens: Tokens,
    /// What the user paid and the provider was paid (ticks).
    pub cost: i64,
    pub paid: i64,
    /// Caught cheating: refunded and clawed back.
    pub clawed: bool,
}

/// What the ledger says after the replay.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub audit: Audit,
    /// What users paid net of refunds, and providers hold (ticks).
    pub users_paid: i64,
    pub providers_paid: i64,
}

/// Enough for any user to pay for a run (ticks).
const TOP_UP: i64 = 90_000 * money::ledger::amount::TICKS_PER_UNIT;

/// Replays `settled` into a ledger on `db` and audits it.
pub async fn replay(db: Db, settled: &[Settled]) -> anyhow::Result<Replayed> {
    let ledger = Ledger::start(db, Default::default()).await?;
    let mut users = BTreeMap::new();
    let mut providers = BTreeMap::new();
    for s in settled {
        if !users.contains_key(&s.tenant) {
            let a = ledger
                .create_account(AccountKind::User, &s.tenant, 0)
                .await?;
            ledger.top_up(&a.id, TOP_UP, "simulation").await?;
            users.insert(s.tenant.clone(), a.id);
        }
        if !providers.contains_key(&s.provider) {
            let a = ledger
                .create_account(AccountKind::Provider, &s.provider, 0)
                .await?;
            providers.insert(s.provider.clone(), a.id);
        }
    }
    for s in settled {
        settle_one(&ledger, s, &users[&s.tenant], &providers[&s.provider]).await?;
    }
    ledger.flush().await;
    let mut users_paid = 0;
    for id in users.values() {
        users_paid += TOP_UP - ledger.account(id).await?.balance;
    }
    let mut providers_paid = 0;
    for id in providers.values() {
        providers_paid += ledger.account(id).await?.balance;
    }
    Ok(Replayed {
        audit: ledger.audit().await?,
        users_paid,
        providers_paid,
    })
}

/// One request: hold, settle, and claw back if it was caught.
async fn settle_one(
    ledger: &Ledger,
    s: &Settled,
    user: &str,
    provider: &str,
) -> anyhow::Result<()> {
    let request_id = format!("sim-{}", s.request);
    let quote = Quote {
        provider_id: provider.to_string(),
        model: s.model.clone(),
        prices: s.prices,
        fee_bps: s.fee_bps,
        payout_bps: s.payout_bps,
        stages: Default::default(),
    };
    ledger
        .hold(HoldRequest {
            request_id: &request_id,
            account_id: user,
            key_id: None,
            quote: &quote,
            amount: quote.worst_case(s.tokens.prompt, s.tokens.completion),
            max_completion: Some(s.tokens.completion),
        })
        .await?;
    let work = Work {
        provider: provider.to_string(),
        prices: s.prices,
        payout_bps: s.payout_bps,
        tokens: s.tokens,
    };
    let who = Attribution {
        work: vec![work],
        stages: None,
    };
    ledger
        .settle_shared(&request_id, s.tokens, Outcome::Finished, who)
        .await?;
    if s.clawed {
        let key = format!("clawback:{request_id}");
        ledger
            .clawback(
                &key,
                provider,
                user,
                s.paid,
                s.cost,
                "simulated spot check failed",
            )
            .await?;
    }
    Ok(())
}
