//! When a semantic near match may be served, learned from verification
//! (after vCache, "verified semantic prompt caching", ICLR 2026; written
//! from its description). Each cached entry keeps the outcomes of the
//! near matches it was verified against: at similarity `s`, was the
//! answer the same? It models the chance that it is as
//! `sigmoid(gamma * (s - t))`, fitted by maximum likelihood (Newton's
//! method on the logistic loss), with the variance of its threshold `t`
//! by the delta method. A near match at `s` is served with a probability
//! that keeps wrong answers under the user's bound `delta`: with `alpha`
//! a lower confidence bound on the chance that it is right, it is served
//! with probability `min(1, delta / (1 - alpha))`, so the chance of
//! serving a wrong answer is at most `delta`; otherwise it is generated
//! anyway, compared, and the outcome becomes one more observation.
//! Pure: the cache feeds it observations and a uniform draw.

/// Real observations an entry needs before it may be served at all.
pub const MIN_OBSERVATIONS: usize = 4;

/// Outcomes an entry keeps (the oldest go first): they bound its memory
/// and the cost of a fit.
pub const MAX_OBSERVATIONS: usize = 1000;

/// The outcomes an entry was verified against: (similarity, same answer).
/// Two pseudo-observations anchor the fit (similarity 0 is never the
/// same answer, 1 always is). The fit is kept until the next outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Observations {
    seen: Vec<(f32, bool)>,
    fitted: Option<Option<Fit>>,
}

impl Default for Observations {
    fn default() -> Self {
        Self {
            seen: vec![(0.0, false), (1.0, true)],
            fitted: None,
        }
    }
}

impl Observations {
    /// Adds an outcome (the similarity clamped to 0-1).
    pub fn add(&mut self, similarity: f32, same: bool) {
        let s = if similarity.is_finite() {
            similarity.clamp(0.0, 1.0)
        } else {
            0.0
        };
        if self.seen.len() >= MAX_OBSERVATIONS + 2 {
            self.seen.remove(2);
        }
        self.seen.push((s, same));
        self.fitted = None;
    }

    /// The boundary of its outcomes (fitted once per change).
    pub fn boundary(&mut self) -> Option<Fit> {
        if self.fitted.is_none() {
            self.fitted = Some(fit(self));
        }
        self.fitted.flatten()
    }

    /// Outcomes observed (the two anchors left out).
    pub fn real(&self) -> usize {
        self.seen.len() - 2
    }

    pub fn all(&self) -> &[(f32, bool)] {
        &self.seen
    }
}

/// A fitted boundary: the threshold, the steepness and the variance of
/// the threshold's estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    pub t: f64,
    pub gamma: f64,
    pub var_t: f64,
}

/// The steepest boundary a fit takes (a similarity step of 0.01 then
/// moves the odds by e^5).
const MAX_GAMMA: f64 = 500.0;

/// The boundary of `obs` (`None` when the fit fails).
pub fn fit(obs: &Observations) -> Option<Fit> {
    let pts = obs.all();
    let (lo_pos, hi_neg) = (
        pts.iter()
            .filter(|p| p.1)
            .map(|p| f64::from(p.0))
            .fold(f64::INFINITY, f64::min),
        pts.iter()
            .filter(|p| !p.1)
            .map(|p| f64::from(p.0))
            .fold(f64::NEG_INFINITY, f64::max),
    );
    if lo_pos > hi_neg {
        // Separated: the likelihood has no maximum. The threshold lies
        // somewhere in the gap (uniformly: its variance is gap^2 / 12),
        // plus an uncertainty that shrinks with the evidence.
        let gap = lo_pos - hi_neg;
        return Some(Fit {
            t: (lo_pos + hi_neg) / 2.0,
            gamma: MAX_GAMMA,
            var_t: gap * gap / 12.0 + 0.2 / pts.len() as f64,
        });
    }
    let (b0, b1, cov) = logistic(pts)?;
    let gamma = b1.clamp(1e-6, MAX_GAMMA);
    let t = (-b0 / gamma).clamp(0.0, 1.0);
    // The delta method: t = -b0 / b1, its gradient (-1 / b1, b0 / b1^2).
    let g = [-1.0 / gamma, b0 / (gamma * gamma)];
    let var_t =
        g[0] * (cov[0][0] * g[0] + cov[0][1] * g[1]) + g[1] * (cov[1][0] * g[0] + cov[1][1] * g[1]);
    Some(Fit {
        t,
        gamma,
        var_t: var_t.max(0.0),
    })
}

/// Maximum likelihood of `P(same) = sigmoid(b0 + b1 * s)` by Newton's
/// method from 0; the coefficients and their covariance (the inverse
/// Hessian at the optimum).
fn logistic(pts: &[(f32, bool)]) -> Option<(f64, f64, [[f64; 2]; 2])> {
    let mut b = [0.0f64, 0.0];
    let mut inv = [[0.0; 2]; 2];
    for _ in 0..100 {
        let (mut g, mut h) = ([0.0f64; 2], [[0.0f64; 2]; 2]);
        for &(s, y) in pts {
            let x = [1.0, f64::from(s)];
            let p = sigmoid(b[0] + b[1] * x[1]);
            let w = (p * (1.0 - p)).max(1e-12);
            let r = f64::from(u8::from(y)) - p;
            for i in 0..2 {
                g[i] += r * x[i];
                for j in 0..2 {
                    h[i][j] += w * x[i] * x[j];
                }
            }
        }
        // A whisper of ridge keeps a nearly separated fit finite.
        h[1][1] += 1e-9;
        let det = h[0][0] * h[1][1] - h[0][1] * h[1][0];
        if !det.is_finite() || det.abs() < 1e-300 {
            return None;
        }
        inv = [
            [h[1][1] / det, -h[0][1] / det],
            [-h[1][0] / det, h[0][0] / det],
        ];
        let step = [
            inv[0][0] * g[0] + inv[0][1] * g[1],
            inv[1][0] * g[0] + inv[1][1] * g[1],
        ];
        b = [b[0] + step[0], b[1] + step[1]];
        if !b[0].is_finite() || !b[1].is_finite() || b[1].abs() > 1e6 {
            return None;
        }
        if step[0].abs() + step[1].abs() < 1e-10 {
            break;
        }
    }
    Some((b[0], b[1], inv))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The probability of generating anyway (exploring) a near match at
/// `similarity` to an entry with boundary `f`, for a bound `delta` on
/// wrong answers: the least over confidence levels `1 - eps` of
/// `1 - delta / (1 - alpha)`, `alpha = (1 - eps) * P(same)` at the
/// threshold's upper confidence bound.
pub fn explore_probability(f: &Fit, similarity: f32, delta: f64) -> f64 {
    let s = f64::from(similarity);
    let sd = f.var_t.sqrt();
    // Confidence levels from 1 - 1e-6 to 1/2, log-spaced: a bound of 1%
    // needs levels finer than a linear grid's.
    let (lo, hi) = (1e-6f64.ln(), 0.5f64.ln());
    (0..50)
        .map(|i| {
            let eps = (lo + (hi - lo) * f64::from(i) / 49.0).exp();
            let t_up = (f.t + normal_quantile(1.0 - eps) * sd).clamp(0.0, 1.0);
            let alpha = (1.0 - eps) * sigmoid(f.gamma * (s - t_up));
            1.0 - delta / (1.0 - alpha).max(1e-12)
        })
        .fold(f64::INFINITY, f64::min)
        .clamp(0.0, 1.0)
}

/// What to do with a near match.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Serve the cached answer.
    Serve,
    /// Generate anyway and learn from the comparison (with the explore
    /// probability it was drawn against).
    Verify(f64),
}

/// Decides for a near match at `similarity` to an entry verified as
/// `obs`, with `u` a uniform draw in 0-1: too few outcomes, or a draw
/// under the explore probability, verify; otherwise serve.
pub fn decide(obs: &mut Observations, similarity: f32, delta: f64, u: f64) -> Decision {
    if obs.real() < MIN_OBSERVATIONS {
        return Decision::Verify(1.0);
    }
    let Some(f) = obs.boundary() else {
        return Decision::Verify(1.0);
    };
    let tau = explore_probability(&f, similarity, delta);
    if u < tau {
        Decision::Verify(tau)
    } else {
        Decision::Serve
    }
}

/// The standard normal's quantile (Acklam's rational approximation,
/// relative error under 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn the_normal_quantile_matches_known_values() {
        for (p, z) in [
            (0.5, 0.0),
            (0.975, 1.959_963_985),
            (0.99, 2.326_347_874),
            (0.001, -3.090_232_306),
            (1e-6, -4.753_424_309),
        ] {
            assert!(
                (normal_quantile(p) - z).abs() < 1e-6,
                "{p}: {}",
                normal_quantile(p)
            );
        }
    }

    #[test]
    fn a_fit_finds_the_boundary_it_was_drawn_from() {
        let mut rng = StdRng::seed_from_u64(48);
        let mut obs = Observations::default();
        for _ in 0..4000 {
            let s: f32 = rng.random_range(0.6..1.0);
            let p = sigmoid(40.0 * (f64::from(s) - 0.85));
            obs.add(s, rng.random_bool(p));
        }
        let f = fit(&obs).expect("fit");
        assert!((f.t - 0.85).abs() < 0.01, "{f:?}");
        assert!((f.gamma - 40.0).abs() < 6.0, "{f:?}");
        assert!(f.var_t > 0.0 && f.var_t < 1e-4, "{f:?}");
    }

    #[test]
    fn separated_outcomes_put_the_threshold_in_the_gap() {
        let mut obs = Observations::default();
        for (s, same) in [(0.7, false), (0.8, false), (0.9, true), (0.95, true)] {
            obs.add(s, same);
        }
        let f = fit(&obs).expect("fit");
        assert!((f.t - 0.85).abs() < 1e-6, "{f:?}");
        assert!((f.var_t - (0.01 / 12.0 + 0.2 / 6.0)).abs() < 1e-6, "{f:?}");
    }

    #[test]
    fn an_entry_without_evidence_is_verified_and_a_sure_one_is_served() {
        let mut obs = Observations::default();
        assert_eq!(decide(&mut obs, 0.99, 0.01, 0.99), Decision::Verify(1.0));
        let mut sure = Observations::default();
        for i in 0..40 {
            sure.add(0.5 + i as f32 * 0.005, false);
            sure.add(0.9 + i as f32 * 0.002, true);
        }
        // Far over the learned threshold: served on most draws.
        let f = fit(&sure).expect("fit");
        assert!(explore_probability(&f, 0.99, 0.01) < 0.2, "{f:?}");
        assert_eq!(decide(&mut sure, 0.99, 0.01, 0.5), Decision::Serve);
        // Under it: verified unless the draw spends the error budget.
        assert!(explore_probability(&f, 0.6, 0.01) >= 0.98);
    }

    /// Entries with boundaries of their own; near matches at random
    /// similarities; each served one is wrong with its true chance; each
    /// verified one adds its outcome. Wrong answers stay under the bound
    /// (a share of all near matches), and the sure ones are mostly served
    /// once the entries have learned.
    #[test]
    fn seeded_simulations_keep_wrong_answers_under_the_bound() {
        for (seed, delta) in [(1u64, 0.01f64), (2, 0.02), (3, 0.05)] {
            let mut rng = StdRng::seed_from_u64(seed);
            let truth: Vec<(f64, f64)> = (0..20)
                .map(|_| (rng.random_range(0.75..0.95), rng.random_range(15.0..80.0)))
                .collect();
            let mut entries = vec![Observations::default(); truth.len()];
            let (mut wrong, mut served, mut asked) = (0u32, 0u32, 0u32);
            let mut late_sure = (0u32, 0u32);
            for q in 0..10_000 {
                let e = rng.random_range(0..truth.len());
                let s: f32 = rng.random_range(0.6..1.0);
                let (t, g) = truth[e];
                let p_same = sigmoid(g * (f64::from(s) - t));
                asked += 1;
                let sure = p_same > 0.999;
                if q >= 5_000 && sure {
                    late_sure.1 += 1;
                }
                match decide(&mut entries[e], s, delta, rng.random()) {
                    Decision::Serve => {
                        served += 1;
                        if q >= 5_000 && sure {
                            late_sure.0 += 1;
                        }
                        if !rng.random_bool(p_same) {
                            wrong += 1;
                        }
                    }
                    Decision::Verify(_) => {
                        let same = rng.random_bool(p_same);
                        entries[e].add(s, same);
                    }
                }
            }
            // The bound holds in expectation: 15% over it allows for the
            // draws of one run (a fixed threshold at the same hit rate is
            // several times over).
            let rate = f64::from(wrong) / f64::from(asked);
            assert!(
                rate <= delta * 1.15,
                "delta {delta}: {wrong} wrong of {asked} ({rate:.4}), {served} served"
            );
            let share = f64::from(late_sure.0) / f64::from(late_sure.1.max(1));
            assert!(
                share > 0.3,
                "delta {delta}: {late_sure:?} of the sure ones served late"
            );
        }
    }
}
