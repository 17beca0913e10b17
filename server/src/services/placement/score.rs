//! How placement weighs one executor. Each executor has its `Measure` (what
//! this server observed of it: calibrated profile, the correction learned
//! from production token gaps, its batch cap and what it runs now) and
//! its `Terms` (whose it is, its prices, its payout multiplier). A
//! candidate's score is the weighted sum of the logarithms of five
//! costs, smaller better: its price for the choice, its expected finish
//! time (queue and compute), its unloaded speed (capability), the inverse
//! of its provider's reputation, and its utilization. In logarithms the
//! weights are scale-free: with cost at 0.3, halving a price is worth as
//! much as any time term at 0.3 getting 2x worse. The seeds' composite
//! weights (cost .3, latency .2, capability .2, reputation .15, load .15)
//! are the default; `--placement-weights latency=1` places by time alone.

use crate::fleet::registry::Profile;
use money::ledger::amount::{BPS, Prices, Tokens};

/// The largest batch cap.
pub const MAX_CAP: u32 = 1024;
/// How much slower a full executor counts in placement.
pub const FULL_PENALTY: f64 = 4.0;

/// One executor's measures, as this server observed them.
#[derive(Debug, Clone, Copy)]
pub struct Measure {
    /// Choices it runs for this server now.
    pub outstanding: u32,
    /// Of those, the ones still waiting for their first token (queued or
    /// in prefill).
    pub prefilling: u32,
    /// Moving average of milliseconds per delivered token.
    pub ms_per_token: f64,
    /// Its calibrated profile, once measured.
    pub profile: Option<Profile>,
    /// Observed token gaps over the profile's prediction (moving average;
    /// doubled when it loses a job).
    pub correction: f64,
    /// The most choices it takes at once so a decode step stays under the
    /// step target: from the profile, shrunk x0.7 when an observed gap
    /// misses the target, grown by one when at the cap and well under it
    /// (0: no cap yet).
    pub cap: u32,
}

impl Default for Measure {
    fn default() -> Self {
        Self {
            outstanding: 0,
            prefilling: 0,
            ms_per_token: 20.0,
            profile: None,
            correction: 1.0,
            cap: 0,
        }
    }
}

impl Measure {
    /// The measure of an executor just calibrated at `p`: its cap the
    /// largest batch whose decode step stays within `target_ms` (at
    /// least 1), no correction yet.
    pub fn calibrated(p: Profile, target_ms: f64) -> Self {
        Self {
            profile: Some(p),
            correction: 1.0,
            cap: (1..=MAX_CAP)
                .take_while(|&b| p.step_ms(b) <= target_ms)
                .last()
                .unwrap_or(1),
            ..Self::default()
        }
    }

    /// Expected milliseconds to run a choice of `prompt` tokens and at
    /// most `max_tokens` here, alongside what it already runs.
    /// Past its cap a choice is not batched: it waits for a slot, one
    /// freeing every `1 / cap` of a run.
    pub fn expected_ms(&self, prompt: usize, max_tokens: usize) -> f64 {
        let batch = self.outstanding + 1;
        let raw = match &self.profile {
            Some(p) if self.cap > 0 && batch > self.cap => {
                let run = p.prefill_ms(prompt) + max_tokens as f64 * p.step_ms(self.cap);
                let rounds_ahead = f64::from(batch - self.cap) / f64::from(self.cap);
                run * (1.0 + rounds_ahead)
            }
            Some(p) => p.prefill_ms(prompt) + max_tokens as f64 * p.step_ms(batch),
            None => f64::from(batch) * self.ms_per_token * max_tokens as f64,
        };
        raw * self.correction
    }

    /// A prefill placed on it alone (a split's) ended.
    pub fn prefill_done(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
        self.prefilling = self.prefilling.saturating_sub(1);
    }

    /// Whether it runs as many choices as its cap allows.
    pub fn full(&self) -> bool {
        self.cap > 0 && self.outstanding >= self.cap
    }

    /// Adjusts the cap to one observed gap against the step target.
    pub fn adapt(&mut self, gap_ms: f64, target_ms: f64) {
        if self.cap == 0 {
            return;
        }
        if gap_ms > target_ms {
            self.cap = ((f64::from(self.cap) * 0.7) as u32).max(1);
        } else if gap_ms < 0.5 * target_ms && self.outstanding >= self.cap {
            self.cap = (self.cap + 1).min(MAX_CAP);
        }
    }

    /// Learns from one observed token gap.
    pub fn observe(&mut self, gap_ms: f64) {
        self.ms_per_token = 0.9 * self.ms_per_token + 0.1 * gap_ms;
        if let Some(p) = &self.profile {
            let ratio = gap_ms / p.step_ms(self.outstanding.max(1)).max(0.01);
            self.correction = (0.95 * self.correction + 0.05 * ratio).clamp(0.25, 16.0);
        }
    }
}

/// Whose an executor is and what it charges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terms {
    /// The provider account paid for its work.
    pub provider_id: String,
    /// What a user pays per million tokens on it, the fee included.
    pub prices: Prices,
    /// Its provider's reward multiplier (reputation x uptime bonus).
    pub payout_bps: i64,
    /// Its provider's reputation (0.5-2.0x, basis points).
    pub reputation_bps: i64,
}

impl Terms {
    /// What a choice of `prompt` tokens (`cached` of them in its prefix
    /// cache) and at most `max_tokens` costs here at worst (ticks, at
    /// least one).
    pub fn choice_cost(&self, prompt: usize, cached: usize, max_tokens: usize) -> f64 {
        let q = money::ledger::Quote {
            provider_id: String::new(),
            model: String::new(),
            prices: self.prices,
            fee_bps: 0,
            payout_bps: 0,
            stages: Default::default(),
        };
        let t = Tokens {
            prompt: prompt as u64,
            cached: cached.min(prompt) as u64,
            completion: max_tokens as u64,
        };
        (q.cost(t).max(1)) as f64
    }
}

/// A net price (what the provider takes) with the protocol fee added,
/// rounded up: the price a user pays.
pub fn gross(net: i64, fee_bps: i64) -> i64 {
    let n = i128::from(net.max(0));
    let fee = (n * i128::from(fee_bps.max(0)) + i128::from(BPS) - 1) / i128::from(BPS);
    i64::try_from(n + fee).unwrap_or(i64::MAX)
}

/// How much each cost weighs (`--placement-weights`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub cost: f64,
    pub latency: f64,
    pub capability: f64,
    pub reputation: f64,
    pub load: f64,
}

impl Default for Weights {
    /// The seeds' composite weights.
    fn default() -> Self {
        Self {
            cost: 0.3,
            latency: 0.2,
            capability: 0.2,
            reputation: 0.15,
            load: 0.15,
        }
    }
}

impl std::str::FromStr for Weights {
    type Err = String;

    /// `cost=0.3,latency=0.2,...`: the terms named; the others weigh 0.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut w = Self {
            cost: 0.0,
            latency: 0.0,
            capability: 0.0,
            reputation: 0.0,
            load: 0.0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: expected term=weight"))?;
            let v: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && (0.0..=100.0).contains(v))
                .ok_or_else(|| format!("`{part}`: a weight is a number from 0 to 100"))?;
            let slot = match k.trim() {
                "cost" => &mut w.cost,
                "latency" => &mut w.latency,
                "capability" => &mut w.capability,
                "reputation" => &mut w.reputation,
                "load" => &mut w.load,
                other => {
                    return Err(format!(
                        "unknown term `{other}` (cost, latency, capability, reputation, load)"
                    ));
                }
            };
            *slot = v;
        }
        if w.latency + w.capability + w.load <= 0.0 {
            return Err("some time term (latency, capability or load) must weigh".into());
        }
        Ok(w)
    }
}

/// One executor as placement sees it for one choice: plain numbers.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub measure: Measure,
    pub terms: Terms,
    /// Weighs its expected time (the house's `--placement-house-factor`).
    pub factor: f64,
    /// Prompt tokens it likely holds in its prefix cache (`Affinity`):
    /// not computed again, and billed at the cached price.
    pub cached: usize,
    /// The house engine (this process), not a worker.
    pub house: bool,
}

impl Candidate {
    /// The weighted sum of the logarithms of its costs (smaller is better).
    pub fn score(&self, w: &Weights, prompt: usize, max_tokens: usize) -> f64 {
        let m = &self.measure;
        let penalty = if m.full() { FULL_PENALTY } else { 1.0 };
        let computed = prompt - self.cached.min(prompt);
        let latency = m.expected_ms(computed, max_tokens) * self.factor * penalty;
        let idle = Measure {
            outstanding: 0,
            ..*m
        };
        let capability = idle.expected_ms(prompt, max_tokens) * self.factor;
        let load = self.load();
        let reputation = BPS as f64 / self.terms.reputation_bps.max(1) as f64;
        let cost = self.cost(prompt, max_tokens);
        let ln = |x: f64| x.max(1e-9).ln();
        w.cost * ln(cost)
            + w.latency * ln(latency)
            + w.capability * ln(capability)
            + w.reputation * ln(reputation)
            + w.load * ln(load)
    }

    /// 1 + what it runs over its cap (1 idle, 2 at its cap).
    pub fn load(&self) -> f64 {
        let m = &self.measure;
        1.0 + f64::from(m.outstanding) / f64::from(m.cap.max(1))
    }

    /// What the choice costs here at worst (its cached prefix at the
    /// cached price).
    pub fn cost(&self, prompt: usize, max_tokens: usize) -> f64 {
        self.terms.choice_cost(prompt, self.cached, max_tokens)
    }
}

/// Executors for the placement tests: calibrated measures and terms.
#[cfg(test)]
pub(super) mod fixtures {
    use super::*;

    /// Terms asking `output` a million tokens for every price.
    pub fn terms(output: i64, reputation_bps: i64) -> Terms {
        Terms {
            provider_id: "p".into(),
            prices: Prices {
                input: output,
                cached_input: output,
                output,
            },
            payout_bps: BPS,
            reputation_bps,
        }
    }

    /// Calibrated at a `step_ms` decode step, capped at 8.
    pub fn measured(step_ms: f64) -> Measure {
        Measure {
            profile: Some(Profile {
                prefill_tokens_per_s: 1000.0,
                prefill_ms_long: 0.0,
                decode_step_ms_1: step_ms,
                decode_step_ms_4: step_ms * 1.2,
                measured_at: 0,
            }),
            cap: 8,
            ..Measure::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{measured, terms};
    use super::*;

    fn score(m: &Measure, t: &Terms, w: &Weights) -> f64 {
        Candidate {
            measure: *m,
            terms: t.clone(),
            factor: 1.0,
            cached: 0,
            house: false,
        }
        .score(w, 20, 100)
    }

    #[test]
    fn past_its_cap_a_choice_waits_for_a_slot_not_one_more_step() {
        // Capped at 8: past it a choice waits for a slot; with eight
        // running, finishing in turn, a slot frees every eighth of a run.
        // The sixteenth waits a whole run, the twenty-fourth two.
        let m = measured(10.0);
        let at = |outstanding| Measure { outstanding, ..m }.expected_ms(0, 100);
        let run = at(7);
        assert!((at(8) - 1.125 * run).abs() < 1e-6, "{} vs {run}", at(8));
        assert!((at(15) - 2.0 * run).abs() < 1e-6);
        assert!((at(23) - 3.0 * run).abs() < 1e-6);
        // Under the cap, one more choice costs one more step's share.
        assert!(at(3) < run && at(6) < run);
        // A cap of one (a phone): each choice ahead is a whole run.
        let one = Measure { cap: 1, ..m };
        let single = one.expected_ms(0, 100);
        let queued = Measure {
            outstanding: 4,
            ..one
        }
        .expected_ms(0, 100);
        assert!((queued - 5.0 * single).abs() < 1e-6, "{queued} vs {single}");
    }

    #[test]
    fn the_cheaper_of_equal_executors_wins_until_its_load_tells() {
        let w = Weights::default();
        let (cheap, dear) = (terms(100_000, BPS), terms(150_000, BPS));
        let (a, b) = (measured(10.0), measured(10.0));
        assert!(score(&a, &cheap, &w) < score(&b, &dear, &w));
        // Loaded to its cap, the cheap one is full: the dearer one wins.
        let busy = Measure {
            outstanding: 8,
            ..a
        };
        assert!(score(&busy, &cheap, &w) > score(&b, &dear, &w));
    }

    #[test]
    fn a_much_slower_executor_does_not_win_on_price_alone() {
        let w = Weights::default();
        let half_price_3x_slower = score(&measured(30.0), &terms(50_000, BPS), &w);
        let fast = score(&measured(10.0), &terms(100_000, BPS), &w);
        assert!(fast < half_price_3x_slower);
        // Half the price and a little slower: price wins.
        let half_price = score(&measured(12.0), &terms(50_000, BPS), &w);
        assert!(half_price < fast);
        // Latency alone: the fastest whatever it costs.
        let by_time: Weights = "latency=1".parse().expect("weights");
        assert!(
            score(&measured(10.0), &terms(900_000, BPS), &by_time)
                < score(&measured(11.0), &terms(1, BPS), &by_time)
        );
    }

    #[test]
    fn reputation_breaks_ties() {
        let w = Weights::default();
        let m = measured(10.0);
        assert!(score(&m, &terms(100, 20_000), &w) < score(&m, &terms(100, 5_000), &w));
    }

    #[test]
    fn weights_parse_and_refuse_nonsense() {
        assert_eq!(
            "cost=0.3,latency=0.2,capability=0.2,reputation=0.15,load=0.15"
                .parse::<Weights>()
                .expect("weights"),
            Weights::default()
        );
        for bad in ["cost=1", "speed=1", "latency=-1", "latency=nan", "latency"] {
            assert!(bad.parse::<Weights>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cached_prefix_makes_an_executor_faster_and_cheaper() {
        let w = Weights::default();
        let (m, t) = (measured(10.0), terms(100_000, BPS));
        let score = |cached| {
            Candidate {
                measure: m,
                terms: t.clone(),
                factor: 1.0,
                cached,
                house: false,
            }
            .score(&w, 2_000, 10)
        };
        assert!(score(1_600) < score(0));
    }

    #[test]
    fn gross_adds_the_fee_rounded_up() {
        assert_eq!(gross(1_000, 500), 1_050);
        assert_eq!(gross(1, 500), 2);
        assert_eq!(gross(0, 500), 0);
    }
}
