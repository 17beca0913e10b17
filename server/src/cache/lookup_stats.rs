//! What the response cache shows on `/metrics` and the admin API: each
//! tier's hits, misses, evictions and lookup time, the semantic
//! verifier's rejections by reason and the histogram of each lookup's
//! nearest similarity (recorded at each lookup), and the tiers' sizes
//! (read when scraped).

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
