//! `synor keys create|list|revoke`: the same key operations as the admin
//! API, straight on the database (for bootstrapping and scripts).

use anyhow::Context;

use crate::config::{KeysAction, KeysArgs};
use crate::store::Db;
use crate::store::keys::Limits;

pub async fn run(args: KeysArgs) -> anyhow::Result<()> {
    let db = Db::connect(&args.database_url)
        .await
        .with_context(|| format!("opening the database {}", args.database_url))?;
    match args.action {
        KeysAction::Create {
            name,
            rpm,
            tpm,
            max_concurrent,
        } => {
            if [rpm, tpm, max_concurrent].iter().flatten().any(|&v| v < 1) {
                anyhow::bail!("limits are at least 1 (omit one for unlimited)");
            }
            let (rec, secret) = db
                .create_key(
                    &name,
                    Limits {
                        rpm,
                        tpm,
                        max_concurrent,
                    },
                )
                .await?;
            println!("created {} ({})", rec.id, rec.name);
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
