//! Billing a finished request by the production settlement rule
//! (`Quote::cost`, `settle::payees`), with the spot check's draw for a
//! cheat's attempt: a caught one is refunded, clawed back and its
//! provider quarantined. Requests on prepaid capacity are not billed.

use money::ledger::Tokens;
use money::ledger::amount::BPS;
use money::ledger::settle::{Work, payees};
use money::market::pricing::payout_bps;
use rand::Rng;

use super::World;
use crate::fleet::Cheat;
use crate::journal::Settled;

impl World<'_> {
    /// Bills a finished request by the production settlement rule, with
    /// the spot check's draw for a cheat's attempt.
    pub(super) fn bill(&mut self, p: usize, r: usize) {
        let pr = &self.fleet.providers[p];
        let req = &self.trace[r];
        let l = &self.live[r];
        let tokens = Tokens {
            prompt: u64::from(req.prompt_tokens),
            cached: 0,
            completion: u64::from(req.output_tokens),
        };
        let quote = money::ledger::Quote {
            provider_id: pr.id.clone(),
            model: req.model.clone(),
            prices: l.prices,
            fee_bps: self.fleet.file.fee_bps,
            payout_bps: payout_bps(BPS),
            stages: Default::default(),
        };
        if l.covered {
            // Prepaid at the trade price when its contract was filled.
            let (ttft, step) = (l.ttft_ms, l.step_ms);
            let met = ttft <= req.ttft_ms && step <= req.tpot_ms;
            self.tally.finished(p, met, (ttft, step), (0, 0), tokens);
            return;
        }
        let cost = quote.cost(tokens);
        let work = [Work {
            provider: pr.id.clone(),
            prices: l.prices,
            payout_bps: quote.payout_bps,
            tokens,
        }];
        let paid: i64 = payees(quote.fee_bps, cost, &work).iter().map(|x| x.1).sum();
        let good = matches!(pr.cheat, None | Some(Cheat::Stall | Cheat::InflatedCounts));
        let rate = self.settings.spot.rate_for(self.slots[p].delivered);
        let checked = rate > 0.0 && self.rng.random_bool(rate);
        if self.settings.record {
            self.settled.push(Settled {
                request: r,
                tenant: req.tenant.clone(),
                provider: pr.id.clone(),
                model: req.model.clone(),
                prices: l.prices,
                fee_bps: quote.fee_bps,
                payout_bps: quote.payout_bps,
                tokens,
                cost,
                paid,
                clawed: false,
            });
        }
        let (ttft, step) = (l.ttft_ms, l.step_ms);
        let met = ttft <= req.ttft_ms && step <= req.tpot_ms;
        self.tally
            .finished(p, met, (ttft, step), (cost, paid), tokens);
        if let Some(c) = pr.cheat {
            self.tally.cheated(c, (cost, paid), !good, checked);
        }
        if !good && checked {
            // Caught: the user is refunded, the pay clawed back, the
            // provider quarantined.
            self.tally.clawed_back(p, cost, paid);
            if let Some(last) = self.settled.last_mut().filter(|x| x.request == r) {
                last.clawed = true;
            }
            self.slots[p].banned = true;
            self.set_online(p);
        }
    }
}
