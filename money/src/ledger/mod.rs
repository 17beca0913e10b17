//! The ledger: accounts, a double-entry journal (every transaction's
//! entries sum to zero), holds that reserve a user's worst case while a
//! request runs, and settlement from one usage record per request, exactly
//! once. It works the same on PostgreSQL and SQLite (through `store::Db`)
//! and knows nothing of HTTP or the engine.
//!
//! - `money`: amounts, prices, quotes, costs and splits (pure arithmetic).
//! - `accounts`: accounts, top-ups, per-key budgets, queries.
//! - `holds`: placing a hold (refused when funds or budget cannot cover it).
//! - `settle`: the batching writer that settles or releases holds.
//! - `recovery`: instance heartbeats; holds of a dead instance are settled
//!   from their last usage checkpoint, or released.
//! - `audit`: the invariants, checked against the journal.

pub mod accounts;
pub mod amount;
pub mod audit;
pub mod clawback;
pub mod holds;
pub mod orders;
pub mod recovery;
pub mod settle;
pub mod units;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::store::Db;
pub use amount::{Amount, Prices, Quote, Tokens};

/// The system accounts every database has (created by the migration).
pub const DEPOSITS: &str = "deposits";
pub const TREASURY: &str = "treasury";
/// The counterpart of payouts: money owed to providers outside the ledger.
pub const PAYOUTS: &str = "payouts";
pub const HOUSE_PROVIDER: &str = "provider:house";
pub const LOCAL_USER: &str = "user:local";

/// What the ledger refuses or fails with.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "insufficient funds: this request may cost up to {} but the account has {} available",
        amount::show_units(*need), amount::show_units(*available)
    )]
    InsufficientQuota { need: Amount, available: Amount },
    #[error(
        "key budget exhausted: this request may cost up to {} but the key has {} left",
        amount::show_units(*need), amount::show_units(*remaining)
    )]
    BudgetExceeded { need: Amount, remaining: Amount },
    #[error("no account `{0}`")]
    UnknownAccount(String),
    #[error("{0}")]
    InvalidAmount(String),
    /// A credit limit out of its bounds.
    #[error("{0}")]
    InvalidLimit(String),
    /// The operation does not apply to this account (a top-up of a
    /// system account, a penalty on a user).
    #[error("{0}")]
    WrongAccount(String),
    #[error("a hold for request `{0}` already exists")]
    DuplicateHold(String),
    #[error("the ledger is shut down")]
    Closed,
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
}

/// How a request ended, for its usage record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Ran to a finish reason.
    Finished,
    /// The client left (or the server stopped) before the end.
    Cut,
    /// Failed on our side: recorded, not billed.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Finished => "finished",
            Self::Cut => "cut",
            Self::Failed => "failed",
        }
    }
}

/// What closing a hold did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Settled from usage; the user paid `cost`.
    Billed { cost: Amount },
    /// Released without a charge.
    Released,
    /// Already settled or released (closing twice is a no-op).
    AlreadyClosed,
}

/// Timings of the background tasks.
#[derive(Debug, Clone, Copy)]
pub struct LedgerConfig {
    /// How often this instance says it is alive.
    pub heartbeat: Duration,
    /// Silence after which an instance counts as dead and its holds are
    /// released.
    pub stale_after: Duration,
    /// How long a provider's earnings stay pending (a failed spot check
    /// can still claw them back; penalties cannot touch them) before
    /// they are final.
    pub earnings_window: Duration,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(2),
            stale_after: Duration::from_secs(15),
            earnings_window: EARNINGS_WINDOW,
        }
    }
}

/// The ledger of one server instance (cheap to clone).
#[derive(Debug, Clone)]
pub struct Ledger {
    pub db: Db,
    instance: Arc<str>,
    jobs: mpsc::UnboundedSender<settle::Job>,
    /// How long earnings stay pending (`LedgerConfig::earnings_window`).
    earnings_window: Duration,
    /// Violations the last audit found (-1: none ran yet), for `/metrics`.
    last_audit: Arc<std::sync::atomic::AtomicI64>,
    /// Bumped by the writer after each batch it committed.
    settled: Arc<watch::Sender<u64>>,
}

/// The default `earnings_window`: an hour.
pub const EARNINGS_WINDOW: Duration = Duration::from_secs(3600);

/// Whether a transaction failed only because it met another one (a
/// Postgres deadlock or serialization failure): it wrote nothing, and
/// running it again is safe.
pub(crate) fn retryable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d)
        if matches!(d.code().as_deref(), Some("40P01") | Some("40001")))
}

/// A short, jittered wait before retry `attempt` (1, 2, ...), so two
/// transactions that met do not meet again.
pub(crate) async fn backoff(attempt: u32) {
    use rand::Rng;
    let ms = rand::rng().random_range(1..=10u64 << attempt.min(4));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

impl Ledger {
    /// Registers this instance, closes what dead instances left open, and
    /// starts the settlement writer and the heartbeat.
    pub async fn start(db: Db, config: LedgerConfig) -> Result<Self, LedgerError> {
        let instance: Arc<str> = format!("inst_{}", uuid::Uuid::new_v4().simple()).into();
        recovery::register(&db, &instance).await?;
        let r = recovery::recover_dead(&db, config.stale_after).await?;
        if r != recovery::Recovered::default() {
            tracing::warn!(?r, "closed holds left open by a stopped server");
        }
        let (jobs, rx) = mpsc::unbounded_channel();
        let settled = Arc::new(watch::Sender::new(0));
        tokio::spawn(settle::writer(db.clone(), rx, settled.clone()));
        tokio::spawn(recovery::heartbeat(db.clone(), instance.clone(), config));
        Ok(Self {
            db,
            instance,
            jobs,
            earnings_window: config.earnings_window,
            last_audit: Arc::new((-1).into()),
            settled,
        })
    }

    /// How many violations the last audit found (`None`: none ran yet).
    pub fn last_audit(&self) -> Option<i64> {
        let n = self.last_audit.load(std::sync::atomic::Ordering::Relaxed);
        (n >= 0).then_some(n)
    }

    /// Audits the ledger every `every` (its result in `/metrics`).
    pub async fn audit_every(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            match self.audit().await {
                Ok(a) if !a.violations.is_empty() => {
                    tracing::error!(violations = ?a.violations, "the ledger's audit failed");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "the ledger's audit could not run"),
            }
        }
    }

    /// A ledger for reading and administration only (the CLI): no
    /// instance, no writer; holds and settlements are refused.
    pub fn offline(db: Db) -> Self {
        let (jobs, _) = mpsc::unbounded_channel();
        Self {
            db,
            instance: "offline".into(),
            jobs,
            earnings_window: EARNINGS_WINDOW,
            last_audit: Arc::new((-1).into()),
            settled: Arc::new(watch::Sender::new(0)),
        }
    }

    /// This server instance's id (holds carry it).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Settles a hold from its usage; waits for the commit.
    pub async fn settle(
        &self,
        request_id: &str,
        tokens: Tokens,
        outcome: Outcome,
    ) -> Result<Closed, LedgerError> {
        self.close(request_id, Some((tokens, outcome)), Default::default())
            .await
    }

    /// Settles like `settle`, dividing the provider's part among the
    /// providers whose executors did the work and naming those executors
    /// on the usage record (`settle::Attribution`).
    pub async fn settle_shared(
        &self,
        request_id: &str,
        tokens: Tokens,
        outcome: Outcome,
        who: settle::Attribution,
    ) -> Result<Closed, LedgerError> {
        self.close(request_id, Some((tokens, outcome)), who).await
    }

    /// Releases a hold without a charge (the request never ran).
    pub async fn release(&self, request_id: &str) -> Result<Closed, LedgerError> {
        self.close(request_id, None, Default::default()).await
    }

    async fn close(
        &self,
        request_id: &str,
        usage: Option<(Tokens, Outcome)>,
        who: settle::Attribution,
    ) -> Result<Closed, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(settle::Job::close(request_id, usage, who, Some(tx)))
            .map_err(|_| LedgerError::Closed)?;
        rx.await.map_err(|_| LedgerError::Closed)?
    }

    /// Queues a settlement without waiting (for `Drop` paths); failures are
    /// logged, and the hold stays open for recovery.
    pub fn settle_later(
        &self,
        request_id: &str,
        tokens: Tokens,
        outcome: Outcome,
        who: settle::Attribution,
    ) {
        let job = settle::Job::close(request_id, Some((tokens, outcome)), who, None);
        if self.jobs.send(job).is_err() {
            tracing::error!(request_id, "ledger closed: settlement left to recovery");
        }
    }

    /// Bills a request whose cost is known up front (a cache hit): checks
    /// now that the account and key cover `amount` (the refusal is the
    /// same as a hold's), then queues the hold-and-settle without waiting.
    /// The writer checks again when it commits; if the funds went
    /// meanwhile, the request is not billed (never overdrawn).
    pub async fn charge(
        &self,
        h: holds::HoldRequest<'_>,
        tokens: Tokens,
    ) -> Result<(), LedgerError> {
        self.check_cover(h.account_id, h.key_id, h.amount).await?;
        let charge = settle::Charge {
            account_id: h.account_id.to_string(),
            key_id: h.key_id.map(str::to_string),
            quote: h.quote.clone(),
            amount: h.amount,
            instance: self.instance.to_string(),
        };
        let item = settle::Item {
            request_id: h.request_id.to_string(),
            usage: Some((tokens, Outcome::Finished)),
            charge: Some(charge),
            who: settle::Attribution::default(),
        };
        self.jobs
            .send(settle::Job::Close(Box::new(item), None))
            .map_err(|_| LedgerError::Closed)
    }

    /// Queues a release without waiting (a request that never ran).
    pub fn release_later(&self, request_id: &str) {
        if self
            .jobs
            .send(settle::Job::close(
                request_id,
                None,
                Default::default(),
                None,
            ))
            .is_err()
        {
            tracing::error!(request_id, "ledger closed: release left to recovery");
        }
    }

    /// Records what a running request has used so far (queued; for
    /// recovery if this instance dies before settling it).
    pub fn checkpoint_later(&self, request_id: &str, tokens: Tokens) {
        let _ = self
            .jobs
            .send(settle::Job::Checkpoint(request_id.to_string(), tokens));
    }

    /// Waits until every settlement queued so far is committed.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.jobs.send(settle::Job::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

#[cfg(test)]
mod tests;
