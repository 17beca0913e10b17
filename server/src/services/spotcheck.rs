//! Spot checks of untrusted providers: a sample of the attempts workers
//! complete (a high share for providers with few jobs, a lower one for
//! proven ones) is re-scored on the house engine, the trusted executor,
//! with one prefill over the attempt's context and its output. An attempt
//! passes when every token's log-probability as the worker reported it
//! agrees with the reference within `tolerance` (calibrated on honest runs
//! of the backend pair: identical CPU builds agree exactly, see
//! BENCHMARKS.md), and, for a greedy attempt without penalties, every
//! token is in the reference's top `top_k`. Exact text is never required.
//!
//! A failed check claws the attempt's pay back from its provider (the
//! provider owes it if its balance is short) and refunds its user, cuts
//! the provider's reputation as many lost attempts, and quarantines the
//! worker: it gets no more work, and its token is refused until an admin
//! clears it.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use engine::EngineHandle;
use engine::core::TokenScore;
use rand::Rng;

use crate::telemetry::{
    Collector, Counter, Gauge, IntCounter, IntCounterVec, MetricFamily, collect, counter, gauge,
    int_counter, int_counter_vec,
};

/// A failed check weighs this many lost attempts in the reputation.
pub const CHEAT_WEIGHT: u64 = 200;

/// How much is checked, and how strictly (`--spot-check-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpotConfig {
    /// Share of a new provider's attempts checked.
    pub new_rate: f64,
    /// Share of a proven provider's attempts checked.
    pub rate: f64,
    /// Attempts delivered after which a provider counts as proven.
    pub proven_after: u64,
    /// Greedy tokens must be among the reference's `top_k` most likely.
    pub top_k: u32,
    /// Largest difference of log-probabilities (nats) that passes.
    pub tolerance: f32,
}

impl Default for SpotConfig {
    fn default() -> Self {
        Self {
            new_rate: 0.25,
            rate: 0.02,
            proven_after: 200,
            top_k: 4,
            tolerance: 0.25,
        }
    }
}

impl SpotConfig {
    /// The share (0-1) of the attempts of a provider with `delivered`
    /// attempts to its name that is checked.
    pub fn rate_for(&self, delivered: u64) -> f64 {
        let rate = if delivered < self.proven_after {
            self.new_rate
        } else {
            self.rate
        };
        rate.clamp(0.0, 1.0)
    }
}

/// What one checked attempt delivered.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The tokens before the attempt's output (prompt and replayed ones).
    pub context: Vec<u32>,
    /// Each delivered token with the log-probability the worker reported.
    pub tokens: Vec<(u32, Option<f32>)>,
    /// Greedy with no penalties or bias: its tokens must rank top-k.
    pub plain_greedy: bool,
}

/// How a check came out.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Passed, with its largest log-probability difference.
    Pass(f32),
    Fail(String),
}

/// Judges `sample` against the reference `scores` of its tokens.
pub fn judge(c: &SpotConfig, sample: &Sample, scores: &[TokenScore]) -> Verdict {
    if scores.len() != sample.tokens.len() {
        return Verdict::Fail(format!(
            "{} tokens scored for {} delivered",
            scores.len(),
            sample.tokens.len()
        ));
    }
    let mut worst = 0f32;
    for (i, (s, (token, reported))) in scores.iter().zip(&sample.tokens).enumerate() {
        let Some(lp) = reported.filter(|v| v.is_finite() && *v <= 0.0) else {
            return Verdict::Fail(format!("token {i}: no valid log-probability reported"));
        };
        if s.token != *token {
            return Verdict::Fail(format!("token {i}: scored {} for {token}", s.token));
        }
        if sample.plain_greedy && s.rank >= c.top_k {
            return Verdict::Fail(format!(
                "token {i} ({token}) is the reference's #{} choice, outside its top {}",
                s.rank + 1,
                c.top_k
            ));
        }
        let d = (lp - s.logprob).abs();
        if d.is_nan() || d > c.tolerance {
            return Verdict::Fail(format!(
                "token {i} ({token}): log-probability {lp:.3} reported, {:.3} by the reference",
                s.logprob
            ));
        }
        worst = worst.max(d);
    }
    Verdict::Pass(worst)
}

/// The least cosine a checked embedding may have with the reference's.
pub const MIN_COSINE: f32 = 0.99;

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let d = norm(a) * norm(b);
    if a.len() != b.len() || d == 0.0 || !d.is_finite() {
        return f32::NEG_INFINITY;
    }
    dot / d
}

/// Whose attempt a check judges.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    pub worker: &'a str,
    pub provider: &'a str,
}

/// One worker's spot-check record.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct WorkerChecks {
    pub worker_id: String,
    pub provider_id: String,
    /// Checks judged (canaries included), passed and failed.
    pub checked: u64,
    pub passed: u64,
    pub failed: u64,
    /// The largest difference its passed checks had, in each check's
    /// measure (nats of log-probability; 1 - cosine for an embedding; the
    /// relative distance of a stage's hidden rows): 0 where it computes
    /// the house engine's floats (every CPU path does, a browser tab's
    /// too), else its headroom below the tolerance.
    pub worst_passed: f32,
    /// Why its last failed check failed.
    pub last_failure: Option<String>,
}

/// Workers whose records are kept (the oldest passing ones are
/// forgotten first).
const MAX_RECORDS: usize = 10_000;

/// The checker: its settings, its records and its `/metrics` counters.
#[derive(Debug)]
pub struct SpotCheck {
    pub config: SpotConfig,
    /// Checks by result: `pass`, `fail`, `skipped` (the reference was
    /// busy or gone).
    results: IntCounterVec,
    /// Trusted compute spent on checks.
    seconds: Counter,
    /// Tokens re-scored.
    tokens: IntCounter,
    /// The largest difference of a passing check (nats).
    worst_pass: Gauge,
    /// Each worker's record, by worker id.
    records: Mutex<std::collections::BTreeMap<String, WorkerChecks>>,
}

impl Default for SpotCheck {
    fn default() -> Self {
        Self::new(SpotConfig::default())
    }
}

impl SpotCheck {
    pub fn new(config: SpotConfig) -> Self {
        let results = int_counter_vec(
            "synor:spot_checks_total",
            "Worker attempts re-scored on the house engine, by result (skipped: the reference could not run).",
            &["result"],
        );
        for r in ["pass", "fail", "skipped"] {
            results.with_label_values(&[r]);
        }
        Self {
            config,
            results,
            seconds: counter(
                "synor:spot_check_seconds_total",
                "House engine time spent scoring spot checks.",
            ),
            tokens: int_counter(
                "synor:spot_check_tokens_total",
                "Tokens re-scored by spot checks.",
            ),
            worst_pass: gauge(
                "synor:spot_check_max_pass_deviation",
                "The largest log-probability difference (nats) of a passing spot check.",
            ),
            records: Mutex::default(),
        }
    }

    /// The checks' families, for `/metrics`.
    pub fn families(&self) -> Vec<MetricFamily> {
        collect(&[
            &self.results as &dyn Collector,
            &self.seconds,
            &self.tokens,
            &self.worst_pass,
        ])
    }

    fn counted(&self, result: &str) {
        self.results.with_label_values(&[result]).inc();
    }

    /// Whether to check an attempt of a provider with `delivered`
    /// attempts to its name.
    pub fn pick(&self, delivered: u64) -> bool {
        let rate = self.config.rate_for(delivered);
        rate > 0.0 && rand::rng().random_bool(rate)
    }

    /// Scores `sample` on the house engine and judges it (`None`: the
    /// check could not run).
    pub async fn check(
        &self,
        house: &EngineHandle,
        sample: &Sample,
        who: Who<'_>,
    ) -> Option<Verdict> {
        let all = 0..sample.tokens.len();
        let mut v = self.check_parts(house, sample, &[(who, all)]).await?;
        v.pop()
    }

    /// Scores `sample` once on the house engine and judges each part of
    /// its tokens apart, as the attempt of its own worker (a split's first
    /// token is its prefill worker's, the rest its decode worker's); one
    /// verdict per part (`None`: the check could not run).
    pub async fn check_parts(
        &self,
        house: &EngineHandle,
        sample: &Sample,
        parts: &[(Who<'_>, Range<usize>)],
    ) -> Option<Vec<Verdict>> {
        let started = Instant::now();
        let mut all = sample.context.clone();
        all.extend(sample.tokens.iter().map(|t| t.0));
        let scored = house.score(all, sample.context.len()).await;
        self.seconds.inc_by(started.elapsed().as_secs_f64());
        let scores = match scored {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "a spot check could not run");
                self.counted("skipped");
                return None;
            }
        };
        self.tokens.inc_by(scores.len() as u64);
        let verdicts = parts
            .iter()
            .map(|(who, r)| {
                let v = match (sample.tokens.get(r.clone()), scores.get(r.clone())) {
                    (Some(tokens), Some(scores)) => {
                        let part = Sample {
                            context: Vec::new(),
                            tokens: tokens.to_vec(),
                            plain_greedy: sample.plain_greedy,
                        };
                        judge(&self.config, &part, scores)
                    }
                    _ => Verdict::Fail(format!(
                        "{} tokens scored for {} delivered",
                        scores.len(),
                        sample.tokens.len()
                    )),
                };
                self.count(*who, &v);
                v
            })
            .collect();
        Some(verdicts)
    }

    /// Counts a verdict reached elsewhere (a pipeline stage's check,
    /// which took `seconds` of trusted compute over `tokens` positions).
    pub fn judged(&self, who: Who<'_>, v: &Verdict, seconds: f64, tokens: u64) {
        self.seconds.inc_by(seconds);
        self.tokens.inc_by(tokens);
        self.count(who, v);
    }

    /// A check that could not run.
    pub fn skipped(&self) {
        self.counted("skipped");
    }

    /// Counts a verdict and adds it to its worker's record.
    fn count(&self, who: Who<'_>, v: &Verdict) {
        self.record(who, v);
        match v {
            Verdict::Pass(d) => {
                self.counted("pass");
                // Under the records' lock: two passes at once keep the larger.
                let _one_at_a_time = self.records.lock().unwrap_or_else(|e| e.into_inner());
                if f64::from(*d) > self.worst_pass.get() {
                    self.worst_pass.set(f64::from(*d));
                }
            }
            Verdict::Fail(_) => {
                self.counted("fail");
            }
        }
    }

    /// Judges a worker's embedding vectors against the house encoder's
    /// for the same inputs (`want`): each pair must point the same way
    /// (cosine at least `MIN_COSINE`; honest encoders on different CPUs
    /// differ by far less). Counted and recorded like a generation's check.
    pub fn check_vectors(&self, got: &[Vec<f32>], want: &[Vec<f32>], who: Who<'_>) -> Verdict {
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| cosine(a, b))
            .fold(f32::INFINITY, f32::min);
        let v = if got.len() == want.len() && worst >= MIN_COSINE {
            self.counted("pass");
            Verdict::Pass(1.0 - worst.min(1.0))
        } else {
            self.counted("fail");
            Verdict::Fail(format!(
                "embedding: cosine {worst:.4} with the reference (at least {MIN_COSINE})"
            ))
        };
        self.record(who, &v);
        v
    }

    /// Adds a verdict to a worker's record.
    fn record(&self, who: Who<'_>, v: &Verdict) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() >= MAX_RECORDS && !records.contains_key(who.worker) {
            let clean: Vec<String> = records
                .iter()
                .filter(|(_, r)| r.failed == 0)
                .map(|(k, _)| k.clone())
                .take(MAX_RECORDS / 10)
                .collect();
            for k in clean {
                records.remove(&k);
            }
        }
        let r = records
            .entry(who.worker.to_string())
            .or_insert_with(|| WorkerChecks {
                worker_id: who.worker.to_string(),
                provider_id: who.provider.to_string(),
                ..WorkerChecks::default()
            });
        r.checked += 1;
        match v {
            Verdict::Pass(worst) => {
                r.passed += 1;
                r.worst_passed = r.worst_passed.max(*worst);
            }
            Verdict::Fail(why) => {
                r.failed += 1;
                r.last_failure = Some(why.clone());
            }
        }
    }

    /// Every worker's record, by worker id.
    pub fn records(&self) -> Vec<WorkerChecks> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(token: u32, logprob: f32, rank: u32) -> TokenScore {
        TokenScore {
            token,
            logprob,
            rank,
        }
    }

    fn sample(tokens: &[(u32, Option<f32>)], plain_greedy: bool) -> Sample {
        Sample {
            context: vec![1, 2, 3],
            tokens: tokens.to_vec(),
            plain_greedy,
        }
    }

    #[test]
    fn honest_tokens_pass_and_each_kind_of_lie_fails() {
        let c = SpotConfig::default();
        let refs = [score(5, -0.1, 0), score(9, -2.5, 3)];
        let honest = sample(&[(5, Some(-0.1)), (9, Some(-2.45))], false);
        assert!(matches!(judge(&c, &honest, &refs), Verdict::Pass(d) if (d - 0.05).abs() < 1e-6));
        // Greedy without penalties: the second token ranks 4th, inside
        // the top 4; 5th would not be.
        assert!(matches!(
            judge(&c, &sample(&honest.tokens, true), &refs),
            Verdict::Pass(_)
        ));
        let fifth = [score(5, -0.1, 0), score(9, -2.5, 4)];
        assert!(
            matches!(judge(&c, &sample(&honest.tokens, true), &fifth), Verdict::Fail(m) if m.contains("top 4"))
        );
        // Logprobs that do not match, or none at all, or nonsense.
        for bad in [Some(-1.0), None, Some(0.5), Some(f32::NAN)] {
            let s = sample(&[(5, Some(-0.1)), (9, bad)], false);
            assert!(matches!(judge(&c, &s, &refs), Verdict::Fail(_)), "{bad:?}");
        }
        // A token count that does not match what was scored.
        assert!(matches!(
            judge(&c, &sample(&[(5, Some(-0.1))], false), &refs),
            Verdict::Fail(_)
        ));
    }

    #[test]
    fn embeddings_pass_when_they_point_the_reference_way_and_fail_otherwise() {
        let c = SpotCheck::default();
        let who = Who {
            worker: "w",
            provider: "p",
        };
        let want = vec![vec![0.6, 0.8, 0.0], vec![0.0, 0.0, 1.0]];
        let near = vec![vec![0.6001, 0.7999, 0.0001], vec![0.0, 0.0001, 1.0]];
        assert!(matches!(
            c.check_vectors(&near, &want, who),
            Verdict::Pass(_)
        ));
        let constant = vec![vec![0.1, 0.1, 0.1]; 2];
        assert!(matches!(
            c.check_vectors(&constant, &want, who),
            Verdict::Fail(_)
        ));
        let zero = vec![vec![0.0; 3]; 2];
        assert!(matches!(
            c.check_vectors(&zero, &want, who),
            Verdict::Fail(_)
        ));
        assert!(matches!(
            c.check_vectors(&want[..1], &want, who),
            Verdict::Fail(_)
        ));
        let r = &c.records()[0];
        assert_eq!((r.checked, r.passed, r.failed), (4, 1, 3));
        // A passed check's distance is kept (the largest), a failed one's
        // is not.
        let tilted = vec![vec![0.6, 0.8, 0.1], vec![0.0, 0.0, 1.0]];
        assert!(matches!(
            c.check_vectors(&tilted, &want, who),
            Verdict::Pass(_)
        ));
        c.check_vectors(&want, &want, who);
        c.check_vectors(&constant, &want, who);
        let worst = c.records()[0].worst_passed;
        assert!(
            (worst - (1.0 - 1.01f32.sqrt().recip())).abs() < 1e-4,
            "{worst}"
        );
    }

    #[test]
    fn new_providers_are_checked_more_often() {
        let s = SpotCheck::new(SpotConfig {
            new_rate: 1.0,
            rate: 0.0,
            proven_after: 10,
            ..Default::default()
        });
        assert!((0..100).all(|_| s.pick(9)));
        assert!((0..100).all(|_| !s.pick(10)));
        let half = SpotCheck::new(SpotConfig {
            new_rate: 0.5,
            ..Default::default()
        });
        let n = (0..4000).filter(|_| half.pick(0)).count();
        assert!((1700..2300).contains(&n), "{n}");
    }
}
