//! Response caches: an exact cache in three tiers (L1 in-process moka
//! bounded by bytes, L2 local disk surviving restarts, L3 Redis shared by
//! replicas), looked up in order and promoted on a hit, and a semantic
//! cache over the default embedding model. Both are scoped per tenant and
//! model. Every tier counts hits, misses, evictions, bytes and lookup time.

pub mod agree;
pub mod answer;
pub mod disk;
pub mod learned;
pub mod lexicon;
pub mod lookup_stats;
pub mod redis_tier;
pub mod semantic;
pub mod verify;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use answer::CachedAnswer;
use disk::DiskTier;
pub use lookup_stats::{Learned, LookupCounters, SIMILARITY_BUCKETS, SemanticStats, TierStats};
use redis_tier::RedisTier;
use semantic::{Bound, IndexKey, Match, Policy, Probe, SemanticIndex};
use verify::Facts;

/// The scope of the answers of a model whose cache an admin shared
/// across tenants.
pub const SHARED_SCOPE: &str = "shared";

/// Which tier answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    L1,
    L2,
    L3,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::L1, Tier::L2, Tier::L3];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::L1 => "l1",
            Self::L2 => "l2",
            Self::L3 => "l3",
        }
    }
}

/// What a semantic lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// A cached answer to serve.
    Hit(Match),
    /// A near match to generate anyway and compare with (under a bound).
    Probe(Probe),
    /// A near match to put to the judge, with its cached question.
    Judge(Match, String),
}

/// What an admin changes in a semantic policy (`None`: keep).
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyChange {
    pub threshold: Option<f32>,
    pub verify: Option<bool>,
    /// 0 turns word alignment off.
    pub align: Option<f32>,
    /// 0 turns the bound on wrong answers off.
    pub delta: Option<f32>,
    /// 0 turns the judge off.
    pub judge: Option<f32>,
}

/// Sizes and lifetimes.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub l1_bytes: u64,
    /// `None` disables L2.
    pub l2_dir: Option<PathBuf>,
    pub l2_bytes: u64,
    /// `None` disables L3.
    pub redis_url: Option<String>,
    pub ttl: Duration,
    /// The semantic policy of models without their own.
    pub policy: Policy,
    pub semantic: semantic::Limits,
}

/// The response cache of one server.
#[derive(Debug)]
pub struct ResponseCache {
    l1: moka::future::Cache<String, Arc<CachedAnswer>>,
    l2: Option<DiskTier>,
    l3: Option<RedisTier>,
    semantic: Mutex<SemanticIndex>,
    /// Per tier (L1, L2, L3), then the semantic index.
    pub counts: LookupCounters,
    pub semantic_counts: SemanticStats,
    /// The default semantic policy, and each model's own (admin-set).
    policies: Mutex<(Policy, std::collections::BTreeMap<String, Policy>)>,
    /// Models whose cache an admin made shared across tenants.
    shared: Mutex<std::collections::BTreeSet<String>>,
}

impl ResponseCache {
    pub fn new(c: &CacheConfig) -> anyhow::Result<Self> {
        let l1 = moka::future::Cache::builder()
            .weigher(|_k: &String, v: &Arc<CachedAnswer>| v.weight().try_into().unwrap_or(u32::MAX))
            .max_capacity(c.l1_bytes)
            .time_to_live(c.ttl)
            .support_invalidation_closures()
            .build();
        let l2 = match &c.l2_dir {
            Some(d) => Some(DiskTier::open(d, c.l2_bytes, c.ttl)?),
            None => None,
        };
        let l3 = match &c.redis_url {
            Some(u) => Some(RedisTier::new(u, c.ttl)?),
            None => None,
        };
        Ok(Self {
            l1,
            l2,
            l3,
            semantic: Mutex::new(SemanticIndex::new(c.semantic)),
            counts: LookupCounters::default(),
            semantic_counts: SemanticStats::default(),
            policies: Mutex::new((c.policy, Default::default())),
            shared: Mutex::default(),
        })
    }

    fn stats_of(&self, t: Tier) -> &TierStats {
        &self.counts.tiers[t as usize]
    }

    /// Each tier's counters: L1, L2, L3, then the semantic index.
    pub fn stats(&self) -> &[TierStats; 4] {
        &self.counts.tiers
    }

    pub fn semantic_stats(&self) -> &TierStats {
        &self.counts.tiers[3]
    }

    /// Looks `key` up in L1, L2, L3 in turn; a hit is copied into the
    /// tiers above it.
    pub async fn get(
        &self,
        scope: &str,
        model: &str,
        key: &str,
    ) -> Option<(Arc<CachedAnswer>, Tier)> {
        let t = Instant::now();
        let hit = self.l1.get(key).await;
        self.stats_of(Tier::L1).lookup(hit.is_some(), t);
        if let Some(a) = hit {
            return Some((a, Tier::L1));
        }
        if let Some(l2) = &self.l2 {
            let t = Instant::now();
            let hit = l2.get(key);
            self.stats_of(Tier::L2).lookup(hit.is_some(), t);
            if let Some(a) = hit {
                let a = Arc::new(a);
                self.l1.insert(key.to_string(), a.clone()).await;
                return Some((a, Tier::L2));
            }
        }
        let l3 = self.l3.as_ref()?;
        let t = Instant::now();
        let hit = l3.get(scope, model, key).await;
        self.stats_of(Tier::L3).lookup(hit.is_some(), t);
        let a = Arc::new(hit?);
        self.l1.insert(key.to_string(), a.clone()).await;
        self.put_l2(key, &a);
        Some((a, Tier::L3))
    }

    fn put_l2(&self, key: &str, a: &CachedAnswer) {
        if let Some(l2) = &self.l2 {
            match l2.put(key, a) {
                Ok(n) => self.stats_of(Tier::L2).evictions.inc_by(n),
                Err(e) => tracing::warn!(error = %e, "disk cache write failed"),
            }
        }
    }

    /// Stores an answer in every tier.
    pub async fn put(&self, key: &str, a: CachedAnswer) {
        let a = Arc::new(a);
        self.put_l2(key, &a);
        if let Some(l3) = &self.l3 {
            l3.put(key, &a).await;
        }
        self.l1.insert(key.to_string(), a).await;
    }

    /// Runs L1's pending maintenance (its sizes are then exact).
    pub async fn settle_l1(&self) {
        self.l1.run_pending_tasks().await;
    }

    /// Bytes and entries per tier: (L1 bytes, L1 entries, L2 bytes, L2
    /// entries); L1's are moka's estimates, exact after `settle_l1`.
    pub fn sizes(&self) -> (u64, u64, u64, u64) {
        let (b2, n2) = self
            .l2
            .as_ref()
            .map_or((0, 0), |d| (d.bytes(), d.len() as u64));
        (self.l1.weighted_size(), self.l1.entry_count(), b2, n2)
    }

    pub fn semantic_len(&self) -> usize {
        self.index().len()
    }

    fn index(&self) -> std::sync::MutexGuard<'_, SemanticIndex> {
        self.semantic.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn policies(
        &self,
    ) -> std::sync::MutexGuard<'_, (Policy, std::collections::BTreeMap<String, Policy>)> {
        self.policies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The semantic policy of `model` (its own, or the default).
    pub fn policy(&self, model: &str) -> Policy {
        let p = self.policies();
        p.1.get(model).copied().unwrap_or(p.0)
    }

    /// The default policy and every model's own.
    pub fn policies_set(&self) -> (Policy, std::collections::BTreeMap<String, Policy>) {
        self.policies().clone()
    }

    /// Sets the default policy (`None`) or one model's; returns it.
    pub fn set_policy(&self, model: Option<&str>, change: PolicyChange) -> Policy {
        let mut p = self.policies();
        let base = model.and_then(|m| p.1.get(m).copied()).unwrap_or(p.0);
        let new = Policy {
            threshold: change.threshold.unwrap_or(base.threshold),
            verify: change.verify.unwrap_or(base.verify),
            align: change.align.map_or(base.align, |a| (a > 0.0).then_some(a)),
            delta: change.delta.map_or(base.delta, |d| (d > 0.0).then_some(d)),
            judge: change.judge.map_or(base.judge, |j| (j > 0.0).then_some(j)),
        };
        match model {
            Some(m) => {
                p.1.insert(m.to_string(), new);
            }
            None => p.0 = new,
        }
        new
    }

    /// Whether a semantic lookup in `ik` could hit at all (any entries).
    pub fn semantic_has(&self, ik: &IndexKey) -> bool {
        self.index().has(ik)
    }

    /// The most similar cached question in `ik` over its model's
    /// threshold that the verifier accepts, if any; under the model's
    /// bound on wrong answers, served only as verification has learned it
    /// may be, and otherwise returned as a probe.
    pub fn semantic_get(&self, ik: &IndexKey, vector: &[f32], facts: &Facts) -> Option<Found> {
        let t = Instant::now();
        let mut policy = self.policy(&ik.model);
        // In a shared cache the cached question is another tenant's text:
        // it never goes before the judge (it could speak to it), and the
        // verifier decides.
        if ik.scope == SHARED_SCOPE {
            policy.judge = None;
        }
        let bound = policy.delta.map(|d| Bound {
            delta: f64::from(d),
            draw: rand::random::<f64>(),
        });
        let l = self
            .index()
            .lookup_within(ik, vector, facts, (policy, bound), Instant::now());
        // A near match put to the judge is counted once judged.
        if l.judge.is_none() {
            self.semantic_stats().lookup(l.hit.is_some(), t);
        }
        self.semantic_counts.record(&l);
        if l.bounded {
            self.semantic_counts
                .learned(&ik.model, |m| m.decided(l.hit.is_some()));
        }
        match (l.hit, l.probe, l.judge) {
            (Some(m), _, _) => Some(Found::Hit(m)),
            (None, Some(p), _) => Some(Found::Probe(p)),
            (None, None, Some((m, q))) => Some(Found::Judge(m, q)),
            (None, None, None) => None,
        }
    }

    /// The judge's chance `p` that a near match `m` in `ik`, looked up at
    /// `started`, gets the same answer (`None`: the judge failed). Under
    /// the model's bound the bound decides by it (`decide_judged`), and
    /// otherwise its judge's cut; counted as a hit or a miss of the
    /// semantic tier. The match to serve, or the probe to generate anyway
    /// (`None`: a plain miss).
    pub fn semantic_judged(
        &self,
        ik: &IndexKey,
        m: Match,
        p: Option<f64>,
        started: Instant,
    ) -> Option<Result<Match, Probe>> {
        let policy = self.policy(&ik.model);
        let found = match (p, policy.delta) {
            (None, _) => None,
            (Some(p), Some(delta)) => {
                let b = Bound {
                    delta: f64::from(delta),
                    draw: rand::random::<f64>(),
                };
                let d = self
                    .index()
                    .decide_judged(ik, m, p as f32, b, Instant::now());
                self.semantic_counts
                    .learned(&ik.model, |l| l.decided(d.is_ok()));
                Some(d)
            }
            (Some(p), None) => (f64::from(policy.judge.unwrap_or(1.0)) <= p).then_some(Ok(m)),
        };
        let served = matches!(found, Some(Ok(_)));
        self.semantic_stats().lookup(served, started);
        self.semantic_counts
            .learned(&ik.model, |l| l.judged(served));
        found
    }

    /// A probe's generated answer was compared with the cached one: its
    /// entry and its model learn the outcome.
    pub fn semantic_observe(&self, ik: &IndexKey, probe: &Probe, same: bool) {
        self.index().observe(ik, &probe.found, same, Instant::now());
        self.semantic_counts
            .learned(&ik.model, |m| m.verified(same, probe.explore));
    }

    /// The learned thresholds (entries deciding by their own outcomes,
    /// and every pool): similarities, or with `judge` the judge's chances.
    pub fn semantic_thresholds(&self, judge: bool) -> Vec<f64> {
        let policies = self.policies_set();
        let delta_of = |m: &str| {
            policies
                .1
                .get(m)
                .unwrap_or(&policies.0)
                .delta
                .map(f64::from)
        };
        self.index().thresholds(judge, delta_of)
    }

    /// The topic words of `facts` the verifier has no vectors for yet.
    pub fn semantic_missing_words(&self, facts: &Facts) -> Vec<String> {
        self.index().missing_words(facts)
    }

    /// Gives the verifier word vectors (from the query encoder).
    pub fn semantic_add_words(&self, words: Vec<(String, Vec<f32>)>) {
        self.index().add_words(words);
    }

    pub fn semantic_put(&self, ik: IndexKey, vector: Vec<f32>, text: &str, key: String) {
        let mut idx = self.index();
        let before = idx.evictions;
        idx.insert(ik, vector, text, key, Instant::now());
        let evicted = idx.evictions - before;
        self.semantic_stats().evictions.inc_by(evicted);
    }

    /// Forgets a semantic entry whose answer is gone from every tier.
    pub fn semantic_forget(&self, key: &str) {
        self.index().remove_key(key);
    }

    /// Is this model's cache shared across tenants?
    pub fn is_shared(&self, model: &str) -> bool {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(model)
    }

    /// The models whose cache is shared across tenants.
    pub fn shared_models(&self) -> Vec<String> {
        let s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        s.iter().cloned().collect()
    }

    pub fn set_shared(&self, model: &str, shared: bool) {
        let mut s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if shared {
            s.insert(model.to_string());
        } else {
            s.remove(model);
        }
    }

    /// Removes the answers of `scope` and/or `model` (all when both are
    /// `None`) from every tier; returns how many entries went per tier
    /// (L1 is counted after its background invalidation runs).
    pub async fn flush(&self, scope: Option<&str>, model: Option<&str>) -> [usize; 4] {
        let (s, m) = (scope.map(str::to_string), model.map(str::to_string));
        self.l1.run_pending_tasks().await;
        let before = self.l1.entry_count();
        let _ = self.l1.invalidate_entries_if(move |_, v| {
            s.as_deref().is_none_or(|s| s == v.scope) && m.as_deref().is_none_or(|m| m == v.model)
        });
        self.l1.run_pending_tasks().await;
        let l1 = before.saturating_sub(self.l1.entry_count()) as usize;
        let l2 = self.l2.as_ref().map_or(0, |d| d.flush(scope, model));
        let l3 = match &self.l3 {
            Some(r) => r.flush(scope, model).await,
            None => 0,
        };
        let sem = self.index().flush(scope, model);
        [l1, l2, l3, sem]
    }
}

#[cfg(test)]
pub(crate) mod tests;
