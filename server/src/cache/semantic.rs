//! The semantic index: for each tenant scope, model and conversation
//! context, the embeddings of the last user messages whose answers are
//! cached, searched by exact scan (cosine similarity of unit vectors; at
//! the sizes one scope holds, a scan of a few thousand 384-float rows is a
//! fraction of a millisecond, less than an approximate index's overhead).
//! A hit needs the similarity over the model's threshold *and* the
//! verifier's consent (`verify.rs`): embeddings alone put "the capital of
//! Spain", "25 F to C" or "foods not high in protein" close to "the
//! capital of France", "25 C to F" and "foods high in protein". The
//! closest few candidates over the threshold are verified in order. The
//! paraphrase benchmark (BENCHMARKS.md) measures what each stage buys. Entries
//! expire after a TTL; each index and the whole are bounded, evicting the
//! least recently used.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::learned::{Decision, MIN_OBSERVATIONS, Observations, POOL_OUTCOMES, decide};
use super::verify::{Checks, Facts, Reject, verify};

/// How many word vectors the index keeps for aligning topic words (about
/// 1.5 KiB each); past that the store starts again empty.
const WORDS: usize = 20_000;

/// Which index an entry belongs to: only requests with the same scope,
/// model and conversation context (earlier turns, system prompt, sampling
/// parameters, hashed) can match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IndexKey {
    pub scope: String,
    pub model: String,
    pub context: String,
}

#[derive(Debug, Clone)]
struct Entry {
    vector: Vec<f32>,
    /// The cached question (at most the semantic cache's 500 characters).
    text: String,
    facts: Facts,
    /// The exact-cache key of the answer.
    key: String,
    created: Instant,
    used: Instant,
    /// The near matches it was verified against, and how they came out
    /// (`learned`): by similarity, and by the judge's chance.
    checked: Observations,
    judged: Observations,
}

/// Bounds of the index.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub per_index: usize,
    pub total: usize,
    pub ttl: Duration,
}

/// How many of the nearest entries over the threshold the verifier
/// reads before a lookup gives up (each costs a few microseconds).
const CANDIDATES: usize = 8;

/// What a semantic hit needs, per model: the first stage's similarity,
/// and whether the verifier must accept the candidate too.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct Policy {
    /// Cosine similarity a candidate needs (0-1).
    pub threshold: f32,
    /// Whether the verifier (numbers, names, units and their direction,
    /// negation, opposites, question kind, language, topic) must accept it.
    pub verify: bool,
    /// When set, topic words that differ may still match by their word
    /// vectors' similarity (this, for a substitution); when not, only by
    /// stem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub align: Option<f32>,
    /// When set, the share of near matches that may be served a wrong
    /// answer (0-1): the topic check turns from a rule into evidence, and
    /// a near match is served only as far as verification has learned it
    /// may be (`learned`); otherwise it is generated anyway and compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f32>,
    /// When set, a near match that passes the structure is put to the
    /// model as a judge: without a bound, served when its chance that
    /// both questions get the same answer is at least this (0-1); under a
    /// bound, that chance is what the bound learns over instead of the
    /// similarity (`SemanticIndex::decide_judged`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge: Option<f32>,
}

/// A lookup's outcome: the hit, the best similarity seen (hit or not,
/// for the distribution), and why the first candidate over the
/// threshold was turned down.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lookup {
    pub hit: Option<Match>,
    pub best: Option<f32>,
    pub rejected: Option<Reject>,
    /// Under a bound on wrong answers: the near match to generate anyway
    /// and compare with (`SemanticIndex::observe` takes the outcome).
    pub probe: Option<Probe>,
    /// Whether a bound decided (served or probed) a near match.
    pub bounded: bool,
    /// Under a judge: the near match to put to it, with its cached
    /// question.
    pub judge: Option<(Match, String)>,
}

/// A near match generated anyway, with the probability it had of being
/// (1 until its boundary is learned; under 1, each wrong outcome stands
/// for `(1 - explore) / explore` wrong answers served).
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub found: Match,
    pub explore: f64,
}

/// A bound on wrong answers for a lookup: the share `delta` of near
/// matches that may be served wrong, and a uniform draw in 0-1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub delta: f64,
    pub draw: f64,
}

/// A match: the answer's exact-cache key and the similarity.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub key: String,
    pub similarity: f32,
    /// Whether the topic words agree too (under a bound the topic check is
    /// evidence: outcomes are pooled apart by it).
    pub topic: bool,
    /// The judge's chance that both questions get the same answer, when a
    /// bound decided by it (its outcomes are learned against it).
    pub judged: Option<f32>,
}

impl Match {
    /// What a bound decided this match by: the signal and its value.
    fn signal(&self) -> (Signal, f32) {
        match self.judged {
            Some(p) => (Signal::Judge, p),
            None => (Signal::Similarity { topic: self.topic }, self.similarity),
        }
    }
}

/// Real outcomes an entry needs before its learned threshold is shown.
pub const OWN_OUTCOMES: usize = 16;

#[derive(Debug)]
pub struct SemanticIndex {
    indexes: HashMap<IndexKey, Vec<Entry>>,
    total: usize,
    limits: Limits,
    pub evictions: u64,
    /// Vectors of single topic words ("tallest", "highest"), by word.
    words: HashMap<String, Vec<f32>>,
    /// Per tenant scope, model and signal: the outcomes of every entry's
    /// verifications (vCache's global threshold), with when each was last
    /// used. Per scope, so that one tenant's traffic never decides what
    /// another is served.
    pools: HashMap<PoolKey, (Observations, Instant)>,
}

/// What a bound learns a near match's chance of being right over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// The embeddings' similarity, apart by whether the topic words agreed.
    Similarity { topic: bool },
    /// The judge's chance that both questions get the same answer.
    Judge,
}

/// Which pool of outcomes a near match decides by: (scope, model, signal).
type PoolKey = (String, String, Signal);

/// Pools the index keeps (the least recently used goes first): each holds
/// at most `POOL_OUTCOMES` outcomes of 8 bytes.
const POOLS: usize = 1024;

/// The pool of `key`, made (evicting the least recently used past
/// `POOLS`) if it is new, marked used at `now`.
fn pool_of(
    pools: &mut HashMap<PoolKey, (Observations, Instant)>,
    key: PoolKey,
    now: Instant,
) -> &mut Observations {
    if !pools.contains_key(&key) && pools.len() >= POOLS {
        let oldest = pools
            .iter()
            .min_by_key(|(_, p)| p.1)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            pools.remove(&k);
        }
    }
    let p = pools
        .entry(key)
        .or_insert_with(|| (Observations::keeping(POOL_OUTCOMES), now));
    p.1 = now;
    &mut p.0
}

/// Cosine similarity of two unit vectors.
pub fn similarity(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl SemanticIndex {
    pub fn new(limits: Limits) -> Self {
        Self {
            indexes: HashMap::new(),
            total: 0,
            limits,
            evictions: 0,
            words: HashMap::new(),
            pools: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Adds (or refreshes) the prompt `text` with embedding `vector`,
    /// answered by the exact-cache entry `key`.
    pub fn insert(
        &mut self,
        ik: IndexKey,
        vector: Vec<f32>,
        text: &str,
        key: String,
        now: Instant,
    ) {
        let entries = self.indexes.entry(ik).or_default();
        if let Some(e) = entries.iter_mut().find(|e| e.key == key) {
            e.used = now;
            return;
        }
        if entries.len() >= self.limits.per_index
            && let Some(i) = lru(entries)
        {
            entries.swap_remove(i);
            self.total -= 1;
            self.evictions += 1;
        }
        entries.push(Entry {
            vector,
            text: text.to_string(),
            facts: Facts::of(text),
            key,
            created: now,
            used: now,
            checked: Observations::default(),
            judged: Observations::default(),
        });
        self.total += 1;
        while self.total > self.limits.total && self.evict_oldest() {}
    }

    /// The most similar live entry over the policy's threshold that the
    /// verifier accepts (the closest few are tried in order); expired
    /// entries met on the way are dropped.
    pub fn lookup(
        &mut self,
        ik: &IndexKey,
        vector: &[f32],
        query: &Facts,
        policy: Policy,
        now: Instant,
    ) -> Lookup {
        self.lookup_within(ik, vector, query, (policy, None), now)
    }

    /// `lookup`, and with a `bound` the candidate the verifier accepts is
    /// served only as its learned boundary allows (`learned::decide`);
    /// otherwise it comes back as the probe to generate anyway.
    pub fn lookup_within(
        &mut self,
        ik: &IndexKey,
        vector: &[f32],
        query: &Facts,
        (policy, bound): (Policy, Option<Bound>),
        now: Instant,
    ) -> Lookup {
        let ttl = self.limits.ttl;
        let Self {
            indexes,
            total,
            words,
            pools,
            ..
        } = self;
        let Some(entries) = indexes.get_mut(ik) else {
            return Lookup::default();
        };
        let before = entries.len();
        entries.retain(|e| now.duration_since(e.created) < ttl);
        *total -= before - entries.len();
        let mut near: Vec<(f32, usize)> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (similarity(&e.vector, vector), i))
            .collect();
        let best = near.iter().map(|n| n.0).max_by(f32::total_cmp);
        near.retain(|n| n.0 >= policy.threshold);
        near.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut out = Lookup {
            best,
            ..Lookup::default()
        };
        let judge = policy.judge.is_some() && policy.verify;
        let bound = bound.filter(|b| b.delta > 0.0 && !judge);
        let full = Checks::aligned(policy.align);
        // Under a bound or a judge only the structure is a rule; the
        // topic is evidence, or the judge's to weigh.
        let rule = match (policy.verify, bound.is_some() || judge) {
            (false, _) => None,
            (true, false) => Some(full),
            (true, true) => Some(Checks::STRUCTURE),
        };
        for &(sim, i) in near.iter().take(CANDIDATES) {
            let e = &mut entries[i];
            let verdict = rule.map_or(Ok(()), |c| verify(&e.facts, query, c, &*words));
            if let Err(why) = verdict {
                out.rejected.get_or_insert(why);
                continue;
            }
            e.used = now;
            let topic = !policy.verify || verify(&e.facts, query, full, &*words).is_ok();
            let found = Match {
                key: e.key.clone(),
                similarity: sim,
                topic,
                judged: None,
            };
            if judge {
                out.judge = Some((found, e.text.clone()));
                return out;
            }
            let Some(b) = bound else {
                out.hit = Some(found);
                return out;
            };
            let key = (
                ik.scope.clone(),
                ik.model.clone(),
                Signal::Similarity { topic },
            );
            let pool = pool_of(pools, key, now);
            out.bounded = true;
            match decide(&e.checked, pool, sim, b.delta, b.draw) {
                Decision::Serve => out.hit = Some(found),
                Decision::Verify(explore) => out.probe = Some(Probe { found, explore }),
            }
            return out;
        }
        out
    }

    /// Under a bound, decides a near match `found` in `ik` that the judge
    /// gave the chance `p` of the same answer, by the outcomes learned
    /// against the judge's chances (its entry's and its scope's and
    /// model's): served, or the probe to generate anyway.
    pub fn decide_judged(
        &mut self,
        ik: &IndexKey,
        found: Match,
        p: f32,
        b: Bound,
        now: Instant,
    ) -> Result<Match, Probe> {
        let found = Match {
            judged: Some(p),
            ..found
        };
        let none = Observations::default();
        let own = self
            .indexes
            .get(ik)
            .and_then(|v| v.iter().find(|e| e.key == found.key))
            .map_or(&none, |e| &e.judged);
        let key = (ik.scope.clone(), ik.model.clone(), Signal::Judge);
        let pool = pool_of(&mut self.pools, key, now);
        match decide(own, pool, p, b.delta, b.draw) {
            Decision::Serve => Ok(found),
            Decision::Verify(explore) => Err(Probe { found, explore }),
        }
    }

    /// A probe of `found` in `ik` came out `same` (the generated answer
    /// matched the cached one) or not: one more outcome, at the value of
    /// the signal it was decided by, for its entry (if it is still there)
    /// and for its scope's, model's and signal's pool.
    pub fn observe(&mut self, ik: &IndexKey, found: &Match, same: bool, now: Instant) {
        let (signal, at) = found.signal();
        let entry = self
            .indexes
            .get_mut(ik)
            .and_then(|v| v.iter_mut().find(|e| e.key == found.key));
        if let Some(e) = entry {
            match signal {
                Signal::Judge => e.judged.add(at, same),
                Signal::Similarity { .. } => e.checked.add(at, same),
            }
        }
        let key = (ik.scope.clone(), ik.model.clone(), signal);
        pool_of(&mut self.pools, key, now).add(at, same);
    }

    /// The learned thresholds (the lowest value of the signal always
    /// served: a similarity, or with `judge` a judge's chance) of the
    /// entries that decide by their own outcomes and of every pool, under
    /// each model's bound (`delta_of`).
    pub fn thresholds(&self, judge: bool, delta_of: impl Fn(&str) -> Option<f64>) -> Vec<f64> {
        let own = self.indexes.iter().flat_map(|(k, v)| {
            v.iter()
                .map(move |e| if judge { &e.judged } else { &e.checked })
                .filter(|c| c.real() >= OWN_OUTCOMES)
                .map(move |c| (k.model.as_str(), c))
        });
        let pools = self
            .pools
            .iter()
            .filter(|(k, (c, _))| (k.2 == Signal::Judge) == judge && c.real() >= MIN_OBSERVATIONS)
            .map(|(k, (c, _))| (k.1.as_str(), c));
        own.chain(pools)
            .filter_map(|(m, c)| c.threshold(delta_of(m)?))
            .map(f64::from)
            .collect()
    }

    /// The topic words of `facts` whose vectors the index lacks.
    pub fn missing_words(&self, facts: &Facts) -> Vec<String> {
        facts
            .topic_words()
            .filter(|w| !self.words.contains_key(*w))
            .map(str::to_string)
            .collect()
    }

    /// Keeps word vectors for the topic check (bounded by `WORDS`).
    pub fn add_words(&mut self, words: impl IntoIterator<Item = (String, Vec<f32>)>) {
        for (w, v) in words {
            if self.words.len() >= WORDS {
                self.words.clear();
            }
            self.words.insert(w, v);
        }
    }

    /// Whether `ik` has any entry (a lookup there could hit).
    pub fn has(&self, ik: &IndexKey) -> bool {
        self.indexes.get(ik).is_some_and(|v| !v.is_empty())
    }

    /// Forgets the entries pointing at `key` (its answer is gone).
    pub fn remove_key(&mut self, key: &str) {
        for entries in self.indexes.values_mut() {
            let before = entries.len();
            entries.retain(|e| e.key != key);
            self.total -= before - entries.len();
        }
    }

    /// Drops every index of `scope` and/or `model` (all when both are
    /// `None`); returns how many entries went.
    pub fn flush(&mut self, scope: Option<&str>, model: Option<&str>) -> usize {
        let mut gone = 0;
        self.indexes.retain(|k, v| {
            let hit = scope.is_none_or(|s| s == k.scope) && model.is_none_or(|m| m == k.model);
            if hit {
                gone += v.len();
            }
            !hit
        });
        self.total -= gone;
        self.pools
            .retain(|k, _| !(scope.is_none_or(|s| s == k.0) && model.is_none_or(|m| m == k.1)));
        gone
    }

    /// Evicts the least recently used entry of all; false if empty.
    fn evict_oldest(&mut self) -> bool {
        let oldest = self
            .indexes
            .iter()
            .filter_map(|(k, v)| lru(v).map(|i| (v[i].used, k.clone(), i)))
            .min_by_key(|(used, _, _)| *used);
        let Some((_, k, i)) = oldest else {
            return false;
        };
        if let Some(v) = self.indexes.get_mut(&k) {
            v.swap_remove(i);
            if v.is_empty() {
                self.indexes.remove(&k);
            }
        }
        self.total -= 1;
        self.evictions += 1;
        true
    }
}

fn lru(entries: &[Entry]) -> Option<usize> {
    entries
        .iter()
        .enumerate()
        .min_by_key(|(_, e)| e.used)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ik(scope: &str, context: &str) -> IndexKey {
        IndexKey {
            scope: scope.into(),
            model: "m".into(),
            context: context.into(),
        }
    }

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    fn limits() -> Limits {
        Limits {
            per_index: 3,
            total: 5,
            ttl: Duration::from_secs(60),
        }
    }

    const ON: Policy = Policy {
        threshold: 0.9,
        verify: true,
        align: None,
        delta: None,
        judge: None,
    };

    fn find(
        s: &mut SemanticIndex,
        ik: &IndexKey,
        v: &[f32],
        text: &str,
        p: Policy,
        now: Instant,
    ) -> Option<String> {
        s.lookup(ik, v, &Facts::of(text), p, now).hit.map(|m| m.key)
    }

    #[test]
    fn a_hit_needs_the_threshold_the_verifier_and_the_same_index() {
        let mut s = SemanticIndex::new(limits());
        let now = Instant::now();
        let v = unit(&[1.0, 0.0, 0.1]);
        let france = "What is the capital of France?";
        s.insert(ik("a", "c"), v.clone(), france, "k1".into(), now);
        let close = unit(&[1.0, 0.05, 0.1]);
        let para = "Which city is the capital of France?";
        assert_eq!(
            find(&mut s, &ik("a", "c"), &close, para, ON, now).as_deref(),
            Some("k1")
        );
        let spain = s.lookup(
            &ik("a", "c"),
            &close,
            &Facts::of("What is the capital of Spain?"),
            ON,
            now,
        );
        assert_eq!(spain.hit, None);
        assert_eq!(spain.rejected, Some(Reject::Names));
        assert!(spain.best.is_some_and(|b| b > 0.99));
        let off = Policy {
            verify: false,
            ..ON
        };
        assert_eq!(
            find(
                &mut s,
                &ik("a", "c"),
                &close,
                "What is the capital of Spain?",
                off,
                now
            )
            .as_deref(),
            Some("k1"),
            "the verifier off: similarity alone"
        );
        assert_eq!(
            find(&mut s, &ik("b", "c"), &close, france, ON, now),
            None,
            "another tenant"
        );
        assert_eq!(
            find(&mut s, &ik("a", "other turns"), &close, france, ON, now),
            None
        );
        let far = unit(&[0.0, 1.0, 0.0]);
        let miss = s.lookup(&ik("a", "c"), &far, &Facts::of(france), ON, now);
        assert_eq!(
            (miss.hit, miss.rejected),
            (None, None),
            "under the threshold"
        );
        let later = now + Duration::from_secs(61);
        assert_eq!(
            find(&mut s, &ik("a", "c"), &v, france, ON, later),
            None,
            "expired"
        );
        assert!(s.is_empty());
    }

    #[test]
    fn a_rejected_nearest_entry_does_not_hide_an_accepted_one_behind_it() {
        let mut s = SemanticIndex::new(limits());
        let now = Instant::now();
        s.insert(
            ik("a", "c"),
            unit(&[1.0, 0.0, 0.0]),
            "Convert 10 km to miles",
            "km".into(),
            now,
        );
        s.insert(
            ik("a", "c"),
            unit(&[1.0, 0.2, 0.0]),
            "Convert 10 miles to km",
            "mi".into(),
            now,
        );
        let q = unit(&[1.0, 0.01, 0.0]);
        let got = s.lookup(
            &ik("a", "c"),
            &q,
            &Facts::of("How many kilometers are in ten miles?"),
            ON,
            now,
        );
        assert_eq!(got.hit.map(|m| m.key).as_deref(), Some("mi"));
    }

    #[test]
    fn under_a_bound_a_match_is_probed_until_its_entry_has_learned_then_served() {
        let mut s = SemanticIndex::new(limits());
        let now = Instant::now();
        let france = "What is the capital of France?";
        s.insert(
            ik("a", "c"),
            unit(&[1.0, 0.0, 0.0]),
            france,
            "k".into(),
            now,
        );
        let q = unit(&[1.0, 0.1, 0.0]);
        let para = Facts::of("Which city is the capital of France?");
        let bound = |draw| Some(Bound { delta: 0.05, draw });
        let open = Policy {
            threshold: 0.5,
            ..ON
        };
        let first = s.lookup_within(&ik("a", "c"), &q, &para, (open, bound(0.99)), now);
        assert_eq!(first.hit, None);
        let probe = first.probe.expect("a probe").found;
        assert_eq!(probe.key, "k");
        // Outcomes: the same answer at 0.99 and over, another one below 0.7.
        let at = |similarity| Match {
            similarity,
            ..probe.clone()
        };
        for i in 0..200u16 {
            let sim = probe.similarity - f32::from(i % 5) * 0.001;
            s.observe(&ik("a", "c"), &at(sim), true, now);
            s.observe(
                &ik("a", "c"),
                &at(0.5 + f32::from(i % 20) * 0.01),
                false,
                now,
            );
        }
        let gone = Match {
            key: "gone".into(),
            ..probe.clone()
        };
        s.observe(&ik("a", "c"), &gone, true, now);
        let learned = s.lookup_within(&ik("a", "c"), &q, &para, (open, bound(0.9)), now);
        assert_eq!(
            learned.hit.as_ref().map(|m| m.key.as_str()),
            Some("k"),
            "{learned:?}"
        );
        // Far under the learned threshold: probed again on this draw.
        let low = unit(&[1.0, 1.0, 0.0]);
        let doubt = s.lookup_within(&ik("a", "c"), &low, &para, (open, bound(0.5)), now);
        assert!(doubt.hit.is_none() && doubt.probe.is_some(), "{doubt:?}");
        // Without a bound the index serves as before.
        assert!(
            s.lookup(&ik("a", "c"), &low, &para, open, now)
                .hit
                .is_some()
        );
    }

    #[test]
    fn bounds_evict_the_least_recently_used_and_flush_by_scope_or_model() {
        let mut s = SemanticIndex::new(limits());
        let t0 = Instant::now();
        for i in 0..4u32 {
            let at = t0 + Duration::from_millis(u64::from(i));
            s.insert(
                ik("a", "c"),
                unit(&[1.0, i as f32]),
                "q",
                format!("k{i}"),
                at,
            );
        }
        assert_eq!((s.len(), s.evictions), (3, 1), "per-index bound");
        for i in 0..3u32 {
            let at = t0 + Duration::from_millis(10 + u64::from(i));
            s.insert(
                ik("b", "c"),
                unit(&[1.0, i as f32]),
                "q",
                format!("b{i}"),
                at,
            );
        }
        assert_eq!(s.len(), 5, "total bound");
        s.remove_key("b2");
        assert_eq!(s.len(), 4);
        assert_eq!(s.flush(Some("a"), None), 2);
        assert_eq!(s.flush(None, Some("m")), 2);
        assert!(s.is_empty());
    }
}
