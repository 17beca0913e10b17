//! What an ended attempt counts for, by this server's own counts: its
//! provider's accepted work (the prompt it computed, replayed tokens
//! included, and what it delivered, at its own prices; a split's prefill
//! paid only when its KV was used), its worker's record, its executor's
//! stage times, and whether it is spot-checked (at the rate of the least
//! proven provider among its workers) and on what.

use super::Relay;
use crate::services::dispatch::checks::Caught;
use crate::services::dispatch::{SplitPlan, Target};
use crate::services::placement::Terms;
use crate::services::spotcheck::Sample;
use money::ledger::amount::Tokens;
use money::ledger::settle::Work;

impl Relay {
    /// Whether to spot-check this attempt: at the rate of the least
    /// proven provider among its workers (a split's two included).
    pub(super) fn pick_check(&self, target: &Target, split: Option<&SplitPlan>) -> bool {
        let jobs = |t: &Target| match t {
            Target::Worker { provider, .. } => {
                Some(self.dispatch.fleet.standing.get(provider).jobs_ok)
            }
            Target::House => None,
        };
        let least = [Some(target), split.map(|p| &p.prefill)]
            .into_iter()
            .flatten()
            .filter_map(jobs)
            .min();
        least.is_some_and(|jobs| self.dispatch.spot.checker().pick(jobs))
    }

    /// Hands the attempt that just ended to a spot check: the tokens are
    /// scored once; a split's first token is judged as its prefill
    /// worker's work, the rest as its decode worker's.
    pub(super) fn spot_check(
        &mut self,
        target: &Target,
        terms: &Terms,
        attempt: u32,
        before: usize,
        split: Option<&SplitPlan>,
    ) {
        let p = &self.choice.request.params;
        let plain_greedy = p.temperature < 1e-5
            && p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
            && p.logit_bias.is_empty();
        let mut context = self.choice.request.prompt_tokens.clone();
        context.extend_from_slice(&self.client.delivered[..before]);
        let n = self.now.observed.len();
        let caught = |target: &Target, terms: &Terms, tokens: Tokens| Caught {
            target: target.clone(),
            terms: terms.clone(),
            job: self.choice.job,
            attempt,
            tokens,
            credits: self.credits.clone(),
        };
        let mut prompt = Tokens {
            prompt: context.len() as u64,
            cached: self.now.cached.min(context.len()) as u64,
            completion: 0,
        };
        let mut parts = Vec::new();
        let prefilled = self.now.prefilled.as_ref().filter(|s| s.counts.is_some());
        if let (Some(plan), Some(s)) = (split, prefilled) {
            let (computed, cached) = s.counts.unwrap_or_default();
            let first = Tokens {
                prompt: computed as u64,
                cached: cached as u64,
                completion: 1,
            };
            parts.push((caught(&plan.prefill, &plan.terms, first), 0..1));
            if s.imported == Some(true) {
                prompt = Tokens::default();
            }
        }
        let from = parts.len();
        if from < n {
            let rest = Tokens {
                completion: (n - from) as u64,
                ..prompt
            };
            parts.push((caught(target, terms, rest), from..n));
        }
        let sample = Sample {
            context,
            tokens: std::mem::take(&mut self.now.observed),
            plain_greedy,
        };
        self.dispatch.spot.run(self.house.clone(), parts, sample);
    }

    /// Books a split attempt's prefill: its provider is paid for the
    /// prompt and the first token when the decode worker used its KV; a
    /// prefill that failed, or whose KV was refused, counts as lost.
    pub(super) fn account_prefill(&self, plan: &SplitPlan) {
        let Some(s) = &self.now.prefilled else { return };
        let Target::Worker {
            worker: id,
            provider,
            label,
        } = &plan.prefill
        else {
            return;
        };
        let used = s.imported == Some(true);
        if let (Some((prompt, cached)), Some(timing)) = (s.counts, &s.timing) {
            let computed = if used { prompt - cached.min(prompt) } else { 0 };
            self.dispatch
                .stats
                .stages
                .record(label, computed, 1, timing);
            if let (true, Some(c)) = (used, &self.credits) {
                let work = Work {
                    provider: plan.terms.provider_id.clone(),
                    prices: plan.terms.prices,
                    payout_bps: plan.terms.payout_bps,
                    tokens: Tokens {
                        prompt: prompt as u64,
                        cached: cached as u64,
                        completion: 1,
                    },
                };
                c.attempt(label, work);
            }
        }
        let lost = s.failed || s.imported == Some(false);
        self.dispatch
            .fleet
            .record(id, provider, usize::from(used), lost);
    }

    /// Books an attempt that ended, `before` tokens having been delivered
    /// when it started: its provider's accepted work (an attempt that
    /// delivered is paid for the prompt it computed, replayed tokens
    /// included, and what it delivered, at its own prices), the worker's
    /// record, and the executor's stage times.
    pub(super) fn account(&self, target: &Target, terms: &Terms, before: usize, lost: bool) {
        let mut tokens = self.client.delivered.len() - before;
        let executor = target.label(&self.house);
        let mut computed =
            (self.choice.request.prompt_tokens.len() + before).saturating_sub(self.now.cached);
        // Split: the first token was the prefill worker's, and with its
        // KV used the prompt was too.
        let mut prompt = (self.choice.request.prompt_tokens.len() + before) as u64;
        let mut cached = self.now.cached as u64;
        if let Some(s) = &self.now.prefilled {
            if s.counts.is_some() {
                tokens = tokens.saturating_sub(1);
            }
            if s.imported == Some(true) {
                (computed, prompt, cached) = (0, 0, 0);
            }
        }
        self.dispatch
            .stats
            .stages
            .record(&executor, computed, tokens, &self.now.timing);
        if let Some(c) = &self.credits {
            let work = Work {
                provider: terms.provider_id.clone(),
                prices: terms.prices,
                payout_bps: terms.payout_bps,
                tokens: Tokens {
                    prompt,
                    cached,
                    completion: tokens as u64,
                },
            };
            c.attempt(&executor, work);
        }
        if let Target::Worker {
            worker: id,
            provider,
            ..
        } = target
        {
            let lost = lost || self.now.violation.is_some();
            self.dispatch.fleet.record(id, provider, tokens, lost);
        }
    }
}
