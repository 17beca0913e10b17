//! `synor keys create|list|revoke`, `synor accounts list|create|topup` and
//! `synor providers create|tokens|revoke`: the same operations as the
//! admin API, straight on the database (for bootstrapping and scripts).

use crate::config::{
    AccountsAction, AccountsArgs, KeysAction, KeysArgs, ProvidersAction, ProvidersArgs,
};
use money::ledger::Ledger;
use money::ledger::accounts::AccountKind;
use money::ledger::amount::parse_units;
use money::ledger::amount::{self, show_units};
use money::store::keys::{Limits, NewKey};

pub async fn run(args: KeysArgs) -> anyhow::Result<()> {
    let db = args.db.connect().await?;
    match args.action {
        KeysAction::Create {
            name,
            rpm,
            tpm,
            max_concurrent,
            account,
            budget,
        } => {
            if [rpm, tpm, max_concurrent].iter().flatten().any(|&v| v < 1) {
                anyhow::bail!("limits are at least 1 (omit one for unlimited)");
            }
            let budget = budget
                .map(|b| {
                    parse_units(&b)
                        .and_then(|b| amount::check_bound("budget", b, amount::MAX_BALANCE))
                        .map_err(anyhow::Error::msg)
                })
                .transpose()?;
            let new = NewKey {
                name,
                limits: Limits {
                    rpm,
                    tpm,
                    max_concurrent,
                },
                account_id: account,
                budget,
            };
            let (rec, secret) = db.create_key(&new).await?;
            println!(
                "created {} ({}) for account {}",
                rec.id, rec.name, rec.account_id
            );
            println!("key: {secret}");
            println!("(this is the only time the key is shown)");
        }
        KeysAction::List => {
            for k in db.list_keys().await? {
                let state = if k.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                let lim = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
                println!(
                    "{}  {:<20} {}...  {state:<7} rpm={} tpm={} concurrent={}",
                    k.id,
                    k.name,
                    k.prefix,
                    lim(k.limits.rpm),
                    lim(k.limits.tpm),
                    lim(k.limits.max_concurrent)
                );
            }
        }
        KeysAction::Revoke { id } => {
            if !db.revoke_key(&id).await? {
                anyhow::bail!("no active key {id}");
            }
            println!("revoked {id}");
        }
    }
    Ok(())
}

pub async fn accounts(args: AccountsArgs) -> anyhow::Result<()> {
    let db = args.db.connect().await?;
    let ledger = Ledger::offline(db);
    match args.action {
        AccountsAction::List => {
            for a in ledger.accounts().await? {
                println!(
                    "{:<42} {:<9} balance={} held={} credit_limit={}  {}",
                    a.id,
                    a.kind,
                    show_units(a.balance),
                    show_units(a.held),
                    show_units(a.credit_limit),
                    a.name
                );
            }
        }
        AccountsAction::Create { name, credit_limit } => {
            let limit = parse_units(&credit_limit).map_err(anyhow::Error::msg)?;
            let a = ledger
                .create_account(AccountKind::User, &name, limit)
                .await?;
            println!("created {} ({})", a.id, a.name);
        }
        AccountsAction::Topup { id, amount, memo } => {
            let amount = parse_units(&amount).map_err(anyhow::Error::msg)?;
            let tx = ledger.top_up(&id, amount, &memo).await?;
            let a = ledger.account(&id).await?;
            println!("{tx}: {id} balance {}", show_units(a.balance));
        }
    }
    Ok(())
}

pub async fn providers(args: ProvidersArgs) -> anyhow::Result<()> {
    match args.action {
        ProvidersAction::Earnings(link) => return crate::provider_cli::earnings(&link).await,
        ProvidersAction::Payout { link, amount, memo } => {
            return crate::provider_cli::payout(&link, &amount, &memo).await;
        }
        ProvidersAction::Create { .. }
        | ProvidersAction::Tokens
        | ProvidersAction::Revoke { .. } => {}
    }
    let db = args.db.connect().await?;
    match args.action {
        ProvidersAction::Create { name, account } => {
            if name.trim().is_empty() || name.len() > 128 {
                anyhow::bail!("a name is 1-128 characters");
            }
            let account = match account {
                Some(a) => a,
                None => {
                    let ledger = Ledger::offline(db.clone());
                    ledger
                        .create_account(AccountKind::Provider, &name, 0)
                        .await?
                        .id
                }
            };
            let (t, secret) = db.create_worker_token(&account, &name).await?;
            println!(
                "created worker token {} for provider {}",
                t.id, t.account_id
            );
            println!("token: {secret}");
            println!("(this is the only time the token is shown)");
        }
        ProvidersAction::Tokens => {
            for t in db.list_worker_tokens().await? {
                let state = if t.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                println!(
                    "{}  {:<42} {:<20} {}...  {state}",
                    t.id, t.account_id, t.name, t.prefix
                );
            }
        }
        ProvidersAction::Revoke { id } => {
            if !db.revoke_worker_token(&id).await? {
                anyhow::bail!("no active worker token `{id}`");
            }
            println!("revoked {id}");
        }
        ProvidersAction::Earnings(_) | ProvidersAction::Payout { .. } => {}
    }
    Ok(())
}
