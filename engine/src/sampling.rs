//! Next-token sampling, per request, in vLLM's order: logit bias, then
//! repetition / frequency / presence penalties, then temperature, top-k,
//! top-p and min-p, then a draw from the request's own seeded RNG (the same
//! seed gives the same output whatever else shares the batch). Greedy
//! decoding takes the argmax of the penalized logits. Log-probabilities are
//! reported from the raw distribution.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::constraint::Constraint;
use crate::request::{SamplingParams, TokenLogprob};

/// Temperatures below this are treated as greedy.
const GREEDY_EPS: f32 = 1e-5;

/// A request's sampler: its parameters, its own RNG, and the token counts
/// the penalties need.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: usize,
    min_p: f32,
    repetition_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
    logit_bias: Vec<(u32, f32)>,
    logprobs: Option<usize>,
    rng: StdRng,
    /// Occurrences of each token in the output so far.
    output_counts: HashMap<u32, u32>,
    /// Tokens of the prompt (for the repetition penalty).
    prompt_tokens: std::collections::HashSet<u32>,
    /// Structured output: the matcher and the token that ends the output.
    constraint: Option<(Constraint, u32)>,
}

impl Sampler {
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let prompt_tokens = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            Default::default()
        };
        Self {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: params.top_k,
            min_p: params.min_p,
            repetition_penalty: params.repetition_penalty,
            frequency_penalty: params.frequency_penalty,
            presence_penalty: params.presence_penalty,
            logit_bias: params.logit_bias.clone(),
            logprobs: params.logprobs,
            rng,
            output_counts: HashMap::new(),
            prompt_tokens,
            constraint: None,
        }
    }

    /// Restricts every later sample to what `c` allows (`eos` ends it).
    pub fn constrain(&mut self, c: Constraint, eos: u32) {
        self.constraint = Some((c, eos));
    }

    /// Picks the next token from raw `logits` and records it.
    pub fn sample(&mut self, logits: &[f32]) -> (u32, Option<TokenLogprob>) {
        let mut processed = self.apply_processors(logits);
        if let Some((c, eos)) = &mut self.constraint {
            let masked = processed.get_or_insert_with(|| logits.to_vec());
            c.mask(masked, *eos);
        }
        let scores = processed.as_deref().unwrap_or(logits);
        let token = if self.temperature < GREEDY_EPS {
            argmax(scores)
        } else {
            self.draw(scores)
        };
        *self.output_counts.entry(token).or_default() += 1;
        if let Some((c, _)) = &mut self.constraint {
            c.consume(token);
        }
        let lp = self.logprobs.map(|k| logprobs(logits, token, k));
        (token, lp)
    }

    /// Logit bias and penalties; `None` when none apply (no copy needed).
    fn apply_processors(&self, logits: &[f32]) -> Option<Vec<f32>> {
        let penalize = self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0;
        if self.logit_bias.is_empty() && !penalize {
            return None;
        }
        let mut l = logits.to_vec();
        for &(t, b) in &self.logit_bias {
            if let Some(v) = l.get_mut(t as usize) {
                *v += b;
            }
        }
        if self.repetition_penalty != 1.0 {
            let seen = self.prompt_tokens.iter().chain(self.output_counts.keys());
            for &t in seen {
                if let Some(v) = l.get_mut(t as usize) {
                    *v = if *v > 0.0 {
                        *v / self.repetition_penalty
                    } else {
                        *v * self.repetition_penalty
                    };
                }
            }
        }
        for (&t, &c) in &self.output_counts {
            if let Some(v) = l.get_mut(t as usize) {
                *v -= self.frequency_penalty * c as f32 + self.presence_penalty;
            }
        }
        Some(l)
    }

    /// Temperature, top-k, top-p, min-p, then a draw.
    fn draw(&mut self, logits: &[f32]) -> u32 {
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
        if self.min_p > 0.0 {
            let top = cands.iter().map(|c| c.1).fold(0.0, f32::max);
            cands.retain(|c| c.1 >= self.min_p * top);
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

/// Log-probability of `token` and the `k` most likely tokens under the raw
/// distribution of `logits`.
pub fn logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let lse = max
        + logits
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| (v - max).exp())
            .sum::<f32>()
            .ln();
    let lp = |t: u32| {
        logits
            .get(t as usize)
            .map_or(f32::NEG_INFINITY, |v| v - lse)
    };
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect();
        let k = k.min(all.len());
        all.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        all.truncate(k);
        all.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        top = all.into_iter().map(|(t, v)| (t, v - lse)).collect();
    }
    TokenLogprob {
        token,
        logprob: lp(token),
        top,
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
        let mut s = Sampler::new(&params(0.0, 1.0, 0, 1), &[]);
        assert_eq!(s.sample(&[0.1, 3.0, f32::NAN, 2.0]).0, 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(&params(1.0, 1.0, 0, seed), &[]);
            (0..50).map(|_| s.sample(&logits).0).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_never_pick_outside_the_nucleus() {
        // Token 3 holds ~88% of the mass, token 0 ~12%, the rest ~0.
        let logits = [2.0, -20.0, -20.0, 4.0, -20.0];
        let mut k1 = Sampler::new(&params(1.0, 1.0, 1, 3), &[]);
        let mut p = Sampler::new(&params(1.0, 0.5, 0, 3), &[]);
        for _ in 0..200 {
            assert_eq!(k1.sample(&logits).0, 3);
            assert_eq!(p.sample(&logits).0, 3);
        }
        let mut k2 = Sampler::new(&params(1.0, 1.0, 2, 3), &[]);
        let picks: Vec<u32> = (0..400).map(|_| k2.sample(&logits).0).collect();
        assert!(picks.iter().all(|&t| t == 0 || t == 3));
        let zeros = picks.iter().filter(|&&t| t == 0).count();
        assert!(
            (20..100).contains(&zeros),
            "token 0 drawn {zeros}/400 times"
        );
    }
}
