//! How many prefill tokens a step may carry beside its decode rows, by
//! time: every running stream waits for the whole step, so a step that
//! carries a long prefill chunk stalls them all (a token budget alone lets
//! a 256-token chunk take half a second on a 1B model and two cores).
//!
//! The step's cost is learnt online as `t = a + b·decodes + c·prefill`
//! (recursive least squares with forgetting, so it follows the machine and
//! the context lengths), and a step that decodes gets the prefill tokens
//! that fit the target. A step that still runs over it shrinks a headroom
//! factor (x0.7, as the miner seed shrinks its batch); steps under it win
//! the headroom back slowly. Steps that decode nothing are not capped:
//! nobody waits between their tokens. The prefill never drops under
//! `min_chunk` tokens, so prompts progress even when decoding alone takes
//! longer than the target.

use std::time::Duration;

/// The time-budget controller of one scheduler.
#[derive(Debug, Clone)]
pub struct StepBudget {
    target: f64,
    min_chunk: usize,
    fit: Rls,
    /// Prefill steps seen (the fit is trusted once it has some).
    prefill_steps: u32,
    headroom: f64,
}

/// Headroom bounds and steps.
const SHRINK: f64 = 0.7;
const REGAIN: f64 = 1.05;
const MIN_HEADROOM: f64 = 0.2;

impl StepBudget {
    /// A controller aiming every decoding step at `target`.
    pub fn new(target: Duration, min_chunk: usize) -> Self {
        Self {
            target: target.as_secs_f64(),
            min_chunk: min_chunk.max(1),
            fit: Rls::new(),
            prefill_steps: 0,
            headroom: 1.0,
        }
    }

    /// Prefill tokens the next step may carry beside `decodes` decode rows,
    /// at most `max`.
    pub fn prefill_tokens(&self, decodes: usize, max: usize) -> usize {
        if decodes == 0 || self.prefill_steps < 2 {
            return max;
        }
        let [a, b, c] = self.fit.theta;
        let decode_time = (a + b * decodes as f64).max(0.0);
        let room = self.target * self.headroom - decode_time;
        // Per-token cost under a microsecond is not learnt yet (or noise).
        let c = c.max(1e-6);
        let fit = if room > 0.0 { room / c } else { 0.0 };
        (fit.min(max as f64) as usize).max(self.min_chunk).min(max)
    }

    /// Records a step of `decodes` decode rows and `prefill` prompt tokens
    /// that took `took`.
    pub fn observe(&mut self, decodes: usize, prefill: usize, took: Duration) {
        let t = took.as_secs_f64();
        if !t.is_finite() || decodes + prefill == 0 {
            return;
        }
        self.fit.update([1.0, decodes as f64, prefill as f64], t);
        if prefill > 0 {
            self.prefill_steps = self.prefill_steps.saturating_add(1);
        }
        if decodes == 0 || prefill == 0 {
            return;
        }
        self.headroom = if t > self.target {
            (self.headroom * SHRINK).max(MIN_HEADROOM)
        } else {
            (self.headroom * REGAIN).min(1.0)
        };
    }

    /// The learnt step cost: (fixed, per decode row, per prefill token),
    /// in seconds.
    pub fn cost(&self) -> [f64; 3] {
        self.fit.theta
    }
}

/// Recursive least squares over three features with exponential
/// forgetting.
#[derive(Debug, Clone)]
struct Rls {
    theta: [f64; 3],
    p: [[f64; 3]; 3],
}

/// Weight of the past per observation (an effective memory of about 50
/// steps).
const FORGET: f64 = 0.98;

impl Rls {
    fn new() -> Self {
        let big = 1e4;
        Self {
            theta: [0.0; 3],
            p: [[big, 0.0, 0.0], [0.0, big, 0.0], [0.0, 0.0, big]],
        }
    }

    fn update(&mut self, x: [f64; 3], y: f64) {
        let px: [f64; 3] = std::array::from_fn(|i| (0..3).map(|j| self.p[i][j] * x[j]).sum());
        let denom = FORGET + (0..3).map(|i| x[i] * px[i]).sum::<f64>();
        if !denom.is_finite() || denom <= 0.0 {
            *self = Self::new();
            return;
        }
        let k: [f64; 3] = std::array::from_fn(|i| px[i] / denom);
        let err = y - (0..3).map(|i| self.theta[i] * x[i]).sum::<f64>();
        for (t, ki) in self.theta.iter_mut().zip(k) {
            *t += ki * err;
        }
        // P = (P - k·(P x)ᵀ) / λ  (P stays symmetric).
        for (row, ki) in self.p.iter_mut().zip(k) {
            for (v, pxj) in row.iter_mut().zip(px) {
                *v = (*v - ki * pxj) / FORGET;
            }
        }
        if self.theta.iter().any(|t| !t.is_finite()) {
            *self = Self::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    /// A machine whose step costs 5 ms + 6 ms per decode row + 2 ms per
    /// prefill token, with ±10% noise.
    fn machine(rng: &mut StdRng, d: usize, p: usize) -> f64 {
        (5.0 + 6.0 * d as f64 + 2.0 * p as f64) * rng.random_range(0.9..1.1)
    }

    #[test]
    fn learns_the_cost_and_keeps_decoding_steps_near_the_target() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b = StepBudget::new(ms(100.0), 16);
        // Prefill-only steps first (nobody decodes yet): uncapped.
        assert_eq!(b.prefill_tokens(0, 256), 256);
        for _ in 0..4 {
            b.observe(0, 256, ms(machine(&mut rng, 0, 256)));
        }
        let mut over = 0;
        let mut carried = 0;
        for step in 0..400 {
            let d = 1 + step % 8;
            let p = b.prefill_tokens(d, 256);
            let t = machine(&mut rng, d, p);
            if t > 100.0 * 1.1 {
                over += 1;
            }
            carried += p;
            b.observe(d, p, ms(t));
        }
        let [_, per_row, per_token] = b.cost();
        assert!((per_token - 2e-3).abs() < 0.4e-3, "{:?}", b.cost());
        assert!((per_row - 6e-3).abs() < 2e-3, "{:?}", b.cost());
        assert!(over < 8, "{over} of 400 steps over the target by 10%");
        // About (100 - 5 - 6·4.5) / 2 = 34 tokens a step on average.
        assert!(carried / 400 > 25, "only {} tokens a step", carried / 400);
    }

    #[test]
    fn a_miss_shrinks_the_headroom_and_the_floor_keeps_prompts_moving() {
        let mut b = StepBudget::new(ms(50.0), 16);
        for _ in 0..3 {
            b.observe(0, 100, ms(100.0));
        }
        let before = b.prefill_tokens(1, 256);
        b.observe(1, before, ms(120.0));
        assert!(b.prefill_tokens(1, 256) < before);
        // Decoding alone over the target: still the floor.
        let mut slow = StepBudget::new(ms(10.0), 16);
        for _ in 0..3 {
            slow.observe(0, 64, ms(64.0));
            slow.observe(32, 0, ms(40.0));
        }
        assert_eq!(slow.prefill_tokens(32, 256), 16);
        assert_eq!(slow.prefill_tokens(32, 8), 8, "never over the max");
    }

    #[test]
    fn garbage_timings_never_break_the_budget() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut b = StepBudget::new(ms(80.0), 4);
        for _ in 0..2_000 {
            let d = rng.random_range(0..64);
            let p = rng.random_range(0..512);
            let t = match rng.random_range(0..4) {
                0 => Duration::ZERO,
                1 => Duration::from_secs(rng.random_range(0..100)),
                _ => ms(rng.random_range(0.0..500.0)),
            };
            b.observe(d, p, t);
            let max = rng.random_range(1..512);
            let got = b.prefill_tokens(rng.random_range(0..64), max);
            assert!(got >= 1 && got <= max, "{got} of {max}");
        }
    }
}
