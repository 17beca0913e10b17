//! Stop-string matching cost per generated token, at several stop-string
//! lengths: the matcher's cost per token must not grow with them (the
//! automaton is built once per request; that cost is printed apart).
//!
//! `cargo bench -p engine --bench stop`

use std::hint::black_box;
use std::time::Instant;

use engine::tokenizer::stop::StopMatcher;

fn main() {
    let tokens: Vec<String> = (0..200).map(|i| format!(" word{}", i % 17)).collect();
    for len in [8usize, 64, 256, 4096, 65_536] {
        let stops: Vec<String> = (0..4)
            .map(|k| format!("{}{}", char::from(b'A' + k), "z".repeat(len - 1)))
            .collect();
        let reps = 200u32;
        let (mut build, mut push) = (0.0, 0.0);
        for _ in 0..reps {
            let t = Instant::now();
            let mut m = StopMatcher::new(stops.clone());
            build += t.elapsed().as_secs_f64();
            let t = Instant::now();
            for tok in &tokens {
                black_box(m.push(tok));
            }
            push += t.elapsed().as_secs_f64();
        }
        println!(
            "4 stop strings of {len:>6} chars: {:>6.3} us per token, built in {:>9.1} us",
            push * 1e6 / (f64::from(reps) * tokens.len() as f64),
            build * 1e6 / f64::from(reps)
        );
    }
}
