//! What the response cache shows on `/metrics` and the admin API: each
//! tier's hits, misses, evictions and lookup time, the semantic
//! verifier's rejections by reason and the histogram of each lookup's
//! nearest similarity (recorded at each lookup), per model under a bound
//! on wrong answers the near matches served and verified, the outcomes
//! and the estimated rate of wrong answers served, and the tiers' sizes
//! and the learned thresholds (read when scraped).

use std::time::Instant;

use super::semantic::Lookup;
use super::verify::Reject;
use super::{ResponseCache, Tier};
use crate::telemetry::{
    Collector, Counter, CounterVec, Histogram, IntCounter, IntCounterVec, MetricFamily, Scraped,
    collect, counter_vec, histogram, int_counter_vec,
};

/// One tier's counters: its series (label `tier`) of the cache's families.
#[derive(Debug, Clone)]
pub struct TierStats {
    pub hits: IntCounter,
    pub misses: IntCounter,
    pub evictions: IntCounter,
    pub lookups: IntCounter,
    pub lookup_seconds: Counter,
}

impl TierStats {
    pub(super) fn lookup(&self, hit: bool, started: Instant) {
        let c = if hit { &self.hits } else { &self.misses };
        c.inc();
        self.lookups.inc();
        self.lookup_seconds.inc_by(started.elapsed().as_secs_f64());
    }

    /// The mean time of a lookup, in microseconds.
    pub fn mean_lookup_us(&self) -> u64 {
        (self.lookup_seconds.get() * 1e6 / self.lookups.get().max(1) as f64) as u64
    }
}

/// The tiers' families, and each tier's series of them.
#[derive(Debug)]
pub struct LookupCounters {
    hits: IntCounterVec,
    misses: IntCounterVec,
    evictions: IntCounterVec,
    lookups: IntCounterVec,
    lookup_seconds: CounterVec,
    /// Per tier (L1, L2, L3), then the semantic index.
    pub tiers: [TierStats; 4],
}

/// The tiers as `/metrics` labels them, in `LookupCounters::tiers`' order.
const TIERS: [&str; 4] = ["l1", "l2", "l3", "semantic"];

impl Default for LookupCounters {
    fn default() -> Self {
        let tier = &["tier"];
        let hits = int_counter_vec(
            "synor:cache_hits_total",
            "Response cache hits, by tier.",
            tier,
        );
        let misses = int_counter_vec(
            "synor:cache_misses_total",
            "Response cache misses, by tier.",
            tier,
        );
        let evictions = int_counter_vec(
            "synor:cache_evictions_total",
            "Entries evicted to stay within bounds, by tier.",
            tier,
        );
        let lookups = int_counter_vec(
            "synor:cache_lookups_total",
            "Lookups, by tier (with `_seconds_total`, the mean latency).",
            tier,
        );
        let lookup_seconds = counter_vec(
            "synor:cache_lookup_seconds_total",
            "Time spent in lookups, by tier.",
            tier,
        );
        let tiers = TIERS.map(|t| TierStats {
            hits: hits.with_label_values(&[t]),
            misses: misses.with_label_values(&[t]),
            evictions: evictions.with_label_values(&[t]),
            lookups: lookups.with_label_values(&[t]),
            lookup_seconds: lookup_seconds.with_label_values(&[t]),
        });
        Self {
            hits,
            misses,
            evictions,
            lookups,
            lookup_seconds,
            tiers,
        }
    }
}

/// The semantic cache's own counters, beside its `TierStats`: why
/// candidates over the threshold were turned down, and how similar each
/// lookup's nearest entry was (hit or not), so an operator can see the
/// trade-off a threshold makes on live traffic.
#[derive(Debug)]
pub struct SemanticStats {
    reasons: IntCounterVec,
    /// Per `Reject::ALL` reason: lookups whose first candidate over the
    /// threshold it rejected (and that missed).
    pub rejections: [IntCounter; Reject::ALL.len()],
    /// Each lookup's nearest similarity.
    pub similarity: Histogram,
    /// Per model: what its bound on wrong answers decided.
    learned: std::sync::Mutex<std::collections::BTreeMap<String, Learned>>,
}

/// What one model's bound on wrong answers decided (and its judge): near matches served
/// and probed (generated anyway), how the compared probes came out, and
/// the Horvitz-Thompson estimate of the wrong answers served. A wrong
/// probe drawn with probability `p` stands for `(1 - p) / p` wrong
/// answers served in its place (the same near match, not drawn).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct Learned {
    /// Near matches served from the cache.
    pub served: u64,
    /// Near matches generated anyway, to compare.
    pub probed: u64,
    /// Compared probes whose answer matched the cached one.
    pub verified: u64,
    /// Compared probes whose answer differed (verification failures).
    pub failed: u64,
    /// Near matches the judge said get the same answer (served).
    pub judged_same: u64,
    /// Near matches the judge refused (generated).
    pub judged_different: u64,
    #[serde(skip)]
    wrong: f64,
    #[serde(skip)]
    wrong_var: f64,
    /// The summed weight of the probes drawn with probability under 1.
    #[serde(skip)]
    weights: (f64, u64),
}

/// The normal quantile of a two-sided 95% interval.
const Z95: f64 = 1.96;

impl Learned {
    pub(super) fn decided(&mut self, served: bool) {
        match served {
            true => self.served += 1,
            false => self.probed += 1,
        }
    }

    pub(super) fn judged(&mut self, same: bool) {
        match same {
            true => self.judged_same += 1,
            false => self.judged_different += 1,
        }
    }

    pub(super) fn verified(&mut self, same: bool, explore: f64) {
        let p = explore.clamp(1e-9, 1.0);
        let w = (1.0 - p) / p;
        if p < 1.0 {
            self.weights.0 += w;
            self.weights.1 += 1;
        }
        match same {
            true => self.verified += 1,
            false => {
                self.failed += 1;
                self.wrong += w;
                self.wrong_var += w * w * (1.0 - p);
            }
        }
    }

    /// The estimated share of near matches served wrong, with a 95%
    /// interval: the estimate's normal interval, its upper end at least
    /// three failures of an average weight (the rule of three: seeing
    /// none does not prove there are none).
    pub fn error_rate(&self) -> (f64, f64, f64) {
        let n = (self.served + self.probed).max(1) as f64;
        let est = self.wrong / n;
        let sd = self.wrong_var.sqrt() / n;
        let unseen = match self.weights.1 {
            0 => 0.0,
            k => 3.0 * self.weights.0 / k as f64 / n,
        };
        let upper = (est + Z95 * sd).max(est + unseen).min(1.0);
        ((est).min(1.0), (est - Z95 * sd).max(0.0), upper)
    }
}

/// Upper bounds of the similarity histogram's buckets (then +Inf).
pub const SIMILARITY_BUCKETS: [f64; 11] =
    [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 1.0];

impl Default for SemanticStats {
    fn default() -> Self {
        let reasons = int_counter_vec(
            "synor:cache_semantic_rejections_total",
            "Semantic lookups that missed because the verifier rejected the nearest candidate over the threshold, by reason.",
            &["reason"],
        );
        Self {
            rejections: Reject::ALL.map(|r| reasons.with_label_values(&[r.as_str()])),
            reasons,
            similarity: histogram(
                "synor:cache_semantic_similarity",
                "Similarity of each semantic lookup's nearest cached question (hit or not).",
                &SIMILARITY_BUCKETS,
            ),
            learned: Default::default(),
        }
    }
}

impl SemanticStats {
    pub(super) fn record(&self, l: &Lookup) {
        if l.hit.is_none()
            && let Some(r) = l.rejected
            && let Some(i) = Reject::ALL.iter().position(|x| *x == r)
        {
            self.rejections[i].inc();
        }
        if let Some(b) = l.best {
            self.similarity.observe(f64::from(b));
        }
    }

    pub(super) fn learned(&self, model: &str, f: impl FnOnce(&mut Learned)) {
        let mut m = self.learned.lock().unwrap_or_else(|e| e.into_inner());
        f(m.entry(model.to_string()).or_default());
    }

    /// Every model's bound tally so far.
    pub fn learned_all(&self) -> std::collections::BTreeMap<String, Learned> {
        self.learned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Upper bounds of the learned thresholds' buckets (then +Inf).
pub const THRESHOLD_BUCKETS: [f64; 9] = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0];

/// The bound's families: per model, decisions, outcomes and the
/// estimated error rate; the learned thresholds' distribution.
fn learned_families(
    learned: &std::collections::BTreeMap<String, Learned>,
    thresholds: [(&str, &[f64]); 2],
) -> Vec<MetricFamily> {
    let mut decisions = Scraped::counter(
        "synor:cache_semantic_bounded_total",
        "Near matches a bound on wrong answers decided, by model and decision (served, or probed: generated anyway to compare).",
    );
    let mut outcomes = Scraped::counter(
        "synor:cache_semantic_verifications_total",
        "Probes compared with the cached answer, by model and outcome (same: a verified match; different: a verification failure).",
    );
    let mut judged = Scraped::counter(
        "synor:cache_semantic_judged_total",
        "Near matches put to the model as a judge, by model and verdict (same: served; different: generated).",
    );
    let mut rate = Scraped::gauge(
        "synor:cache_semantic_error_rate",
        "Estimated share of near matches served a wrong answer, by model, with its 95% interval (bound: estimate, lower, upper).",
    );
    for (m, l) in learned {
        decisions.sample(&[("model", m), ("decision", "served")], l.served as f64);
        decisions.sample(&[("model", m), ("decision", "probed")], l.probed as f64);
        outcomes.sample(&[("model", m), ("outcome", "same")], l.verified as f64);
        outcomes.sample(&[("model", m), ("outcome", "different")], l.failed as f64);
        judged.sample(&[("model", m), ("verdict", "same")], l.judged_same as f64);
        judged.sample(
            &[("model", m), ("verdict", "different")],
            l.judged_different as f64,
        );
        let (est, lo, hi) = l.error_rate();
        for (b, v) in [("estimate", est), ("lower", lo), ("upper", hi)] {
            rate.sample(&[("model", m), ("bound", b)], v);
        }
    }
    let mut dist = Scraped::histogram(
        "synor:cache_semantic_learned_threshold",
        "The thresholds verification has learned (entries with outcomes of their own, and each model's pools), by signal: the similarity, or the judge's chance of the same answer.",
    );
    for (signal, values) in thresholds {
        let mut counts = [0u64; THRESHOLD_BUCKETS.len() + 1];
        for t in values {
            let i = THRESHOLD_BUCKETS
                .iter()
                .position(|b| t <= b)
                .unwrap_or(THRESHOLD_BUCKETS.len());
            counts[i] += 1;
        }
        let labels = [("signal", signal)];
        dist.distribution(&labels, &THRESHOLD_BUCKETS, &counts, values.iter().sum());
    }
    vec![
        decisions.done(),
        outcomes.done(),
        judged.done(),
        rate.done(),
        dist.done(),
    ]
}

impl ResponseCache {
    /// Every cache family: the lookups counted so far and each tier's
    /// size now.
    pub fn families(&self) -> Vec<MetricFamily> {
        let t = &self.counts;
        let s = &self.semantic_counts;
        let mut out = collect(&[
            &t.hits as &dyn Collector,
            &t.misses,
            &t.evictions,
            &t.lookups,
            &t.lookup_seconds,
            &s.reasons,
            &s.similarity,
        ]);
        let (by_similarity, by_judge) = (
            self.semantic_thresholds(false),
            self.semantic_thresholds(true),
        );
        out.extend(learned_families(
            &s.learned_all(),
            [("similarity", &by_similarity), ("judge", &by_judge)],
        ));
        let (b1, n1, b2, n2) = self.sizes();
        let n3 = self.semantic_len() as u64;
        let tier = |t: Tier| t.as_str();
        for (name, help, rows) in [
            (
                "synor:cache_bytes",
                "Bytes held, by tier.",
                vec![(tier(Tier::L1), b1), (tier(Tier::L2), b2)],
            ),
            (
                "synor:cache_entries",
                "Entries held, by tier.",
                vec![(tier(Tier::L1), n1), (tier(Tier::L2), n2), ("semantic", n3)],
            ),
        ] {
            let mut f = Scraped::gauge(name, help);
            for (t, v) in rows {
                f.sample(&[("tier", t)], v as f64);
            }
            out.push(f.done());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_probe_stands_for_the_wrong_answers_served_in_its_place() {
        let mut l = Learned::default();
        assert_eq!(l.error_rate(), (0.0, 0.0, 0.0), "nothing decided");
        // 1000 near matches: 900 served, 100 probed at p = 0.1 (learned)
        // of which 2 came out different.
        for _ in 0..900 {
            l.decided(true);
        }
        for i in 0..100 {
            l.decided(false);
            l.verified(i >= 2, 0.1);
        }
        let (est, lo, hi) = l.error_rate();
        // Each wrong probe at 0.1 stands for 9 wrong answers served.
        assert!((est - 18.0 / 1000.0).abs() < 1e-12, "{est}");
        assert!(lo < est && est < hi && lo >= 0.0, "{lo} {est} {hi}");
        assert_eq!((l.verified, l.failed), (98, 2));
        // Probes before anything was learned (p = 1) stand for nothing.
        let mut first = Learned::default();
        first.decided(false);
        first.verified(false, 1.0);
        assert_eq!(first.error_rate(), (0.0, 0.0, 0.0));
        // None wrong among learned probes: the upper end is still above 0.
        let mut clean = Learned::default();
        for _ in 0..10 {
            clean.decided(false);
            clean.verified(true, 0.5);
        }
        let (est, _, hi) = clean.error_rate();
        assert_eq!(est, 0.0);
        assert!(hi > 0.0, "rule of three: {hi}");
    }
}
