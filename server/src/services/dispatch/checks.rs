//! Spot checks of workers' attempts, off the response path: an attempt a
//! relay picked is scored on the house engine in the background
//! (`services::spotcheck` judges), and a failure costs its provider: its
//! standing takes the hit, the worker is quarantined, and the ledger
//! claws the attempt's pay back and refunds the user once the request
//! has settled (`money::ledger::clawback`).

use std::ops::Range;
use std::sync::Arc;

use engine::EngineHandle;

use super::{HOUSE, Target};
use crate::fleet::registry::Registry;
use crate::services::metering::Credits;
use crate::services::placement::Terms;
use crate::services::spotcheck::{CHEAT_WEIGHT, Sample, SpotCheck, SpotConfig, Verdict, Who};
use money::ledger::Ledger;
use money::ledger::amount::Tokens;
use money::ledger::clawback::{Clawback, SETTLEMENT_WAIT};
use money::ledger::settle::Work;

/// An attempt under a spot check: where it ran, on what terms, for
/// whose request.
#[derive(Debug, Clone)]
pub(super) struct Caught {
    pub(super) target: Target,
    pub(super) terms: Terms,
    pub(super) job: u64,
    pub(super) attempt: u32,
    /// The work it was paid for (the server's counts).
    pub(super) tokens: Tokens,
    pub(super) credits: Option<Credits>,
}

impl Caught {
    /// Whose attempt it is, as the check's record names it.
    fn who(&self) -> Who<'_> {
        let (worker, provider) = match &self.target {
            Target::Worker {
                worker: id,
                provider,
                ..
            } => (id.as_str(), provider.as_str()),
            Target::House => (HOUSE, HOUSE),
        };
        Who { worker, provider }
    }
}

/// The spot checks of this server's workers.
#[derive(Debug)]
pub struct SpotChecks {
    check: SpotCheck,
    fleet: Arc<Registry>,
    /// Where sanctions are stored and pay is clawed (`None`: unmetered).
    ledger: Option<Ledger>,
}

impl SpotChecks {
    pub fn new(config: SpotConfig, fleet: Arc<Registry>, ledger: Option<Ledger>) -> Self {
        Self {
            check: SpotCheck::new(config),
            fleet,
            ledger,
        }
    }

    /// The checker: its rates, records and scoring.
    pub fn checker(&self) -> &SpotCheck {
        &self.check
    }

    /// Checks the parts of an attempt (each a range of `sample`'s tokens
    /// and whose work it was) in the background.
    pub(super) fn run(
        self: &Arc<Self>,
        house: EngineHandle,
        parts: Vec<(Caught, Range<usize>)>,
        sample: Sample,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            let whose: Vec<_> = parts.iter().map(|(c, r)| (c.who(), r.clone())).collect();
            let Some(verdicts) = me.check.check_parts(&house, &sample, &whose).await else {
                return;
            };
            for ((caught, _), verdict) in parts.into_iter().zip(verdicts) {
                if let Verdict::Fail(why) = verdict {
                    me.caught(caught, &why).await;
                }
            }
        });
    }

    /// Quarantines worker `id` of `provider`, caught cheating: no more
    /// work, its token refused, its provider's standing cut.
    pub async fn quarantine(&self, id: &str, provider: &str, why: &str) {
        tracing::warn!(worker = %id, %provider, reason = %why, "quarantining a worker");
        self.fleet.standing.cheated(provider, CHEAT_WEIGHT);
        let db = self.ledger.as_ref().map(|l| &l.db);
        crate::services::sanctions::quarantine(db, &self.fleet, id, why).await;
    }

    /// Pipeline stage `worker` of `provider` failed a check of a sequence
    /// of the request `credits` bills (none: unmetered): quarantine, then,
    /// once the request has settled, the clawback of what that stage was
    /// paid for it (the other stages keep theirs) and its user's refund.
    pub async fn stage_caught(
        &self,
        worker: &str,
        provider: &str,
        why: &str,
        credits: Option<Credits>,
    ) {
        self.quarantine(worker, provider, why).await;
        let (Some(ledger), Some(credits)) = (&self.ledger, credits) else {
            return;
        };
        let Some(p) = credits.payer() else {
            return;
        };
        if !ledger.settled(&p.request_id, SETTLEMENT_WAIT).await {
            tracing::warn!(request_id = %p.request_id, "a stage's clawback waited past the settlement wait");
        }
        for (i, work) in credits.stage_pay(worker).into_iter().enumerate() {
            let claw = Clawback {
                key: format!("{}:stage:{worker}:{i}", p.request_id),
                request_id: p.request_id.clone(),
                payer: p.account_id.clone(),
                refundable: p.refundable,
                fee_bps: p.fee_bps,
                work,
                memo: format!("stage spot check failed on {worker}: {why}"),
            };
            if let Err(e) = ledger.claw_back(&claw, SETTLEMENT_WAIT).await {
                tracing::error!(error = %e, key = %claw.key, "a stage's clawback failed");
            }
        }
    }

    /// A worker's attempt failed its check: quarantine, then the
    /// clawback of its pay.
    async fn caught(&self, c: Caught, why: &str) {
        let Target::Worker {
            worker: id,
            provider,
            label,
        } = &c.target
        else {
            return;
        };
        tracing::warn!(worker = %label, job = c.job, attempt = c.attempt, "clawing back the pay of a failed spot check");
        self.quarantine(id, provider, why).await;
        let (Some(ledger), Some(p)) = (&self.ledger, c.credits.as_ref().and_then(Credits::payer))
        else {
            return;
        };
        let claw = Clawback {
            key: format!("{}:{}:{}", p.request_id, c.job, c.attempt),
            request_id: p.request_id,
            payer: p.account_id,
            refundable: p.refundable,
            fee_bps: p.fee_bps,
            work: Work {
                provider: provider.clone(),
                prices: c.terms.prices,
                payout_bps: c.terms.payout_bps,
                tokens: c.tokens,
            },
            memo: format!("spot check failed on {label}: {why}"),
        };
        if let Err(e) = ledger.claw_back(&claw, SETTLEMENT_WAIT).await {
            tracing::error!(error = %e, key = %claw.key, "the clawback failed");
        }
    }
}

impl crate::services::pipelines::checks::Sanctions for SpotChecks {
    fn checker(&self) -> &crate::services::spotcheck::SpotCheck {
        &self.check
    }

    fn stage_caught(
        self: Arc<Self>,
        worker: String,
        provider: String,
        why: String,
        credits: Option<Credits>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move {
            SpotChecks::stage_caught(&self, &worker, &provider, &why, credits).await;
        })
    }
}
