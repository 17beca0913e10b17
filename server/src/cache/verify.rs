//! The semantic cache's second stage: whether a cached prompt found by
//! embedding similarity asks the same question as the new one. Embeddings
//! put "10 miles to km" next to "10 km to miles", "the capital of Spain"
//! next to "the capital of France" and "foods high in protein" next to
//! "foods not high in protein"; what tells them apart is structure a
//! sentence vector blurs. Each prompt is read once into `Facts` (its
//! language, quoted phrases, numbers and positions in order, units and
//! names, negation, question kind and topic words); `verify` compares two
//! and names the first difference (`Reject`), which `/metrics` counts.

use std::collections::{BTreeMap, BTreeSet};

use super::lexicon::{
    ALIASES, FILLER, LANGUAGES, NEGATIONS, NUMBER_WORDS, OPPOSITE_PREFIXES, OPPOSITES, ORDINALS,
    POSITIONS, STOPWORDS, SYNONYMS, TIME_UNITS, UNITS,
};

/// Why the verifier turned a candidate down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    /// Written in another language.
    Language,
    /// Other quoted text, numbers, dates or positions ("step 2", "next").
    Numbers,
    /// Other units, currencies or languages.
    Units,
    /// The same terms in another direction ("miles to km" / "km to miles").
    Direction,
    /// Other names.
    Names,
    /// One is negated and the other is not.
    Negation,
    /// Opposite words ("advantages" / "disadvantages").
    Opposite,
    /// Another kind of question (when / where / who / yes-no ...).
    Kind,
    /// Other topic words.
    Topic,
}

impl Reject {
    pub const ALL: [Reject; 9] = [
        Reject::Language,
        Reject::Numbers,
        Reject::Units,
        Reject::Direction,
        Reject::Names,
        Reject::Negation,
        Reject::Opposite,
        Reject::Kind,
        Reject::Topic,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reject::Language => "language",
            Reject::Numbers => "numbers",
            Reject::Units => "units",
            Reject::Direction => "direction",
            Reject::Names => "names",
            Reject::Negation => "negation",
            Reject::Opposite => "opposite",
            Reject::Kind => "kind",
            Reject::Topic => "topic",
        }
    }
}

/// The kind of answer a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Time,
    Place,
    Reason,
    Person,
    Quantity,
    /// "Which countries ...", "What foods ...": a list.
    List,
    Manner,
    YesNo,
    Other,
}

/// What the verifier reads off one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    lang: Option<&'static str>,
    /// Numbers, ordinals and positions, in order.
    numbers: Vec<String>,
    /// Canonical units, currencies and languages.
    units: BTreeSet<String>,
    /// Names (capitalized mid-sentence, or acronyms), stemmed.
    names: BTreeSet<String>,
    /// Units and names in order (a "how many X in Y" target moved last).
    order: Vec<String>,
    /// Whether "to" / "into" / "from" / "vs" / "than" / "per" joins terms.
    directed: bool,
    negated: bool,
    kind: Kind,
    /// Every word's stem.
    stems: BTreeSet<String>,
    /// Stems of quoted words: the subject itself, never aligned by vectors
    /// ("'who' versus 'whom'" is not "'who' versus 'whose'").
    literal: BTreeSet<String>,
    /// The topic words' stems in order, where the prompt converts one thing
    /// into another ("convert a string to an integer"), else empty.
    converts: Vec<String>,
    /// The topic: stems of the words that are not question, filler,
    /// number or unit words, each with the word as written (lowercased)
    /// for its vector.
    topic: BTreeMap<String, String>,
}

/// Which checks run (all in the server; the benchmark turns them off one
/// at a time to measure what each buys).
#[derive(Debug, Clone, Copy)]
pub struct Checks {
    pub structure: bool,
    pub topic: bool,
    /// How similar (cosine of their vectors) a topic word only one prompt
    /// has must be to a word only the other has, to count as the same
    /// ("tallest" and "highest"); above 1, only the same stems count.
    pub align: f32,
    /// How similar it must be to any of the other's words.
    pub align_any: f32,
}

impl Checks {
    /// Every check; topic words must have the same stems (or abbreviate).
    pub const ALL: Checks = Checks {
        structure: true,
        topic: true,
        align: 2.0,
        align_any: 2.0,
    };

    /// Every check, topic words aligned by their vectors at `align`
    /// (a substitution) and `align + 0.1` (any word of the other).
    pub fn aligned(align: Option<f32>) -> Checks {
        match align {
            Some(a) => Checks {
                align: a,
                align_any: a + 0.1,
                ..Checks::ALL
            },
            None => Checks::ALL,
        }
    }
}

/// The word alignment the tuning set chose (0.6 / 0.7); off by default,
/// because on the held-out sets it let in more near misses than it won
/// paraphrases (BENCHMARKS.md).
pub const ALIGN: f32 = 0.6;

/// Vectors of single words, for aligning topic words.
pub trait WordVectors {
    fn vector(&self, word: &str) -> Option<&[f32]>;
}

/// No vectors: topic words must have the same stems.
pub struct NoVectors;

impl WordVectors for NoVectors {
    fn vector(&self, _: &str) -> Option<&[f32]> {
        None
    }
}

impl<S: std::hash::BuildHasher> WordVectors for std::collections::HashMap<String, Vec<f32>, S> {
    fn vector(&self, word: &str) -> Option<&[f32]> {
        self.get(word).map(Vec::as_slice)
    }
}

/// The first difference between a cached prompt's facts and a query's
/// that makes them different questions, if any.
pub fn verify(
    cached: &Facts,
    query: &Facts,
    checks: Checks,
    words: &dyn WordVectors,
) -> Result<(), Reject> {
    if checks.structure {
        structure(cached, query)?;
    }
    if checks.topic
        && (unaligned(cached, query, checks, words) || unaligned(query, cached, checks, words))
    {
        return Err(Reject::Topic);
    }
    Ok(())
}

/// Whether `a` has a topic word that `b` lacks and that is neither an
/// abbreviation of one of `b`'s ("temp", "dict"), nor close to a word only
/// `b` has (a substitution: "tallest" / "highest"), nor very close to any
/// of `b`'s words.
fn unaligned(a: &Facts, b: &Facts, checks: Checks, words: &dyn WordVectors) -> bool {
    let only_b = unmatched(b, a);
    let all: Vec<&str> = b.topic.values().map(String::as_str).collect();
    let close = |w: &str, among: &[&str], at: f32| {
        words.vector(w).is_some_and(|v| {
            among.iter().any(|x| {
                words
                    .vector(x)
                    .is_some_and(|u| super::semantic::similarity(u, v) >= at)
            })
        })
    };
    a.topic
        .iter()
        .filter(|(s, _)| !b.topic.contains_key(*s))
        .any(|(s, w)| {
            if a.literal.contains(s) {
                return true;
            }
            let abbreviation = b
                .topic
                .keys()
                .any(|x| abbreviates(s, x) || abbreviates(x, s));
            !(abbreviation || close(w, &only_b, checks.align) || close(w, &all, checks.align_any))
        })
}

/// "temp" for "temperature", "dict" for "dictionary": a short word that
/// starts a longer one.
fn abbreviates(short: &str, long: &str) -> bool {
    short.len() >= 3 && long.len() > short.len() + 1 && long.starts_with(short)
}

/// The topic words (as written) of `a` whose stems `b` lacks.
fn unmatched<'a>(a: &'a Facts, b: &Facts) -> Vec<&'a str> {
    a.topic
        .iter()
        .filter(|(s, _)| !b.topic.contains_key(*s))
        .map(|(_, w)| w.as_str())
        .collect()
}

impl Facts {
    /// The topic words as written, for their vectors.
    pub fn topic_words(&self) -> impl Iterator<Item = &str> {
        self.topic.values().map(String::as_str)
    }
}

fn structure(a: &Facts, b: &Facts) -> Result<(), Reject> {
    if let (Some(x), Some(y)) = (a.lang, b.lang)
        && x != y
    {
        return Err(Reject::Language);
    }
    if a.numbers != b.numbers {
        return Err(Reject::Numbers);
    }
    // English is the language a question is in unless it says otherwise:
    // "'good morning' in German" translates from English.
    let foreign = |f: &Facts| -> BTreeSet<String> {
        f.units
            .iter()
            .filter(|u| *u != "english")
            .cloned()
            .collect()
    };
    if foreign(a) != foreign(b) {
        return Err(Reject::Units);
    }
    // Units keep their direction wherever they are ("100 F in C"); names
    // only around "to" / "from" / "into" / "vs" ("flights from Paris to
    // London").
    let units_only = |o: &[String], f: &Facts| -> Vec<String> {
        o.iter().filter(|t| f.units.contains(*t)).cloned().collect()
    };
    let (ua, ub) = (units_only(&a.order, a), units_only(&b.order, b));
    let directed = a.directed || b.directed;
    let (oa, ob) = match directed {
        true => (a.order.clone(), b.order.clone()),
        false => (ua, ub),
    };
    if in_common_order(&oa, &ob) != in_common_order(&ob, &oa)
        || in_common_order(&a.converts, &b.converts) != in_common_order(&b.converts, &a.converts)
    {
        return Err(Reject::Direction);
    }
    // Every name must be in the other prompt too: "the Atlantic Ocean" is
    // not "the ocean".
    let missing =
        |names: &BTreeSet<String>, other: &Facts| names.iter().any(|n| !other.stems.contains(n));
    if missing(&a.names, b) || missing(&b.names, a) {
        return Err(Reject::Names);
    }
    if a.negated != b.negated {
        return Err(Reject::Negation);
    }
    if opposite(a, b) || opposite(b, a) {
        return Err(Reject::Opposite);
    }
    if !compatible(a.kind, b.kind) {
        return Err(Reject::Kind);
    }
    Ok(())
}

/// The terms of `order` that `other` also has, in `order`'s order.
fn in_common_order<'a>(order: &'a [String], other: &[String]) -> Vec<&'a String> {
    order.iter().filter(|t| other.contains(t)).collect()
}

/// Whether `b` has a word opposite to one of `a`'s that `a` lacks.
fn opposite(a: &Facts, b: &Facts) -> bool {
    let only_a = |w: &str| a.stems.contains(w) && !b.stems.contains(w);
    let only_b = |w: &str| b.stems.contains(w) && !a.stems.contains(w);
    static PAIRS: std::sync::LazyLock<Vec<(String, String)>> = std::sync::LazyLock::new(|| {
        OPPOSITES
            .iter()
            .flat_map(|(x, y)| [(stem(x), stem(y)), (stem(y), stem(x))])
            .collect()
    });
    let pairs = PAIRS.iter().any(|(x, y)| only_a(x) && only_b(y));
    pairs
        || b.stems.iter().filter(|w| !a.stems.contains(*w)).any(|w| {
            OPPOSITE_PREFIXES.iter().any(|p| {
                w.strip_prefix(p)
                    .is_some_and(|rest| rest.len() >= 4 && only_a(rest))
            })
        })
}

/// Two kinds of question with the same answer: the same kind, or a
/// "what is" / "tell me" (other) beside any but a yes-no question. A list
/// ("Which countries border Germany?") is not a count ("How many ...").
fn compatible(a: Kind, b: Kind) -> bool {
    let wild = |x: Kind, y: Kind| x == Kind::Other && y != Kind::YesNo;
    let list_or_other = |x: Kind| matches!(x, Kind::List | Kind::Other);
    a == b || wild(a, b) || wild(b, a) || (list_or_other(a) && list_or_other(b))
}

/// A crude English stem, the same on both sides of a comparison:
/// "boils", "boiled", "boiling" and "boil" meet, as do "bake" and "baking".
pub fn stem(word: &str) -> String {
    let w = word.to_lowercase().replace('’', "'");
    let w = w.strip_suffix("'s").unwrap_or(&w).trim_matches('\'');
    let mut s = w.to_string();
    let n = s.chars().count();
    if n <= 3 || !s.chars().all(|c| c.is_alphabetic()) {
        return s;
    }
    if let Some(x) = s.strip_suffix("ies").filter(|x| x.len() >= 2) {
        s = format!("{x}y");
    } else if s.ends_with("sses")
        || s.ends_with("xes")
        || s.ends_with("ches")
        || s.ends_with("shes")
    {
        s.truncate(s.len() - 2);
    } else if s.ends_with('s') && !s.ends_with("ss") && !s.ends_with("us") && !s.ends_with("is") {
        s.pop();
    }
    for suffix in ["ing", "ed"] {
        if let Some(x) = s.strip_suffix(suffix).filter(|x| x.len() >= 3) {
            s = x.to_string();
            // "running" -> "run", "stopped" -> "stop".
            let b = s.as_bytes();
            if b.len() >= 3
                && b[b.len() - 1] == b[b.len() - 2]
                && !matches!(b[b.len() - 1], b'l' | b's' | b'z')
            {
                s.pop();
            }
            break;
        }
    }
    if s.len() > 3 && s.ends_with('e') {
        s.pop();
    }
    if s.len() > 3 && s.ends_with('y') {
        s.pop();
        s.push('i');
    }
    s
}

/// One word of a prompt, as written and lowercased.
struct Word {
    raw: String,
    lower: String,
    /// First word of a sentence (its capital says nothing).
    initial: bool,
    /// Inside quotes: the subject, even if it is "who" or "the".
    quoted: bool,
}

const QUOTES: [(char, char); 4] = [('"', '"'), ('\'', '\''), ('“', '”'), ('‘', '’')];

/// Splits off quoted phrases ('...', "...", “...”): their text, and the
/// prompt without them.
fn quoted_phrases(text: &str) -> (String, String) {
    let mut found = String::new();
    let mut rest = String::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let opens = i == 0 || !chars[i - 1].is_alphanumeric();
        let close = QUOTES.iter().find(|(o, _)| *o == c).map(|(_, cl)| *cl);
        if let (Some(close), true) = (close, opens) {
            let end = (i + 1..chars.len()).find(|&j| {
                chars[j] == close && chars.get(j + 1).is_none_or(|n| !n.is_alphanumeric())
            });
            if let Some(end) = end.filter(|&e| e > i + 1) {
                let inner: String = chars[i + 1..end].iter().collect();
                found.push_str(&inner);
                found.push_str(" . ");
                rest.push(' ');
                i = end + 1;
                continue;
            }
        }
        rest.push(c);
        i += 1;
    }
    (found, rest)
}

/// The prompt's words: letters, digits and the marks that belong inside
/// a word or number (apostrophes, hyphens, decimal points, `$`, `%`,
/// `°`), with "10km" and "$5" split in two. A word after `.`, `?`, `!`,
/// `:` or `;` (or the first) starts a sentence.
fn words(text: &str) -> Vec<Word> {
    // "1,000" is one number.
    let text: String = text
        .char_indices()
        .filter(|&(i, c)| {
            !(c == ','
                && text[..i].ends_with(|p: char| p.is_ascii_digit())
                && text[i + 1..].starts_with(|n: char| n.is_ascii_digit()))
        })
        .map(|(_, c)| c)
        .collect();
    let is_tok = |c: char| c.is_alphanumeric() || "'’-./%$€£¥°".contains(c);
    let mut out = Vec::new();
    let mut initial = true;
    let mut start = None;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        let tok = i < text.len() && is_tok(c);
        match (tok, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                let raw = &text[s..i];
                let w = raw.trim_matches(|c: char| "'’-./".contains(c));
                let numeric =
                    |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit() || c == '.');
                // "50/30/20" is three numbers, "hard-boil" two words.
                let alphabetic = |p: &str| !p.is_empty() && p.chars().all(char::is_alphabetic);
                let parts: Vec<&str> = if w.contains(['/', '-']) && w.split(['/', '-']).all(numeric)
                {
                    w.split(['/', '-']).collect()
                } else if w.contains('-') && w.split('-').all(alphabetic) {
                    w.split('-').collect()
                } else {
                    vec![w]
                };
                for piece in parts.into_iter().flat_map(split_mixed) {
                    out.push(Word {
                        lower: piece.to_lowercase().replace('’', "'"),
                        raw: piece.to_string(),
                        initial,
                        quoted: false,
                    });
                    initial = false;
                }
                initial |= raw.ends_with(['.', '!']) && !w.is_empty();
                start = None;
            }
            _ => {}
        }
        if !tok && ".?!:;¿¡".contains(c) {
            initial = true;
        }
    }
    out
}

/// "$5" -> ["$", "5"], "5%" -> ["5", "%"], "10km" -> ["10", "km"].
fn split_mixed(w: &str) -> Vec<&str> {
    if w.is_empty() {
        return Vec::new();
    }
    if let Some(rest) = w.strip_prefix(['$', '€', '£', '¥']) {
        let sym = &w[..w.len() - rest.len()];
        let mut v = vec![sym];
        v.extend(split_mixed(rest));
        return v;
    }
    let digits = w
        .char_indices()
        .take_while(|(_, c)| c.is_ascii_digit() || *c == '.')
        .last()
        .map_or(0, |(i, c)| i + c.len_utf8());
    if digits > 0 && digits < w.len() {
        let unit = &w[digits..];
        let known = UNITS.iter().any(|(s, _)| *s == unit.to_lowercase());
        if known || unit == "%" {
            return vec![&w[..digits], unit];
        }
    }
    vec![w]
}

fn number_of(w: &str) -> Option<String> {
    let t = w.trim_end_matches(['.']);
    if !t.is_empty()
        && t.chars().all(|c| c.is_ascii_digit() || c == '.')
        && t.chars().any(|c| c.is_ascii_digit())
    {
        let t = t.trim_start_matches('0');
        return Some(if t.is_empty() || t.starts_with('.') {
            format!("0{t}")
        } else {
            t.to_string()
        });
    }
    // "5k", "10m": a number with its multiplier.
    if let Some(n) = t
        .strip_suffix(['k', 'm', 'b'])
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    {
        return Some(format!("{n}{}", &t[n.len()..]));
    }
    // "1st", "2nd", "3rd", "4th".
    for suf in ["st", "nd", "rd", "th"] {
        if let Some(n) = t
            .strip_suffix(suf)
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        {
            return Some(n.to_string());
        }
    }
    ORDINALS
        .iter()
        .find(|(o, _)| *o == t)
        .map(|(_, n)| n.to_string())
        .or_else(|| {
            POSITIONS
                .iter()
                .find(|(p, _)| *p == t)
                .map(|(_, c)| c.to_string())
        })
}

/// Numbers written as words, summed and multiplied in runs: "twenty
/// five" is 25, "two hundred" 200, "a dozen" 12.
fn word_numbers(ws: &[Word], i: &mut usize) -> Option<u64> {
    let value = |w: &str| NUMBER_WORDS.iter().find(|(n, _)| *n == w).map(|(_, v)| *v);
    // "second" is an ordinal; "one" alone is too often a pronoun.
    let first = value(&ws[*i].lower)?;
    // "one" is a pronoun in "which one", "the one", "one of".
    const NOT_AFTER: &[&str] = &[
        "the",
        "which",
        "this",
        "that",
        "any",
        "each",
        "no",
        "every",
        "some",
        "a",
        "another",
        "only",
        "last",
        "first",
        "right",
        "other",
        "favorite",
        "favourite",
        "new",
        "old",
    ];
    let pronoun = ws
        .get(*i + 1)
        .is_some_and(|n| matches!(n.lower.as_str(), "of" | "another"))
        || *i > 0 && NOT_AFTER.contains(&ws[*i - 1].lower.as_str())
        || *i + 1 == ws.len();
    if ws[*i].lower == "one" && pronoun {
        return None;
    }
    let (mut total, mut current) = (0u64, first);
    *i += 1;
    while let Some(v) = ws
        .get(*i)
        .and_then(|w| value(&w.lower).or_else(|| (w.lower == "and").then_some(0)))
    {
        if v == 0 && ws[*i].lower == "and" {
            if ws.get(*i + 1).and_then(|w| value(&w.lower)).is_none() {
                break;
            }
        } else if v >= 1000 {
            total += current.max(1) * v;
            current = 0;
        } else if v == 100 {
            current = current.max(1) * 100;
        } else {
            current += v;
        }
        *i += 1;
    }
    Some(total + current)
}

fn unit_of(w: &str) -> Option<&'static str> {
    UNITS.iter().find(|(s, _)| *s == w).map(|(_, c)| *c)
}

fn is_acronym(raw: &str) -> bool {
    raw.chars().filter(|c| c.is_alphabetic()).count() >= 2
        && raw.chars().all(|c| !c.is_alphabetic() || c.is_uppercase())
}

impl Facts {
    pub fn of(text: &str) -> Self {
        let text = aliased(text);
        // Quoted text counts for its words, not for the prompt's language,
        // question kind or names ("What does 'je ne sais pas' mean?").
        let (quoted, rest) = quoted_phrases(&text);
        let ws = words(&rest);
        let mut all = words(&quoted);
        // A quoted word or two is the subject, even "who" or "the"; a
        // quoted sentence is read as words.
        let short = quoted
            .split(" . ")
            .all(|q| q.split_whitespace().count() <= 2);
        all.iter_mut().for_each(|w| {
            w.initial = true;
            w.quoted = short;
        });
        all.splice(0..0, words(&rest));
        let negated = all
            .iter()
            .any(|w| NEGATIONS.contains(&w.lower.as_str()) || w.lower.ends_with("n't"));
        let mut f = Facts {
            lang: language(&ws),
            numbers: Vec::new(),
            units: BTreeSet::new(),
            names: BTreeSet::new(),
            order: Vec::new(),
            directed: false,
            negated,
            kind: kind(&ws),
            stems: all.iter().map(|w| stem(synonym(&w.lower))).collect(),
            literal: BTreeSet::new(),
            converts: Vec::new(),
            topic: BTreeMap::new(),
        };
        let mut i = 0;
        while i < all.len() {
            if let Some(n) = word_numbers(&all, &mut i) {
                f.number(n.to_string(), all.get(i));
            } else {
                f.read(&all, i);
                i += 1;
            }
        }
        f.order = how_many_target_last(&ws, f.order);
        let converting = ws.iter().any(|w| CONVERT.contains(&w.lower.as_str()));
        if converting && f.directed {
            for w in &all {
                let s = stem(synonym(&w.lower));
                if f.topic.contains_key(&s) {
                    push_new(&mut f.converts, &s);
                }
            }
        }
        f
    }

    /// Files a number, unless it is a "one" before a unit ("1 gallon" is
    /// "a gallon").
    fn number(&mut self, n: String, next: Option<&Word>) {
        if n == "1" && next.is_some_and(|w| unit_of(&w.lower).is_some()) {
            return;
        }
        self.numbers.push(n);
    }
}

/// Verbs that turn one thing into another: with "to" / "into" / "from",
/// the order of the topic words is the direction.
const CONVERT: &[&str] = &[
    "convert",
    "converting",
    "conversion",
    "turn",
    "change",
    "transform",
    "cast",
    "switch",
    "translate",
    "migrate",
    "move",
    "port",
];

/// Whether a word is filler, in any of its forms ("works", "worked").
fn is_filler(w: &str) -> bool {
    static STEMS: std::sync::LazyLock<BTreeSet<String>> =
        std::sync::LazyLock::new(|| FILLER.iter().map(|f| stem(f)).collect());
    FILLER.contains(&w) || STEMS.contains(&stem(w))
}

/// The word a synonym stands for (itself if none).
fn synonym(w: &str) -> &str {
    SYNONYMS
        .iter()
        .find(|(x, _)| *x == w)
        .map_or(w, |(_, to)| to)
}

/// `text` with each of `ALIASES` (whole words, any case) and a capital
/// "US" written one way.
fn aliased(text: &str) -> String {
    let mut out = text.to_string();
    for (from, to) in ALIASES.iter().copied().chain([("US", "USA")]) {
        let mut at = 0;
        loop {
            let hay = if from == "US" {
                out.clone()
            } else {
                out.to_ascii_lowercase()
            };
            let Some(i) = hay[at..].find(from).map(|i| i + at) else {
                break;
            };
            let end = i + from.len();
            let bounded = !hay[..i].ends_with(|c: char| c.is_alphanumeric())
                && !hay[end..].starts_with(|c: char| c.is_alphanumeric());
            if bounded {
                out.replace_range(i..end, to);
                at = i + to.len();
            } else {
                at = i + from.len();
            }
        }
    }
    out
}

impl Facts {
    /// Files one word: a number, a unit, a connector, a name and/or a
    /// topic word (question, filler and negation words are none).
    fn read(&mut self, ws: &[Word], i: usize) {
        let w = &ws[i];
        let lower = synonym(&w.lower);
        let temperature = matches!(lower, "f" | "c" | "k")
            && i > 0
            && (number_of(&ws[i - 1].lower).is_some() || ws[i - 1].lower.starts_with("degree"));
        let after_number = i > 0
            && (number_of(&ws[i - 1].lower).is_some()
                || NUMBER_WORDS.iter().any(|(n, _)| *n == ws[i - 1].lower));
        let unit = unit_of(lower)
            .filter(|u| after_number || !TIME_UNITS.contains(u))
            .or(temperature.then_some(lower));
        if let Some(n) = number_of(lower) {
            let next = ws.get(i + 1);
            self.number(n, next);
        } else if let Some(u) = unit {
            self.units.insert(u.to_string());
            push_new(&mut self.order, u);
        } else if matches!(
            lower,
            "to" | "into" | "from" | "than" | "per" | "vs" | "versus"
        ) {
            self.directed = true;
        } else if lower.chars().any(char::is_alphanumeric)
            && (w.quoted
                || !(STOPWORDS.contains(&lower)
                    || NEGATIONS.contains(&lower)
                    || CONVERT.contains(&lower)
                    || is_filler(lower)))
        {
            let s = stem(lower);
            let capital = w.raw.chars().next().is_some_and(char::is_uppercase);
            if (capital && !w.initial) || is_acronym(&w.raw) {
                self.names.insert(s.clone());
                push_new(&mut self.order, &s);
            }
            if w.quoted {
                self.literal.insert(s.clone());
            }
            self.topic.entry(s).or_insert_with(|| lower.to_string());
        }
    }
}

fn push_new(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_string());
    }
}

/// "How many km in 10 miles" converts miles to km: the term right after
/// "how many" / "how much" is the target, so it goes last.
fn how_many_target_last(ws: &[Word], mut order: Vec<String>) -> Vec<String> {
    let Some(at) = ws.windows(2).position(|p| {
        matches!(
            (p[0].lower.as_str(), p[1].lower.as_str()),
            ("how", "many" | "much") | ("number" | "amount", "of")
        )
    }) else {
        return order;
    };
    let target = ws[at + 2..].iter().take(2).find_map(|w| {
        unit_of(&w.lower)
            .map(str::to_string)
            .or_else(|| Some(stem(&w.lower)).filter(|s| order.contains(s)))
    });
    if let Some(t) = target
        && let Some(p) = order.iter().position(|x| *x == t)
    {
        let t = order.remove(p);
        order.push(t);
    }
    order
}

/// The prompt's language from its function words (or its script), when
/// clear: at least two function words of one language and more than of
/// any other.
fn language(ws: &[Word]) -> Option<&'static str> {
    let script = ws
        .iter()
        .flat_map(|w| w.lower.chars())
        .find_map(|c| match c as u32 {
            0x0400..=0x04FF => Some("ru"),
            0x0370..=0x03FF => Some("el"),
            0x0590..=0x05FF => Some("he"),
            0x0600..=0x06FF => Some("ar"),
            0x0900..=0x097F => Some("hi"),
            0x0E00..=0x0E7F => Some("th"),
            0x3040..=0x30FF => Some("ja"),
            0xAC00..=0xD7AF => Some("ko"),
            0x4E00..=0x9FFF => Some("zh"),
            _ => None,
        });
    if script.is_some() {
        return script;
    }
    let mut scores: Vec<(usize, &'static str)> = LANGUAGES
        .iter()
        .map(|(lang, list)| {
            (
                ws.iter()
                    .filter(|w| list.contains(&w.lower.as_str()))
                    .count(),
                *lang,
            )
        })
        .collect();
    scores.sort_by_key(|s| std::cmp::Reverse(s.0));
    let accented = ws.iter().any(|w| {
        w.lower
            .chars()
            .any(|c| "áéíóúñçàèìòùâêîôûäöüßãõ¿¡".contains(c))
    });
    match (scores[0], scores[1]) {
        ((n, l), (m, _)) if n >= 2 && n > m => Some(l),
        ((n, l), _) if n >= 1 && l != "en" && accented => Some(l),
        _ => None,
    }
}

/// Words that ask for a reason without "why" ("the causes of ...").
const REASON: &[&str] = &["reason", "reasons", "cause", "causes", "caused"];

/// "How <word>" asks for a measure: a count, an amount, a size, a time.
const HOW_MEASURE: &[&str] = &[
    "many",
    "much",
    "long",
    "big",
    "large",
    "tall",
    "far",
    "old",
    "fast",
    "heavy",
    "high",
    "deep",
    "wide",
    "hot",
    "cold",
    "often",
    "small",
    "warm",
    "strong",
    "loud",
    "soon",
    "early",
    "late",
    "short",
    "quickly",
    "expensive",
];

/// The kind of answer asked for, from the question words.
fn kind(ws: &[Word]) -> Kind {
    let has = |w: &str| ws.iter().any(|x| x.lower == w);
    let pair = |a: &str, b: &str| ws.windows(2).any(|p| p[0].lower == a && p[1].lower == b);
    if has("when") || pair("what", "year") || pair("which", "year") || pair("what", "date") {
        Kind::Time
    } else if has("where") || has("where's") {
        Kind::Place
    } else if has("why") || REASON.iter().any(|w| has(w)) {
        Kind::Reason
    } else if has("who") || has("whom") || has("who's") {
        Kind::Person
    } else if HOW_MEASURE.iter().any(|m| pair("how", m)) {
        Kind::Quantity
    } else if has("how") {
        Kind::Manner
    } else if yes_no(ws) {
        Kind::YesNo
    } else if ws.windows(2).any(|p| {
        matches!(p[0].lower.as_str(), "which" | "what")
            && p[1].lower.ends_with('s')
            && !p[1].lower.ends_with("ss")
            && !matches!(
                p[1].lower.as_str(),
                "is" | "was" | "does" | "has" | "its" | "this" | "us"
            )
    }) {
        Kind::List
    } else {
        Kind::Other
    }
}

/// "Is it safe to ...?", "Does X ...?", not "Can you tell me ...".
fn yes_no(ws: &[Word]) -> bool {
    const AUX: &[&str] = &[
        "is", "are", "was", "were", "do", "does", "did", "can", "could", "should", "will", "would",
        "has", "have", "may", "must", "isn't", "aren't", "don't", "doesn't", "can't",
    ];
    let mut it = ws
        .iter()
        .map(|w| w.lower.as_str())
        .filter(|w| !matches!(*w, "please" | "so" | "hey" | "hi" | "ok" | "okay"));
    let (Some(first), second) = (it.next(), it.next()) else {
        return false;
    };
    let wh = ws.iter().any(|w| {
        matches!(
            w.lower.as_str(),
            "what" | "which" | "who" | "where" | "when" | "why" | "how"
        )
    });
    AUX.contains(&first) && !matches!(second, Some("you" | "u" | "i" | "we")) && !wh
}

#[cfg(test)]
mod tests;
