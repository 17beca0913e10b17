//! The simulated traffic: a trace of requests (arrival, model, prompt and
//! output lengths, tenant, the user's region, latency targets), read from
//! JSON lines or made by the generator: Poisson arrivals, optionally in
//! bursts (a two-state modulated process), under a diurnal swing, with
//! log-normal prompt and output lengths (the shape of ShareGPT-like
//! chat traffic that vLLM's serving benchmark replays).

use rand::Rng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Seconds since the trace began.
    pub at_s: f64,
    pub model: String,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    #[serde(default)]
    pub tenant: String,
    /// The user's region (a fleet region's name).
    pub region: String,
    /// Time to first token the user needs.
    pub ttft_ms: f64,
    /// Time per output token the user needs.
    pub tpot_ms: f64,
}

/// What the generator makes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generator {
    pub requests: usize,
    /// Mean arrivals per second.
    pub rate_per_s: f64,
    /// Peak-to-mean ratio of the diurnal swing (1: flat).
    #[serde(default = "unscaled")]
    pub diurnal: f64,
    /// Rate multiplier while bursting (1: no bursts).
    #[serde(default = "unscaled")]
    pub burst: f64,
    /// Models with their shares of the traffic.
    pub models: Vec<(String, f64)>,
    /// Users' regions with their shares.
    pub regions: Vec<(String, f64)>,
    pub tenants: u32,
    /// Median and log-spread of prompt and output lengths.
    pub prompt_median: f64,
    pub prompt_sigma: f64,
    pub output_median: f64,
    pub output_sigma: f64,
    pub ttft_ms: f64,
    pub tpot_ms: f64,
}

fn unscaled() -> f64 {
    1.0
}

/// Reads a JSON-lines trace (blank lines skipped), sorted by arrival.
pub fn read(text: &str) -> anyhow::Result<Vec<Request>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Request =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!("trace line {}: {e}", i + 1))?;
        anyhow::ensure!(
            r.at_s.is_finite() && r.at_s >= 0.0 && r.ttft_ms > 0.0 && r.tpot_ms > 0.0,
            "trace line {}: times must be finite and positive",
            i + 1
        );
        out.push(r);
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(out)
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The index drawn from `weights`.
fn draw_index<T>(rng: &mut StdRng, weights: &[(T, f64)]) -> usize {
    let total: f64 = weights.iter().map(|w| w.1.max(0.0)).sum();
    let mut x = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        x -= w.1.max(0.0);
        if x < 0.0 {
            return i;
        }
    }
    weights.len() - 1
}

impl Generator {
    /// The rate at `t_s` seconds: the mean times the diurnal swing (peak
    /// at 14:00 UTC) times the burst multiplier while bursting.
    fn rate_at(&self, t_s: f64, bursting: bool) -> f64 {
        let day = (t_s / 86_400.0 - 14.0 / 24.0) * std::f64::consts::TAU;
        let a = (self.diurnal.max(1.0) - 1.0) / (self.diurnal.max(1.0) + 1.0);
        let swing = 1.0 + a * day.cos();
        let b = if bursting { self.burst.max(1.0) } else { 1.0 };
        self.rate_per_s * swing * b
    }

    /// Makes the trace (thinning a Poisson process at the peak rate).
    pub fn generate(&self, rng: &mut StdRng) -> anyhow::Result<Vec<Request>> {
        anyhow::ensure!(self.rate_per_s > 0.0, "rate_per_s must be positive");
        anyhow::ensure!(
            !self.models.is_empty() && !self.regions.is_empty(),
            "models and regions must not be empty"
        );
        let peak = self.rate_at(14.0 * 3600.0, true);
        let (mut t, mut out) = (0.0f64, Vec::with_capacity(self.requests));
        let mut bursting = false;
        while out.len() < self.requests {
            t += -rng.random_range(f64::EPSILON..1.0).ln() / peak;
            // Bursts come and go every few minutes.
            if rng.random::<f64>() < 1.0 / (peak * 120.0) {
                bursting = !bursting && self.burst > 1.0;
            }
            if rng.random::<f64>() * peak > self.rate_at(t, bursting) {
                continue;
            }
            let len = |median: f64, sigma: f64, rng: &mut StdRng| {
                (median * (sigma * normal(rng)).exp()).clamp(1.0, 32_768.0) as u32
            };
            out.push(Request {
                at_s: t,
                model: self.models[draw_index(rng, &self.models)].0.clone(),
                prompt_tokens: len(self.prompt_median, self.prompt_sigma, rng),
                output_tokens: len(self.output_median, self.output_sigma, rng),
                tenant: format!("t{}", rng.random_range(0..self.tenants.max(1))),
                region: self.regions[draw_index(rng, &self.regions)].0.clone(),
                ttft_ms: self.ttft_ms,
                tpot_ms: self.tpot_ms,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn generator(n: usize) -> Generator {
        Generator {
            requests: n,
            rate_per_s: 50.0,
            diurnal: 3.0,
            burst: 2.0,
            models: vec![("a".into(), 3.0), ("b".into(), 1.0)],
            regions: vec![("r".into(), 1.0)],
            tenants: 10,
            prompt_median: 200.0,
            prompt_sigma: 0.8,
            output_median: 150.0,
            output_sigma: 0.6,
            ttft_ms: 2000.0,
            tpot_ms: 100.0,
        }
    }

    #[test]
    fn a_seeded_trace_is_ordered_reproducible_and_has_the_asked_shape() {
        let g = generator(20_000);
        let a = g.generate(&mut StdRng::seed_from_u64(7)).expect("trace");
        let b = g.generate(&mut StdRng::seed_from_u64(7)).expect("trace");
        assert_eq!(a, b);
        assert!(a.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        let share_a = a.iter().filter(|r| r.model == "a").count() as f64 / a.len() as f64;
        assert!((share_a - 0.75).abs() < 0.02, "{share_a}");
        let mut prompts: Vec<u32> = a.iter().map(|r| r.prompt_tokens).collect();
        prompts.sort_unstable();
        let median = f64::from(prompts[prompts.len() / 2]);
        assert!((median - 200.0).abs() < 15.0, "{median}");
        // Mean rate within the swing and bursts of the asked one.
        let rate = a.len() as f64 / a.last().expect("one").at_s;
        assert!(rate > 25.0 && rate < 150.0, "{rate}");
    }

    #[test]
    fn a_trace_file_round_trips_and_bad_lines_are_named() {
        let g = generator(5);
        let t = g.generate(&mut StdRng::seed_from_u64(1)).expect("trace");
        let text: String = t
            .iter()
            .map(|r| serde_json::to_string(r).expect("json") + "\n")
            .collect();
        assert_eq!(read(&text).expect("read"), t);
        let err = read("\n{\"at_s\": 1}\n").expect_err("bad");
        assert!(err.to_string().contains("line 2"), "{err}");
        let neg = text
            .lines()
            .next()
            .expect("line")
            .replace("\"ttft_ms\":2000.0", "\"ttft_ms\":-1.0");
        assert!(read(&neg).is_err());
    }
}
