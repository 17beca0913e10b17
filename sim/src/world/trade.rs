//! The world's side of the spot market: each provider online rests an
//! ask, buying tenants bid each round, and a buyer's request runs on a
//! contract's seller while its bucket has room (`crate::market` holds
//! the books and contracts).

use std::collections::HashSet;

use money::market::contracts::BURST_S;

use super::{US_PER_S, World};
use crate::fleet::Fleet;
use crate::market::Market;
use crate::workload::Request;

/// What one buying tenant bids for on one model: (tenant, model, mean
/// tokens a second, largest request).
pub(super) type Demand = (String, usize, f64, u64);

/// The market of a run and its buyers.
pub(super) struct Buyers {
    pub market: Option<Market>,
    pub demand: Vec<Demand>,
    pub names: HashSet<String>,
}

impl World<'_> {
    /// The seller whose contract covers `r`, if its tenant bought
    /// capacity and the seller is online with room.
    pub(super) fn covered_by(&mut self, r: usize) -> Option<usize> {
        let req = &self.trace[r];
        if !self.buyers.contains(&req.tenant) {
            return None;
        }
        let (slots, by_id, fleet) = (&self.slots, &self.by_id, self.fleet);
        let can_serve = |seller: &str| {
            by_id.get(seller).is_some_and(|&p| {
                let cap = fleet.file.profiles[fleet.providers[p].profile].max_batch;
                slots[p].at.is_some() && slots[p].running() < cap
            })
        };
        let tokens = u64::from(req.prompt_tokens + req.output_tokens);
        let now = self.now as f64 / US_PER_S;

        let c = self
            .market
            .as_mut()?
            .cover(&req.tenant, &req.model, tokens, now, can_serve)?;
        self.by_id.get(&c.seller).copied()
    }

    /// Rests `p`'s ask on its model's book: its output price now, for its
    /// decode capacity at its cap.
    pub(super) fn post_ask(&mut self, p: usize) {
        if self.market.is_none() {
            return;
        }
        let pr = &self.fleet.providers[p];
        let cap = self.slots[p].measure.cap.max(1);
        let per_s = f64::from(cap) * 1e3 / pr.calibrated.step_ms(cap).max(1e-3);
        let (price, now) = (
            self.prices_of_load(p, 0).output,
            (self.now as f64 / US_PER_S) as i64,
        );
        if let Some(m) = &mut self.market {
            m.ask(
                p,
                &pr.id,
                pr.model,
                (price, per_s as u64),
                (now, now + 86_400),
            );
        }
    }

    /// Each buying tenant bids for what it expects to use, per model.
    pub(super) fn bid_round(&mut self) {
        let now = (self.now as f64 / US_PER_S) as i64;
        let fee = self.fleet.file.fee_bps;
        let names: Vec<String> = self
            .fleet
            .file
            .models
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let Some(m) = &mut self.market else {
            return;
        };
        let until = now + m.spec.bid_every_s.max(1.0) as i64;
        for (tenant, model, per_s, largest) in &self.demand {
            // Enough for its largest request to fit a full bucket.
            let q = (per_s * m.spec.bid_cover)
                .max(*largest as f64 / BURST_S as f64)
                .ceil() as u64;
            for (cost, seller) in m.bid(tenant, (*model, &names[*model]), q, (now, until), fee) {
                self.tally.prepaid(cost, seller);
            }
        }
        m.record_prices(self.now as f64 / 3.6e9, &names);
    }
}

/// The market of `fleet` (if it has one), what its buying tenants bid
/// for, and who they are: the first `contract_share` of the tenants seen
/// in `trace`, by name.
pub(super) fn buyers(fleet: &Fleet, trace: &[Request]) -> Buyers {
    let f = &fleet.file;
    let Some(spec) = f.market.clone() else {
        return Buyers {
            market: None,
            demand: Vec::new(),
            names: HashSet::new(),
        };
    };
    let mut tenants: Vec<String> = trace.iter().map(|r| r.tenant.clone()).collect();
    tenants.sort();
    tenants.dedup();
    let n = (tenants.len() as f64 * spec.contract_share.clamp(0.0, 1.0)).round() as usize;
    tenants.truncate(n);
    let demand = crate::market::demand(trace, &tenants)
        .into_iter()
        .filter_map(|((t, m), (per_s, largest))| {
            let model = f.models.iter().position(|x| x.name == m)?;
            Some((t, model, per_s, largest))
        })
        .collect();
    let market = Market::new(spec, f.models.len(), fleet.providers.len());
    Buyers {
        market: Some(market),
        demand,
        names: tenants.into_iter().collect(),
    }
}
