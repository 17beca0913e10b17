//! Next-token sampling, per request: greedy, temperature, top-k and top-p
//! (nucleus), from the request's own seeded RNG so the same seed gives the
//! same output whatever else shares the batch.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::request::SamplingParams;

/// Temperatures below this are treated as greedy.
const GREEDY_EPS: f32 = 1e-5;

/// A request's sampler: its parameters and its own RNG.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: usize,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Self {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: params.top_k,
            rng,
        }
    }

    /// Picks the next token from raw `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.temperature < GREEDY_EPS {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.temperature;
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l * inv_t))
            .collect();
        if cands.is_empty() {
            return argmax(logits);
        }
        if self.top_k > 0 && self.top_k < cands.len() {
            cands.select_nth_unstable_by(self.top_k - 1, |a, b| b.1.total_cmp(&a.1));
            cands.truncate(self.top_k);
        }
        softmax_pairs(&mut cands);
        if self.top_p < 1.0 {
            cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
            let mut mass = 0.0;
            let keep = cands
                .iter()
                .position(|&(_, p)| {
                    mass += p;
                    mass >= self.top_p
                })
                .map_or(cands.len(), |i| i + 1);
            cands.truncate(keep);
        }
        let total: f32 = cands.iter().map(|c| c.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        for &(id, p) in &cands {
            if r < p {
                return id;
            }
            r -= p;
        }
        cands.last().map_or(0, |c| c.0)
    }
}

/// Index of the largest value (first on ties); NaN never wins.
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in xs.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Replaces the scores in `pairs` with their softmax probabilities.
fn softmax_pairs(pairs: &mut [(u32, f32)]) {
    let max = pairs.iter().map(|p| p.1).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for p in pairs.iter_mut() {
        p.1 = (p.1 - max).exp();
        sum += p.1;
    }
    for p in pairs.iter_mut() {
        p.1 /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: Some(seed),
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(&params(0.0, 1.0, 0, 1));
        assert_eq!(s.sample(&[0.1, 3.0, f32::NAN, 2.0]), 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(&params(1.0, 1.0, 0, seed));
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_never_pick_outside_the_nucleus() {
        // Token 3 holds ~88% of the mass, token 0 ~12%, the rest ~0.
        let logits = [2.0, -20.0, -20.0, 4.0, -20.0];
        let mut k1 = Sampler::new(&params(1.0, 1.0, 1, 3));
        let mut p = Sampler::new(&params(1.0, 0.5, 0, 3));
        for _ in 0..200 {
            assert_eq!(k1.sample(&logits), 3);
            assert_eq!(p.sample(&logits), 3);
        }
        let mut k2 = Sampler::new(&params(1.0, 1.0, 2, 3));
        let picks: Vec<u32> = (0..400).map(|_| k2.sample(&logits)).collect();
        assert!(picks.iter().all(|&t| t == 0 || t == 3));
        let zeros = picks.iter().filter(|&&t| t == 0).count();
        assert!(
            (20..100).contains(&zeros),
            "token 0 drawn {zeros}/400 times"
        );
    }
}
