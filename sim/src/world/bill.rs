//! Billing a finished request by the production settlement rule
//! (`Quote::cost`, `settle::payees`), with the spot check's draw for a
//! cheat's attempt: a caught one is refunded, clawed back and its
//! provider quarantined. Requests on prepaid capacity are not billed.

use money::ledger::amount::BPS;
use money::ledger::settle::{Work, payees};
use money::ledger::{Prices, Quote, Tokens};
use money::market::pricing::payout_bps;
use rand::Rng;

use super::World;
use crate::fleet::Cheat;
use crate::journal::Settled;

impl World<'_> {
    /// Bills a finished request by the production settlement rule, with
    /// the spot check's draw for a cheat's attempt.
    pub(super) fn bill(&mut self, p: usize, r: usize) {
        let (req, l) = (&self.trace[r], &self.live[r]);
        let tokens = Tokens {
            prompt: u64::from(req.prompt_tokens),
            cached: 0,
            completion: u64::from(req.output_tokens),
        };
        let timing = (l.ttft_ms, l.step_ms);
        let met = l.ttft_ms <= req.ttft_ms && l.step_ms <= req.tpot_ms;
        let Some(prices) = l.prices.filter(|_| !l.covered) else {
            // Prepaid at the trade price when its contract was filled.
            self.tally.finished(p, met, timing, (0, 0), tokens);
            return;
        };
        let (cost, paid) = self.charge(p, r, prices, tokens);
        self.tally.finished(p, met, timing, (cost, paid), tokens);
        self.spot_check(p, r, (cost, paid));
    }

    /// What the user pays for `tokens` at `prices` (`Quote::cost`) and
    /// what the provider is paid (`settle::payees`); recorded for a
    /// ledger replay when asked.
    fn charge(&mut self, p: usize, r: usize, prices: Prices, tokens: Tokens) -> (i64, i64) {
        let (pr, req) = (&self.fleet.providers[p], &self.trace[r]);
        let quote = Quote {
            provider_id: pr.id.clone(),
            model: req.model.clone(),
            prices,
            fee_bps: self.fleet.file.fee_bps,
            payout_bps: payout_bps(BPS),
            stages: Default::default(),
        };
        let cost = quote.cost(tokens);
        let work = [Work {
            provider: pr.id.clone(),
            prices,
            payout_bps: quote.payout_bps,
            tokens,
        }];
        let paid: i64 = payees(quote.fee_bps, cost, &work).iter().map(|x| x.1).sum();
        if self.settings.record {
            self.settled.push(Settled {
                request: r,
                tenant: req.tenant.clone(),
                provider: pr.id.clone(),
                model: req.model.clone(),
                prices,
                fee_bps: quote.fee_bps,
                payout_bps: quote.payout_bps,
                tokens,
                cost,
                paid,
                clawed: false,
            });
        }
        (cost, paid)
    }

    /// The spot check's draw at the production rate for `p`'s history;
    /// a cheat's wrong answer caught is refunded, clawed back and its
    /// provider quarantined.
    fn spot_check(&mut self, p: usize, r: usize, (cost, paid): (i64, i64)) {
        let cheat = self.fleet.providers[p].cheat;
        let good = matches!(cheat, None | Some(Cheat::Stall | Cheat::InflatedCounts));
        let rate = self.settings.spot.rate_for(self.slots[p].delivered);
        let checked = rate > 0.0 && self.rng.random_bool(rate);
        if let Some(c) = cheat {
            self.tally.cheated(c, (cost, paid), !good, checked);
        }
        if good || !checked {
            return;
        }
        self.tally.clawed_back(p, cost, paid);
        if let Some(last) = self.settled.last_mut().filter(|x| x.request == r) {
            last.clawed = true;
        }
        self.slots[p].banned = true;
        self.set_online(p);
    }
}
