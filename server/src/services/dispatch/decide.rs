//! A choice's `Decision`, made once: the snapshot of every candidate
//! (its measure, its terms with the house's quote computed once, the
//! prompt tokens it likely holds), the placement policy's pick over it,
//! and for a first attempt on a worker the split's cost model over the
//! same numbers. A worker's terms are its ask for the model with the fee
//! added (the house's prices when it has none in the market's band) and
//! its provider's measured standing.

use engine::{EngineHandle, GenerateRequest};

use super::{Dispatch, HOUSE, lock};
use crate::fleet::registry::WorkerInfo;
use crate::services::placement::disagg::{self, SplitInputs, SplitWorker};
use crate::services::placement::{Candidate, Estimate, Snapshot, Terms, gross, prefix_hashes};
use money::ledger::HOUSE_PROVIDER;
use money::ledger::amount::{BPS, Prices};

/// What placement weighs for one choice.
pub(super) struct Want<'a> {
    pub(super) model: &'a str,
    /// The house engine's terms now.
    pub(super) house: &'a Terms,
    /// The prompt (and, for a replay, the tokens already delivered).
    pub(super) prompt: &'a [u32],
    pub(super) max_tokens: usize,
    /// Only this provider's executors (capacity its bidder bought), the
    /// house engine where it is the house.
    pub(super) only: Option<&'a str>,
}

impl<'a> Want<'a> {
    /// A request's first choice.
    pub(super) fn of(
        model: &'a str,
        house: &'a Terms,
        r: &'a GenerateRequest,
        only: Option<&'a str>,
    ) -> Self {
        Self {
            model,
            house,
            prompt: &r.prompt_tokens,
            max_tokens: r.params.max_tokens,
            only,
        }
    }
}

/// Where one attempt runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    House,
    /// A worker: its id, the provider account it earns for, and how
    /// usage records name it (`name@provider`).
    Worker {
        worker: String,
        provider: String,
        label: String,
    },
}

impl Target {
    pub(super) fn key(&self) -> &str {
        match self {
            Self::House => HOUSE,
            Self::Worker { worker: id, .. } => id,
        }
    }

    /// How usage records name it.
    pub fn label(&self, house: &EngineHandle) -> String {
        match self {
            Self::House => house.info().executor.clone(),
            Self::Worker { label, .. } => label.clone(),
        }
    }
}

pub(super) fn worker_target(w: &WorkerInfo) -> Target {
    Target::Worker {
        worker: w.id.clone(),
        provider: w.provider_id.clone(),
        label: format!("{}@{}", w.name, w.provider_id),
    }
}

/// A split: where the prompt runs, on what terms, and what is expected.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    pub prefill: Target,
    pub terms: Terms,
    pub estimate: Estimate,
}

/// Where a choice runs, decided once.
#[derive(Debug, Clone)]
pub struct Decision {
    pub target: Target,
    pub terms: Terms,
    /// Its target runs as many choices as its cap allows.
    pub full: bool,
    /// The cost model's estimate of the plan chosen (default: none made).
    pub estimate: Estimate,
    /// Where its prompt prefills, when elsewhere.
    pub split: Option<SplitPlan>,
}

impl Dispatch {
    /// The decision for `want`, leaving out `tried`; with `split`, the
    /// split's cost model runs too (first attempts only: a replay runs
    /// where it lands).
    pub(super) fn decide(&self, want: &Want<'_>, tried: &[String], split: bool) -> Decision {
        let workers = self.fleet.serving(want.model);
        self.sync_profiles(&workers);
        let (mut targets, mut snapshot) = self.snapshot(want, &workers, tried);
        // The house is always a candidate: there is a first to fall back on.
        let n = targets.len();
        let i = self.policy.pick(&snapshot).filter(|&i| i < n).unwrap_or(0);
        let c = snapshot.candidates.swap_remove(i);
        let target = targets.swap_remove(i);
        let (estimate, split) = if split {
            self.split_for(want, &target, &c.terms)
        } else {
            (Estimate::default(), None)
        };
        Decision {
            full: c.measure.full(),
            target,
            terms: c.terms,
            estimate: split.as_ref().map_or(estimate, |p| p.estimate),
            split,
        }
    }

    /// Every candidate for the choice, the house first: its target and
    /// what placement weighs of it.
    fn snapshot(
        &self,
        want: &Want<'_>,
        workers: &[WorkerInfo],
        tried: &[String],
    ) -> (Vec<Target>, Snapshot) {
        let hashes = prefix_hashes(want.prompt);
        // Only another provider's executors: the house is the last resort.
        let factor = match want.only {
            Some(p) if p != HOUSE_PROVIDER => f64::MAX,
            _ => self.config.house_factor,
        };
        let mut entries = vec![(Target::House, want.house.clone(), factor)];
        entries.extend(
            workers
                .iter()
                .filter(|w| !tried.contains(&w.id))
                .filter(|w| want.only.is_none_or(|p| p == w.provider_id))
                .map(|w| {
                    let terms = self.worker_terms(w, want.model, want.house);
                    (worker_target(w), terms, 1.0)
                }),
        );
        let measures = lock(&self.measures);
        let affinity = lock(&self.affinity);
        let mut targets = Vec::with_capacity(entries.len());
        let mut candidates = Vec::with_capacity(entries.len());
        for (target, terms, factor) in entries {
            candidates.push(Candidate {
                measure: measures.get(target.key()).copied().unwrap_or_default(),
                terms,
                factor,
                cached: affinity.cached_tokens(target.key(), &hashes),
                house: target == Target::House,
            });
            targets.push(target);
        }
        let snapshot = Snapshot::new(want.prompt.len(), want.max_tokens, candidates);
        (targets, snapshot)
    }

    /// The colocated estimate of a choice on `decode` (on `terms`), and
    /// the split plan when the cost model (or `--fleet-split always`)
    /// picks one.
    pub(super) fn split_for(
        &self,
        want: &Want<'_>,
        decode: &Target,
        terms: &Terms,
    ) -> (Estimate, Option<SplitPlan>) {
        let none = (Estimate::default(), None);
        let Target::Worker { worker: d, .. } = decode else {
            return none;
        };
        let workers = self.fleet.serving(want.model);
        let Some(geometry) = workers
            .iter()
            .find(|w| &w.id == d)
            .and_then(|w| w.models.iter().find(|m| m.name == want.model))
        else {
            return none;
        };
        let hashes = prefix_hashes(want.prompt);
        let side = |w: &WorkerInfo, terms: Terms| SplitWorker {
            measure: lock(&self.measures).get(&w.id).copied().unwrap_or_default(),
            terms,
            cached: lock(&self.affinity).cached_tokens(&w.id, &hashes),
            rtt_ms: w.rtt_ms,
            bandwidth: self.stats.split.bandwidth(&w.id),
        };
        let Some(dw) = workers.iter().find(|w| &w.id == d) else {
            return none;
        };
        let others: Vec<&WorkerInfo> = workers
            .iter()
            .filter(|w| &w.id != d && self.fleet.is_local(&w.id))
            .collect();
        let (prompt, max_tokens) = (want.prompt.len(), want.max_tokens);
        let inputs = SplitInputs {
            mode: self.config.split,
            weights: self.config.weights,
            kv_bytes_per_token: u64::from(geometry.layers) * geometry.kv_bytes_per_token(),
            prefills: others
                .iter()
                .map(|w| side(w, self.worker_terms(w, want.model, want.house)))
                .collect(),
            ..SplitInputs::new(
                side(dw, terms.clone()),
                self.fleet.is_local(d),
                prompt,
                max_tokens,
            )
        };
        let (colocated, pick) = disagg::plan(&inputs);
        let plan = pick.map(|(n, estimate)| SplitPlan {
            prefill: worker_target(others[n]),
            terms: inputs.prefills[n].terms.clone(),
            estimate,
        });
        (colocated, plan)
    }

    /// The house engine's terms for `model` now (its quote under load).
    pub(super) fn house_terms(&self, model: &str, house: &EngineHandle) -> Terms {
        let billing = self.billing.as_ref();
        let quote = billing.and_then(|b| b.quote(model, b.load_of(house)).ok());
        let reputation_bps = billing
            .and_then(|b| {
                b.market
                    .providers()
                    .into_iter()
                    .find(|p| p.account_id == HOUSE_PROVIDER)
            })
            .map_or(BPS, |p| p.reputation_bps);
        let (prices, payout_bps) = match quote {
            Some(q) => (q.prices, q.payout_bps),
            None => (
                Prices {
                    input: 1,
                    cached_input: 1,
                    output: 1,
                },
                BPS,
            ),
        };
        Terms {
            provider_id: HOUSE_PROVIDER.into(),
            prices,
            payout_bps,
            reputation_bps,
        }
    }

    /// A worker's terms: its ask for `model` with the fee added, or the
    /// house's prices; its provider's measured standing.
    pub(super) fn worker_terms(&self, w: &WorkerInfo, model: &str, house: &Terms) -> Terms {
        let market = self.billing.as_ref().map(|b| &b.market);
        let fee = market.map_or(0, |m| m.fee_bps);
        let now = money::store::now();
        let listable =
            |a: &&protocol::Ask| market.is_none_or(|m| m.in_band(model, gross(a.output, fee)));
        let prices = w
            .asks
            .iter()
            .filter(|a| a.model == model && (a.until == 0 || a.until > now))
            .find(listable)
            .map_or(house.prices, |a| Prices {
                input: gross(a.input, fee),
                cached_input: gross(a.cached_input, fee),
                output: gross(a.output, fee),
            });
        let r = self.fleet.standing.get(&w.provider_id);
        Terms {
            provider_id: w.provider_id.clone(),
            prices,
            payout_bps: money::market::pricing::payout_bps(r.reputation_bps()),
            reputation_bps: r.reputation_bps(),
        }
    }
}
