//! When a semantic near match may be served, learned from verification
//! (after vCache, "verified semantic prompt caching", ICLR 2026: a
//! user-set bound `delta` on wrong answers, decisions that explore by
//! verifying; written from its description, with a bound of our own).
//!
//! Outcomes are (similarity, same answer) pairs: an entry's own, or a
//! model's pool of every entry's. Assuming only that a nearer match is
//! never less likely to have the same answer, the outcomes in any window
//! of similarities just below a near match's bound its chance `p` of being
//! wrong from above. The bound is the least, over a few window widths, of
//! the Wilson score upper bound on the share of wrong outcomes in the
//! window. A near match at similarity `s` is then served with probability
//! `min(1, delta / bound)`, so the chance of serving it wrong,
//! `p * min(1, delta / bound)`, is at most `delta` whenever the bound
//! holds (and where that probability is under a tenth, not at all: the
//! budget is not spent on likely wrong answers). Otherwise it is generated anyway (explored), compared, and the
//! outcome becomes one more observation. Pure: the cache feeds it
//! outcomes and a uniform draw.

/// Real outcomes needed before anything is served at all.
pub const MIN_OBSERVATIONS: usize = 4;

/// Outcomes an entry keeps (the oldest go first): they bound its memory
/// and the cost of a decision.
pub const ENTRY_OUTCOMES: usize = 2000;

/// Outcomes a model's pool keeps.
pub const POOL_OUTCOMES: usize = 20_000;

/// The widths of the windows below a near match's similarity whose
/// outcomes bound its chance of being wrong.
const WINDOWS: [f32; 5] = [0.005, 0.01, 0.02, 0.05, 0.1];

/// Outcomes within this of a near match's similarity count as at it (the
/// same question asked again lands on the same similarity, give or take
/// rounding).
const TIE: f32 = 1e-4;

/// The normal quantile of each window's one-sided bound: 99.5%, so that
/// all five hold together with 97.5% confidence.
const Z: f64 = 2.576;

/// The outcomes a near match was verified against: (similarity, same).
#[derive(Debug, Clone, PartialEq)]
pub struct Observations {
    seen: std::collections::VecDeque<(f32, bool)>,
    capacity: usize,
}

impl Default for Observations {
    fn default() -> Self {
        Self::keeping(ENTRY_OUTCOMES)
    }
}

impl Observations {
    /// Outcomes that keep the newest `capacity`.
    pub fn keeping(capacity: usize) -> Self {
        Self {
            seen: Default::default(),
            capacity: capacity.max(1),
        }
    }

    /// Adds an outcome (the similarity clamped to 0-1).
    pub fn add(&mut self, similarity: f32, same: bool) {
        let s = if similarity.is_finite() {
            similarity.clamp(0.0, 1.0)
        } else {
            0.0
        };
        if self.seen.len() >= self.capacity {
            self.seen.pop_front();
        }
        self.seen.push_back((s, same));
    }

    /// Outcomes observed.
    pub fn real(&self) -> usize {
        self.seen.len()
    }

    /// An upper bound on the chance that a near match at `similarity` is
    /// wrong: the least Wilson bound over the windows below it (1 when no
    /// window holds an outcome).
    pub fn wrong_bound(&self, similarity: f32) -> f64 {
        self.windows(similarity)
            .iter()
            .map(|&(k, wrong)| wilson_upper(wrong, k))
            .fold(1.0, f64::min)
    }

    /// Per window below `similarity`: the outcomes in it and the wrong
    /// ones.
    fn windows(&self, similarity: f32) -> [(u32, u32); WINDOWS.len()] {
        let hi = similarity + TIE;
        let mut counts = [(0u32, 0u32); WINDOWS.len()];
        for &(s, same) in self.seen.iter().filter(|o| o.0 <= hi) {
            for (w, c) in WINDOWS.iter().zip(&mut counts) {
                if s >= similarity - w {
                    c.0 += 1;
                    c.1 += u32::from(!same);
                }
            }
        }
        counts
    }

    /// The lowest similarity seen from which a near match would always be
    /// served under `delta` (`None` when there is none).
    pub fn threshold(&self, delta: f64) -> Option<f32> {
        let mut at: Vec<f32> = self.seen.iter().map(|o| o.0).collect();
        at.sort_by(f32::total_cmp);
        at.dedup();
        let mut found = None;
        for s in at.into_iter().rev() {
            match self.wrong_bound(s) <= delta {
                true => found = Some(s),
                false => break,
            }
        }
        found
    }
}

/// The Wilson score interval's upper end for `wrong` of `k` (1 when
/// `k` is 0).
fn wilson_upper(wrong: u32, k: u32) -> f64 {
    if k == 0 {
        return 1.0;
    }
    let (n, z2) = (f64::from(k), Z * Z);
    let p = f64::from(wrong) / n;
    let center = p + z2 / (2.0 * n);
    let margin = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((center + margin) / (1.0 + z2 / n)).min(1.0)
}

/// An upper bound on the chance that a near match at `similarity` to an
/// entry with outcomes `own` is wrong, its model's outcomes being `pool`:
/// per window, the entry's own bound where it has seen a wrong outcome in
/// it (its own evidence of trouble overrides the pool's), else the
/// tighter of its own and the pool's (entries are taken to behave alike
/// until one shows it does not: vCache's global threshold); the least
/// over the windows.
pub fn wrong_bound(own: &Observations, pool: &Observations, similarity: f32) -> f64 {
    let (mine, all) = (own.windows(similarity), pool.windows(similarity));
    mine.iter()
        .zip(&all)
        .map(|(&(k, wrong), &(kp, wrong_p))| match wrong {
            0 => wilson_upper(0, k).min(wilson_upper(wrong_p, kp)),
            _ => wilson_upper(wrong, k),
        })
        .fold(1.0, f64::min)
}

/// The least probability of serving a near match that is served at all:
/// where the bound is over ten times `delta`, near matches are verified
/// (the rule allows serving them at `delta / bound`, but that spends the
/// budget of wrong answers on matches that are most likely wrong).
const LEAST_SERVED: f64 = 0.1;

/// The probability of serving a near match at `similarity` under
/// `delta`, given its entry's outcomes and its model's.
pub fn serve_probability(
    own: &Observations,
    pool: &Observations,
    similarity: f32,
    delta: f64,
) -> f64 {
    if own.real() + pool.real() < MIN_OBSERVATIONS {
        return 0.0;
    }
    let p = (delta / wrong_bound(own, pool, similarity).max(1e-12)).clamp(0.0, 1.0);
    if p < LEAST_SERVED { 0.0 } else { p }
}

/// What to do with a near match.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Serve the cached answer.
    Serve,
    /// Generate anyway and learn from the comparison (with the
    /// probability it had of being explored).
    Verify(f64),
}

/// Decides for a near match at `similarity` (its entry's outcomes `own`,
/// its model's `pool`), with `u` a uniform draw in 0-1: explored with
/// probability `1 - serve_probability`.
pub fn decide(
    own: &Observations,
    pool: &Observations,
    similarity: f32,
    delta: f64,
    u: f64,
) -> Decision {
    let explore = 1.0 - serve_probability(own, pool, similarity, delta);
    if u < explore {
        Decision::Verify(explore)
    } else {
        Decision::Serve
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    #[test]
    fn the_wilson_bound_shrinks_with_evidence() {
        assert_eq!(wilson_upper(0, 0), 1.0);
        let none_of_100 = wilson_upper(0, 100);
        assert!((none_of_100 - 0.0622).abs() < 1e-3, "{none_of_100}");
        assert!(wilson_upper(0, 1000) < 0.007);
        let ten_of_100 = wilson_upper(10, 100);
        assert!(ten_of_100 > 0.1 && ten_of_100 < 0.21, "{ten_of_100}");
        assert!(wilson_upper(100, 100) <= 1.0);
    }

    #[test]
    fn only_outcomes_at_or_below_a_match_bound_it() {
        let mut obs = Observations::keeping(POOL_OUTCOMES);
        for _ in 0..400 {
            obs.add(0.95, true);
            obs.add(0.80, false);
        }
        // At 0.95 the window below holds only agreeing outcomes.
        assert!(obs.wrong_bound(0.95) < 0.02, "{}", obs.wrong_bound(0.95));
        // At 0.90 none: no evidence (the ones above do not count).
        assert_eq!(obs.wrong_bound(0.90), 1.0);
        // Just above 0.80: the wrong ones below bound it.
        assert!(obs.wrong_bound(0.81) > 0.99);
        assert_eq!(obs.threshold(0.02), Some(0.95));
        assert_eq!(obs.threshold(0.001), None);
    }

    #[test]
    fn a_match_without_evidence_is_verified_and_a_sure_one_is_served() {
        let none = Observations::default();
        let mut obs = Observations::keeping(POOL_OUTCOMES);
        assert_eq!(decide(&none, &obs, 0.99, 0.01, 0.99), Decision::Verify(1.0));
        for i in 0..1000 {
            obs.add(0.98 + (i % 10) as f32 * 0.001, true);
        }
        assert_eq!(serve_probability(&none, &obs, 0.99, 0.01), 1.0);
        assert_eq!(decide(&none, &obs, 0.99, 0.01, 0.5), Decision::Serve);
        // Far under anything seen: verified.
        assert_eq!(serve_probability(&none, &obs, 0.6, 0.01), 0.0);
        // An entry that was wrong near there decides by its own outcomes.
        let mut troubled = Observations::default();
        troubled.add(0.985, false);
        assert_eq!(serve_probability(&troubled, &obs, 0.99, 0.01), 0.0);
        let mut fine = Observations::default();
        fine.add(0.7, false);
        assert_eq!(serve_probability(&fine, &obs, 0.99, 0.01), 1.0);
        let capped = Observations::keeping(3);
        assert_eq!(capped.real(), 0);
        let mut capped = capped;
        for _ in 0..5 {
            capped.add(f32::NAN, false);
        }
        assert_eq!(capped.real(), 3);
    }

    /// Entries whose true chance of the same answer rises with similarity,
    /// each about its own threshold; near matches at random similarities;
    /// each served one is wrong with its true chance; each verified one
    /// adds its outcome to its entry and to the pool, and the pool decides
    /// for entries with few of their own. Wrong answers stay under the
    /// bound (a share of all near matches), and the sure ones are mostly
    /// served once enough has been learned.
    #[test]
    fn seeded_simulations_keep_wrong_answers_under_the_bound() {
        for (seed, delta, sure_share) in [(1u64, 0.01f64, 0.1), (2, 0.02, 0.15), (3, 0.05, 0.5)] {
            let mut rng = StdRng::seed_from_u64(seed);
            let truth: Vec<(f64, f64)> = (0..20)
                .map(|_| (rng.random_range(0.75..0.95), rng.random_range(15.0..80.0)))
                .collect();
            let mut entries = vec![Observations::default(); truth.len()];
            let mut pool = Observations::keeping(POOL_OUTCOMES);
            let (mut wrong, mut served, mut asked) = (0u32, 0u32, 0u32);
            let mut late_sure = (0u32, 0u32);
            for q in 0..12_000 {
                let e = rng.random_range(0..truth.len());
                let s: f32 = rng.random_range(0.6..1.0);
                let (t, g) = truth[e];
                let p_same = sigmoid(g * (f64::from(s) - t));
                asked += 1;
                let sure = p_same > 0.999;
                if q >= 6_000 && sure {
                    late_sure.1 += 1;
                }
                match decide(&entries[e], &pool, s, delta, rng.random()) {
                    Decision::Serve => {
                        served += 1;
                        if q >= 6_000 && sure {
                            late_sure.0 += 1;
                        }
                        if !rng.random_bool(p_same) {
                            wrong += 1;
                        }
                    }
                    Decision::Verify(_) => {
                        let same = rng.random_bool(p_same);
                        entries[e].add(s, same);
                        pool.add(s, same);
                    }
                }
            }
            let rate = f64::from(wrong) / f64::from(asked);
            assert!(
                rate <= delta,
                "delta {delta}: {wrong} wrong of {asked} ({rate:.4}), {served} served"
            );
            let share = f64::from(late_sure.0) / f64::from(late_sure.1.max(1));
            assert!(
                share > sure_share,
                "delta {delta}: {late_sure:?} of the sure ones served late, {wrong} wrong"
            );
        }
    }
}
