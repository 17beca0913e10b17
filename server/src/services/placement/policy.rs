//! Where a choice goes, decided by a `Policy` over a `Snapshot`: plain
//! numbers read once (each candidate's measure, terms and cached prefix),
//! no locks, no fleet, no clock. The dispatcher builds the snapshot and
//! acts on the pick; the policies are pure and tested at their
//! boundaries here (the shape of Dynamo's `conditional_disagg.rs`: a
//! policy trait over a struct of numbers, made by a factory from config).
//!
//! - `CostModel` (`--placement measured`, the default): the lowest
//!   weighted log-score (`Candidate::score`), the house first on ties.
//! - `RoundRobin`: the workers in turn, the house only when none is left.
//! - `LeastLoaded`: the worker with the least load for its cap.
//! - `CheapestFirst`: the cheapest worker with room.
//!
//! The last three are baselines for comparisons (the fleet benchmark, the
//! simulator); only the cost model weighs the house against the workers.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::score::{Candidate, Weights};

/// What placement sees of one choice.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Snapshot {
    /// Prompt tokens (a replay's include those already delivered).
    pub prompt: usize,
    /// The most tokens it may still produce.
    pub max_tokens: usize,
    /// The candidates: the house engine (when it may run the choice)
    /// first, then the workers.
    pub candidates: Vec<Candidate>,
}

impl Snapshot {
    pub fn new(prompt: usize, max_tokens: usize, candidates: Vec<Candidate>) -> Self {
        Self {
            prompt,
            max_tokens,
            candidates,
        }
    }

    /// The workers' indices, in order.
    fn workers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.candidates.len()).filter(|&i| !self.candidates[i].house)
    }

    /// The house's index, if it is a candidate.
    fn house(&self) -> Option<usize> {
        self.candidates.iter().position(|c| c.house)
    }

    /// The first of `indices` with the least `key` (ties: the first).
    fn least(
        &self,
        indices: impl Iterator<Item = usize>,
        key: impl Fn(&Candidate) -> f64,
    ) -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        for i in indices {
            let k = key(&self.candidates[i]);
            if best.is_none_or(|(b, _)| k < b) {
                best = Some((k, i));
            }
        }
        best.map(|(_, i)| i)
    }
}

/// A way to place choices.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// The candidate the choice goes to (an index into the snapshot's
    /// candidates); `None` only when there is none.
    fn pick(&self, s: &Snapshot) -> Option<usize>;

    /// Whether a new choice waits for room when its pick is at its batch
    /// cap (admission); a policy blind to load never holds one back.
    fn waits_for_room(&self) -> bool {
        true
    }
}

/// The policies `--placement` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    #[default]
    Measured,
    RoundRobin,
    LeastLoaded,
    CheapestFirst,
}

/// The policy `kind` names, weighing by `weights` where it weighs.
pub fn policy(kind: PolicyKind, weights: Weights) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Measured => Box::new(CostModel { weights }),
        PolicyKind::RoundRobin => Box::new(RoundRobin::default()),
        PolicyKind::LeastLoaded => Box::new(LeastLoaded),
        PolicyKind::CheapestFirst => Box::new(CheapestFirst),
    }
}

/// The lowest weighted score of price, time, capability, reputation and
/// load (`Candidate::score`).
#[derive(Debug, Clone, Copy)]
pub struct CostModel {
    pub weights: Weights,
}

impl Policy for CostModel {
    fn pick(&self, s: &Snapshot) -> Option<usize> {
        let score = |c: &Candidate| c.score(&self.weights, s.prompt, s.max_tokens);
        s.least(0..s.candidates.len(), score)
    }
}

/// The workers in turn; the house when no worker is a candidate.
#[derive(Debug, Default)]
pub struct RoundRobin {
    turn: AtomicUsize,
}

impl Policy for RoundRobin {
    fn pick(&self, s: &Snapshot) -> Option<usize> {
        let workers: Vec<usize> = s.workers().collect();
        if workers.is_empty() {
            return s.house();
        }
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        Some(workers[turn % workers.len()])
    }

    fn waits_for_room(&self) -> bool {
        false
    }
}

/// The worker running the least for its cap; the house when no worker
/// is a candidate.
#[derive(Debug, Clone, Copy)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn pick(&self, s: &Snapshot) -> Option<usize> {
        s.least(s.workers(), Candidate::load).or_else(|| s.house())
    }
}

/// The worker whose price for the choice is lowest among those with
/// room (all full: the cheapest); the house when no worker is a
/// candidate.
#[derive(Debug, Clone, Copy)]
pub struct CheapestFirst;

impl Policy for CheapestFirst {
    fn pick(&self, s: &Snapshot) -> Option<usize> {
        let cost = |c: &Candidate| c.cost(s.prompt, s.max_tokens);
        let room = s.workers().filter(|&i| !s.candidates[i].measure.full());
        s.least(room, cost)
            .or_else(|| s.least(s.workers(), cost))
            .or_else(|| s.house())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::placement::score::Measure;
    use crate::services::placement::score::fixtures::{measured, terms};
    use money::ledger::amount::BPS;

    /// A calibrated candidate: `step_ms` a decode step, `output` a
    /// million tokens (every price), running `outstanding` of `cap`.
    fn candidate(step_ms: f64, output: i64, outstanding: u32, cap: u32) -> Candidate {
        Candidate {
            measure: Measure {
                outstanding,
                cap,
                ..measured(step_ms)
            },
            terms: terms(output, BPS),
            factor: 1.0,
            cached: 0,
            house: false,
        }
    }

    fn house(mut c: Candidate) -> Candidate {
        c.house = true;
        c
    }

    fn snapshot(candidates: Vec<Candidate>) -> Snapshot {
        Snapshot::new(20, 100, candidates)
    }

    fn by_time() -> CostModel {
        CostModel {
            weights: "latency=1".parse().expect("weights"),
        }
    }

    #[test]
    fn boundary_equal_scores_go_to_the_first_candidate_the_house() {
        let s = snapshot(vec![
            house(candidate(10.0, 100, 0, 8)),
            candidate(10.0, 100, 0, 8),
        ]);
        assert_eq!(by_time().pick(&s), Some(0));
        // A hair faster, and the worker wins.
        let s = snapshot(vec![
            house(candidate(10.0, 100, 0, 8)),
            candidate(9.99, 100, 0, 8),
        ]);
        assert_eq!(by_time().pick(&s), Some(1));
    }

    #[test]
    fn boundary_a_worker_at_its_cap_counts_four_times_slower() {
        let fast = |outstanding| candidate(5.0, 100, outstanding, 4);
        // One under its cap: still faster than a 2.5x slower idle one.
        let s = snapshot(vec![candidate(12.5, 100, 0, 4), fast(3)]);
        assert_eq!(by_time().pick(&s), Some(1));
        // At its cap the penalty tells.
        let s = snapshot(vec![candidate(12.5, 100, 0, 4), fast(4)]);
        assert_eq!(by_time().pick(&s), Some(0));
    }

    #[test]
    fn boundary_the_house_factor_weighs_the_houses_time() {
        // Twice the worker's speed at both stages.
        let mut h = house(candidate(5.0, 100, 0, 8));
        if let Some(p) = &mut h.measure.profile {
            p.prefill_tokens_per_s = 2000.0;
        }
        let w = candidate(10.0, 100, 0, 8);
        assert_eq!(
            by_time().pick(&snapshot(vec![h.clone(), w.clone()])),
            Some(0)
        );
        // Weighed twice over, the house is exactly as fast: still its tie.
        h.factor = 2.0;
        assert_eq!(
            by_time().pick(&snapshot(vec![h.clone(), w.clone()])),
            Some(0)
        );
        h.factor = 2.01;
        assert_eq!(by_time().pick(&snapshot(vec![h, w])), Some(1));
    }

    #[test]
    fn no_candidate_no_pick_and_the_house_alone_takes_every_choice() {
        let empty = snapshot(Vec::new());
        let only_house = snapshot(vec![house(candidate(10.0, 100, 50, 8))]);
        for kind in [
            PolicyKind::Measured,
            PolicyKind::RoundRobin,
            PolicyKind::LeastLoaded,
            PolicyKind::CheapestFirst,
        ] {
            let p = policy(kind, Weights::default());
            assert_eq!(p.pick(&empty), None, "{kind:?}");
            assert_eq!(p.pick(&only_house), Some(0), "{kind:?}");
        }
    }

    #[test]
    fn round_robin_takes_the_workers_in_turn_and_never_queues() {
        let p = policy(PolicyKind::RoundRobin, Weights::default());
        let s = snapshot(vec![
            house(candidate(1.0, 1, 0, 8)),
            candidate(10.0, 100, 0, 8),
            candidate(90.0, 900, 8, 8),
        ]);
        let got: Vec<_> = (0..4).map(|_| p.pick(&s)).collect();
        assert_eq!(got, [Some(1), Some(2), Some(1), Some(2)]);
        assert!(!p.waits_for_room());
        assert!(policy(PolicyKind::Measured, Weights::default()).waits_for_room());
    }

    #[test]
    fn least_loaded_goes_by_load_for_the_cap_whatever_the_speed() {
        let p = LeastLoaded;
        // 3 of 4 is busier than 5 of 16.
        let s = snapshot(vec![
            house(candidate(1.0, 1, 0, 8)),
            candidate(5.0, 100, 3, 4),
            candidate(50.0, 100, 5, 16),
        ]);
        assert_eq!(p.pick(&s), Some(2));
        // Equal loads: the first.
        let s = snapshot(vec![candidate(5.0, 100, 2, 4), candidate(50.0, 100, 4, 8)]);
        assert_eq!(p.pick(&s), Some(0));
    }

    #[test]
    fn cheapest_first_skips_the_full_until_all_are_full() {
        let p = CheapestFirst;
        let (cheap, dear) = (candidate(50.0, 10, 0, 2), candidate(5.0, 90, 0, 2));
        let s = snapshot(vec![
            house(candidate(1.0, 1, 0, 8)),
            cheap.clone(),
            dear.clone(),
        ]);
        assert_eq!(p.pick(&s), Some(1), "the house is no worker");
        let full = |mut c: Candidate| {
            c.measure.outstanding = 2;
            c
        };
        let s = snapshot(vec![full(cheap.clone()), dear.clone()]);
        assert_eq!(p.pick(&s), Some(1), "the cheap one is full");
        let s = snapshot(vec![full(cheap), full(dear)]);
        assert_eq!(p.pick(&s), Some(0), "all full: the cheapest");
    }
}
