//! The semantic index: for each tenant scope, model and conversation
//! context, the embeddings of the last user messages whose answers are
//! cached, searched by exact scan (cosine similarity of unit vectors; at
//! the sizes one scope holds, a scan of a few thousand 384-float rows is a
//! fraction of a millisecond, less than an approximate index's overhead).
//! A hit needs the similarity over the threshold *and* the same `Guard`:
//! the same names, numbers and quoted words in the same order, the same
//! kind of question (when / where / why / how many ...) and the same topic
//! words. Embeddings alone put "the capital of Spain", "25 F to C" or "the
//! opposite of 'lucid'" close to "the capital of France", "25 C to F" and
//! "the meaning of 'lucid'"; the paraphrase benchmark (BENCHMARKS.md)
//! measures what each check buys. Entries
//! expire after a TTL; each index and the whole are bounded, evicting the
//! least recently used.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Which index an entry belongs to: only requests with the same scope,
/// model and conversation context (earlier turns, system prompt, sampling
/// parameters, hashed) can match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IndexKey {
    pub scope: String,
    pub model: String,
    pub context: String,
}

/// What two prompts must share, beyond similar embeddings, to be the same
/// question: the key terms in order (names, numbers, quoted words), the
/// kind of answer asked for, and the topic words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    terms: Vec<String>,
    kind: &'static str,
    topic: BTreeSet<String>,
}

impl Guard {
    pub fn of(text: &str) -> Self {
        Self {
            terms: ordered_terms(text),
            kind: question_kind(text),
            topic: content_words(text),
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    vector: Vec<f32>,
    guard: Guard,
    /// The exact-cache key of the answer.
    key: String,
    created: Instant,
    used: Instant,
}

/// Bounds of the index.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub per_index: usize,
    pub total: usize,
    pub ttl: Duration,
}

/// A match: the answer's exact-cache key and the similarity.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub key: String,
    pub similarity: f32,
}

#[derive(Debug)]
pub struct SemanticIndex {
    indexes: HashMap<IndexKey, Vec<Entry>>,
    total: usize,
    limits: Limits,
    pub evictions: u64,
}

/// Words that start or shape a question rather than name what it is about;
/// they do not count as key terms even when capitalized.
const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "an",
    "and",
    "are",
    "around",
    "at",
    "by",
    "calculate",
    "can",
    "compute",
    "convert",
    "could",
    "define",
    "describe",
    "did",
    "do",
    "does",
    "explain",
    "find",
    "for",
    "from",
    "give",
    "how",
    "i",
    "in",
    "into",
    "is",
    "it",
    "list",
    "me",
    "multiply",
    "my",
    "name",
    "of",
    "on",
    "one",
    "please",
    "should",
    "show",
    "tell",
    "the",
    "to",
    "translate",
    "what",
    "what's",
    "when",
    "where",
    "which",
    "who",
    "why",
    "will",
    "with",
    "would",
    "write",
    "you",
];

/// The terms two prompts must share for a semantic hit: numbers,
/// capitalized words that are not question words, and quoted phrases,
/// lowercased (a possessive `'s` dropped).
pub fn key_terms(text: &str) -> BTreeSet<String> {
    let mut terms = BTreeSet::new();
    let mut rest = text;
    // Quoted phrases first ('...' or "..."), then the remaining words.
    let mut unquoted = String::new();
    while let Some(start) = rest.find(['\'', '"']) {
        let q = rest[start..].chars().next().unwrap_or('"');
        let after = &rest[start + 1..];
        let is_open = start == 0 || !rest[..start].ends_with(char::is_alphanumeric);
        match after.find(q).filter(|_| is_open) {
            Some(end) => {
                unquoted.push_str(&rest[..start]);
                terms.insert(after[..end].trim().to_lowercase());
                rest = &after[end + 1..];
            }
            None => {
                unquoted.push_str(&rest[..=start]);
                rest = after;
            }
        }
    }
    unquoted.push_str(rest);
    for raw in unquoted.split_whitespace() {
        let word = raw.trim_matches(|c: char| !c.is_alphanumeric() && c != '-' && c != '.');
        let word = word.trim_end_matches('.');
        let lower = word.to_lowercase();
        let lower = lower.strip_suffix("'s").unwrap_or(&lower).to_string();
        let number = word.chars().any(|c| c.is_ascii_digit());
        let name = word.chars().next().is_some_and(char::is_uppercase)
            && !STOPWORDS.contains(&lower.as_str());
        if number || name {
            terms.insert(lower);
        }
    }
    terms
}

/// Function words that carry no topic (on top of `STOPWORDS`).
const FUNCTION_WORDS: &[&str] = &[
    "am",
    "any",
    "as",
    "be",
    "been",
    "but",
    "city",
    "degrees",
    "get",
    "have",
    "has",
    "need",
    "needs",
    "number",
    "or",
    "so",
    "that",
    "their",
    "there",
    "these",
    "this",
    "those",
    "us",
    "was",
    "way",
    "we",
    "were",
    "your",
    "using",
    "many",
    "much",
    "long",
    "time",
    "minutes",
    "year",
    "equals",
    "equal",
    "word",
    "mean",
    "meaning",
    "definition",
    "say",
];

/// The topic words of a prompt: lowercased alphanumeric words that are
/// neither question words nor function words, with a crude plural `s`
/// and possessive `'s` dropped.
pub fn content_words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-'))
        .map(|w| {
            w.trim_matches(|c: char| c == '\'' || c == '-')
                .to_lowercase()
        })
        .map(|w| w.strip_suffix("'s").map(str::to_string).unwrap_or(w))
        .filter(|w| {
            !w.is_empty()
                && !STOPWORDS.contains(&w.as_str())
                && !FUNCTION_WORDS.contains(&w.as_str())
        })
        .map(|w| match w.strip_suffix('s') {
            Some(stem) if stem.len() > 3 && !stem.ends_with('s') => stem.to_string(),
            _ => w,
        })
        .collect()
}

/// What kind of answer a question asks for, from its question words: a
/// time, a place, a reason, a person, a quantity, a manner, or other.
pub fn question_kind(text: &str) -> &'static str {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let has = |w: &str| words.iter().any(|x| x == w);
    let pair = |a: &str, b: &str| words.windows(2).any(|p| p[0] == a && p[1] == b);
    if has("when") || pair("what", "year") || pair("which", "year") {
        "time"
    } else if has("where") {
        "place"
    } else if has("why") {
        "reason"
    } else if has("who") || has("whom") {
        "person"
    } else if pair("how", "many") || pair("how", "much") {
        "quantity"
    } else if pair("how", "long") {
        "duration"
    } else if has("how") {
        "manner"
    } else {
        "other"
    }
}

/// The key terms in the order they appear (first occurrence each): "25
/// Celsius to Fahrenheit" and "25 Fahrenheit to Celsius" differ.
pub fn ordered_terms(text: &str) -> Vec<String> {
    let set = key_terms(text);
    let mut out: Vec<String> = Vec::new();
    let lower = text.to_lowercase();
    let mut found: Vec<(usize, &String)> = set
        .iter()
        .filter_map(|t| lower.find(t.as_str()).map(|i| (i, t)))
        .collect();
    found.sort();
    for (_, t) in found {
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    out
}

/// How many topic words one prompt has that the other lacks.
pub fn topic_drift(a: &str, b: &str) -> usize {
    content_words(a)
        .symmetric_difference(&content_words(b))
        .count()
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
            guard: Guard::of(text),
            key,
            created: now,
            used: now,
        });
        self.total += 1;
        while self.total > self.limits.total && self.evict_oldest() {}
    }

    /// The most similar live entry over `threshold` with the same key
    /// terms, if any (expired entries met on the way are dropped).
    pub fn lookup(
        &mut self,
        ik: &IndexKey,
        vector: &[f32],
        text: &str,
        threshold: f32,
        now: Instant,
    ) -> Option<Match> {
        let ttl = self.limits.ttl;
        let entries = self.indexes.get_mut(ik)?;
        let before = entries.len();
        entries.retain(|e| now.duration_since(e.created) < ttl);
        self.total -= before - entries.len();
        let guard = Guard::of(text);
        let best = entries
            .iter_mut()
            .map(|e| (similarity(&e.vector, vector), e))
            .filter(|(s, e)| *s >= threshold && e.guard == guard)
            .max_by(|a, b| a.0.total_cmp(&b.0))?;
        best.1.used = now;
        Some(Match {
            key: best.1.key.clone(),
            similarity: best.0,
        })
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

    #[test]
    fn key_terms_keep_names_numbers_and_quotes_but_not_question_words() {
        let t = |s| key_terms(s).into_iter().collect::<Vec<_>>();
        assert_eq!(t("What is the capital of France?"), ["france"]);
        assert_eq!(t("France's capital is which city?"), ["france"]);
        assert_eq!(t("Which city is the capital of France?"), ["france"]);
        assert_eq!(
            t("Convert 25 degrees Celsius to Fahrenheit."),
            ["25", "celsius", "fahrenheit"]
        );
        assert_eq!(t("What is 12 times 7?"), ["12", "7"]);
        assert_eq!(t("Define 'ephemeral'."), ["ephemeral"]);
        assert_eq!(t("How do I reverse a list in Python?"), ["python"]);
        assert_eq!(
            t("Translate 'I love you' into Dutch."),
            ["dutch", "i love you"]
        );
        assert_ne!(
            t("What is the capital of Spain?"),
            t("What is the capital of France?")
        );
    }

    #[test]
    fn a_hit_needs_the_threshold_the_terms_and_the_same_index() {
        let mut s = SemanticIndex::new(limits());
        let now = Instant::now();
        let v = unit(&[1.0, 0.0, 0.1]);
        s.insert(
            ik("a", "c"),
            v.clone(),
            "What is the capital of France?",
            "k1".into(),
            now,
        );
        let close = unit(&[1.0, 0.05, 0.1]);
        let hit = s.lookup(
            &ik("a", "c"),
            &close,
            "Which city is the capital of France?",
            0.9,
            now,
        );
        assert_eq!(hit.map(|m| m.key), Some("k1".to_string()));
        assert!(
            s.lookup(
                &ik("a", "c"),
                &close,
                "What is the capital of Spain?",
                0.9,
                now
            )
            .is_none()
        );
        assert!(
            s.lookup(
                &ik("b", "c"),
                &close,
                "What is the capital of France?",
                0.9,
                now
            )
            .is_none(),
            "another tenant"
        );
        assert!(
            s.lookup(
                &ik("a", "other turns"),
                &close,
                "What is the capital of France?",
                0.9,
                now
            )
            .is_none()
        );
        let far = unit(&[0.0, 1.0, 0.0]);
        assert!(
            s.lookup(
                &ik("a", "c"),
                &far,
                "What is the capital of France?",
                0.9,
                now
            )
            .is_none()
        );
        let later = now + Duration::from_secs(61);
        assert!(
            s.lookup(
                &ik("a", "c"),
                &v,
                "What is the capital of France?",
                0.9,
                later
            )
            .is_none(),
            "expired"
        );
        assert!(s.is_empty());
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
