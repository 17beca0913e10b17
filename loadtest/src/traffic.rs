//! When each request is sent: all at once (`--request-rate inf`) or with
//! gamma-distributed gaps of mean `1 / rate` (`--burstiness` is the gamma
//! shape: 1.0 gives a Poisson process, lower is burstier), as vLLM's
//! benchmark does. Seeded, so a run can be repeated exactly.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Gamma};

/// Offsets from the start of the run at which the `n` requests arrive.
pub fn arrival_offsets(n: usize, rate: f64, burstiness: f64, seed: u64) -> Vec<Duration> {
    if !rate.is_finite() {
        return vec![Duration::ZERO; n];
    }
    let mut rng = StdRng::seed_from_u64(seed);
    // Shape k and scale θ with k·θ = 1 / rate: the mean gap is 1 / rate.
    let gamma = Gamma::new(burstiness, 1.0 / (rate * burstiness));
    let mut t = 0.0f64;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += match &gamma {
                    Ok(g) => g.sample(&mut rng),
                    Err(_) => 1.0 / rate,
                };
            }
            Duration::from_secs_f64(t)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        let t = arrival_offsets(5, f64::INFINITY, 1.0, 0);
        assert!(t.iter().all(|d| d.is_zero()));
    }

    #[test]
    fn gaps_average_one_over_the_rate_and_repeat_with_the_seed() {
        for burstiness in [1.0, 0.5, 4.0] {
            let t = arrival_offsets(4001, 20.0, burstiness, 7);
            let mean_gap = t[4000].as_secs_f64() / 4000.0;
            assert!((mean_gap - 0.05).abs() < 0.005, "{burstiness}: {mean_gap}");
            assert!(t.windows(2).all(|w| w[0] <= w[1]));
            assert_eq!(t, arrival_offsets(4001, 20.0, burstiness, 7));
        }
    }

    #[test]
    fn lower_burstiness_means_more_spread_gaps() {
        let cv = |b: f64| {
            let t = arrival_offsets(4001, 10.0, b, 3);
            let gaps: Vec<f64> = t.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            var.sqrt() / mean
        };
        // A gamma's coefficient of variation is 1 / sqrt(shape).
        assert!((cv(1.0) - 1.0).abs() < 0.1);
        assert!(cv(0.25) > 1.6 && cv(4.0) < 0.6);
    }
}
