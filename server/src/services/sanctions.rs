//! Sanctions that stick: a quarantine (a check caught a worker's work) is
//! stored with the worker token, so the gateway refuses the token on
//! every replica and after a restart; every live session of a sanctioned
//! token (quarantined or revoked, here or on another replica) is closed:
//! at once on the replica that imposed it, and within `SWEEP` on the
//! others, which look up the tokens of their connected workers. Only an
//! admin lifts a quarantine.

use std::sync::Arc;
use std::time::Duration;

use crate::fleet::registry::Registry;
use money::store::Db;

/// How often a replica looks for sanctions imposed elsewhere on the
/// tokens of its connected workers.
pub const SWEEP: Duration = Duration::from_secs(2);

/// Quarantines the token of worker `id` (`why`: what the check found):
/// its sessions here get no more work and are closed, and the token is
/// stored as quarantined for every replica.
pub async fn quarantine(db: Option<&Db>, fleet: &Registry, id: &str, why: &str) {
    let Some(token) = fleet.quarantine(id) else {
        return;
    };
    let reason = format!("this worker token is quarantined: {why}");
    fleet.close_token(&token, &reason).await;
    if let Some(db) = db
        && let Err(e) = db.quarantine_worker_token(&token, why).await
    {
        tracing::error!(token = %token, error = %e, "the quarantine was not stored");
    }
}

/// Closes every session of `token` here now (an admin revoked it).
pub async fn revoked(fleet: &Registry, token: &str) {
    fleet
        .close_token(token, "this worker token was revoked")
        .await;
}

/// Lifts `token`'s quarantine; false if it was not quarantined.
pub async fn clear(
    db: &Db,
    fleet: &Registry,
    token: &str,
) -> Result<bool, money::store::StoreError> {
    let here = fleet.clear_quarantine(token);
    Ok(db.clear_worker_quarantine(token).await? || here)
}

/// Every `SWEEP`: closes the sessions of connected workers whose token was
/// revoked or quarantined since they connected.
pub async fn run(db: Db, fleet: Arc<Registry>) {
    let mut tick = tokio::time::interval(SWEEP);
    loop {
        tick.tick().await;
        let tokens = fleet.local_tokens();
        match db.sanctioned_tokens(&tokens).await {
            Ok(hits) => {
                for (token, why) in hits {
                    fleet.mark_quarantined(&token);
                    fleet.close_token(&token, &why).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "sanctions sweep failed"),
        }
    }
}
