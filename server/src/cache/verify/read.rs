//! Reading a prompt into `Facts`: quoted phrases, aliases ("WW2", "USA"),
//! words and sentence starts, numbers (digits, words, ordinals,
//! positions), units, names, topic words and their stems, the language,
//! and the kind of question. `verify.rs` compares what this reads.

use std::collections::{BTreeMap, BTreeSet};

use super::{Facts, Kind};
use crate::cache::lexicon::{
    ALIASES, FILLER, LANGUAGES, NEGATIONS, NUMBER_WORDS, ORDINALS, POSITIONS, STOPWORDS, SYNONYMS,
    TIME_UNITS, UNITS,
};

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
