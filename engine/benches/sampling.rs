//! The cost of sampling one token from a 1B-8B model's vocabulary (Llama
//! 3's 128,256 entries), per sampling setting: greedy, temperature alone,
//! top-p, top-k, min-p. A decode step samples every running sequence in
//! turn, so this cost adds to each step once per sequence.
//!
//! `cargo bench -p engine --bench sampling`
//!
//! Two kinds of logits, seeded: "peaked" like a trained model's (a
//! Gaussian bulk with a few tokens far above it: the top-p nucleus is a
//! handful of tokens), and "flat" (the Gaussian bulk alone, as a
//! random-weight model gives: the nucleus is most of the vocabulary).

use std::hint::black_box;
use std::time::Instant;

use engine::sampling::{SamplingSpec, sample};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 128_256;

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut StdRng) -> f32 {
    let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-12), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

fn logits(peaked: bool, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut l: Vec<f32> = (0..VOCAB).map(|_| 2.0 * normal(&mut rng)).collect();
    if peaked {
        for (boost, count) in [(16.0, 3), (12.0, 20), (9.0, 200)] {
            for _ in 0..count {
                let i = rng.random_range(0..VOCAB);
                l[i] += boost;
            }
        }
    }
    l
}

fn spec(temperature: f32, top_p: f32, top_k: usize, min_p: f32) -> SamplingSpec {
    SamplingSpec {
        temperature,
        top_p,
        top_k,
        min_p,
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        logit_bias: Vec::new(),
        logprobs: None,
        seed: 7,
    }
}

fn main() {
    let cases = [
        ("greedy", spec(0.0, 1.0, 0, 0.0)),
        ("temperature 0.8", spec(0.8, 1.0, 0, 0.0)),
        ("temperature 0.8, top-p 0.95", spec(0.8, 0.95, 0, 0.0)),
        ("temperature 0.8, top-k 40", spec(0.8, 1.0, 40, 0.0)),
        (
            "temperature 0.8, top-p 0.9, min-p 0.05",
            spec(0.8, 0.9, 0, 0.05),
        ),
    ];
    for peaked in [true, false] {
        let rows: Vec<Vec<f32>> = (0..8).map(|s| logits(peaked, s)).collect();
        let kind = if peaked { "peaked" } else { "flat" };
        for (name, spec) in &cases {
            let reps = 40;
            let mut times = Vec::with_capacity(reps);
            for r in 0..reps {
                let row = &rows[r % rows.len()];
                let t = Instant::now();
                black_box(sample(spec, None, None, r as u64, black_box(row)));
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            times.sort_by(f64::total_cmp);
            println!(
                "{kind:>6} logits, {name:<40} {:8.1} us per token (p50; p90 {:.1})",
                times[reps / 2],
                times[reps * 9 / 10]
            );
        }
    }
}
