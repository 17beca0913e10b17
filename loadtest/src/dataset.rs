//! The requests a benchmark sends. Three sources:
//!
//! - `random`: prompts of a chosen length (in words that are one token in
//!   common BPE vocabularies), optionally behind a shared prefix (the prefix
//!   cache workload); lengths vary by `--random-range-ratio`, as in vLLM;
//! - `chat`: a JSONL file of conversations, one `{"messages": [...]}` per
//!   line (a trailing assistant turn is the reference answer and is
//!   dropped); a built-in set written for this tool is the default;
//! - `paraphrase`: a JSONL file of groups of prompts that mean the same
//!   thing, `{"group": "...", "prompts": [...]}` (for the semantic cache);
//!   a built-in set is the default.
//!
//! The server reports the real token counts (`usage`); the word counts here
//! only shape the load.

use std::path::Path;

use anyhow::{Context, bail};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    pub messages: Vec<Message>,
    pub max_tokens: u32,
    /// The paraphrase group, for paraphrase datasets.
    pub group: Option<String>,
}

impl RequestSpec {
    /// The text a completions endpoint gets: the messages' contents.
    pub fn prompt(&self) -> String {
        let parts: Vec<&str> = self.messages.iter().map(|m| m.content.as_str()).collect();
        parts.join("\n\n")
    }
}

/// Which dataset, with its options.
#[derive(Debug, Clone, PartialEq)]
pub enum Dataset {
    Random {
        input_len: usize,
        output_len: u32,
        range_ratio: f64,
        prefix_len: usize,
    },
    Chat {
        path: Option<std::path::PathBuf>,
    },
    Paraphrase {
        path: Option<std::path::PathBuf>,
    },
}

const BUILTIN_CHAT: &str = include_str!("../data/chat.jsonl");
const BUILTIN_PARAPHRASES: &str = include_str!("../data/paraphrases.jsonl");

/// Short, common English words: each is a single token (with its leading
/// space) in the GPT-2, Llama and SmolLM vocabularies.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "water",
    "house",
    "world",
    "year",
    "day",
    "city",
    "road",
    "light",
    "music",
    "book",
    "river",
    "train",
    "market",
    "garden",
    "school",
    "story",
    "paper",
    "table",
    "window",
    "morning",
    "night",
    "summer",
    "winter",
    "friend",
    "family",
    "money",
    "work",
    "place",
    "point",
    "group",
    "fact",
    "hand",
    "part",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "number",
    "line",
    "end",
    "home",
    "game",
    "life",
    "state",
    "room",
    "area",
    "study",
    "side",
    "kind",
    "head",
    "service",
    "power",
    "change",
    "reason",
    "idea",
    "body",
    "information",
    "level",
    "office",
    "door",
    "health",
    "art",
    "war",
    "history",
    "party",
    "result",
    "morning",
    "research",
    "girl",
    "guy",
    "food",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "small",
    "large",
    "new",
    "old",
    "good",
    "great",
    "long",
    "little",
    "own",
    "other",
    "right",
    "big",
    "high",
    "different",
    "early",
    "young",
    "important",
    "public",
    "bad",
    "same",
    "able",
    "open",
    "green",
    "blue",
    "red",
    "white",
    "black",
    "quick",
    "slow",
    "warm",
    "cold",
    "bright",
    "quiet",
    "simple",
];

/// Builds `n` requests from `dataset` (cycling a file's entries when it
/// has fewer; shuffled with `seed`). `max_tokens` applies where the
/// dataset does not set an output length.
pub fn build(
    dataset: &Dataset,
    n: usize,
    max_tokens: u32,
    seed: u64,
) -> anyhow::Result<Vec<RequestSpec>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let specs = match dataset {
        Dataset::Random {
            input_len,
            output_len,
            range_ratio,
            prefix_len,
        } => {
            let prefix = words(&mut rng, *prefix_len);
            (0..n)
                .map(|i| {
                    let len = vary(&mut rng, *input_len as f64, *range_ratio).max(1.0) as usize;
                    let out = vary(&mut rng, f64::from(*output_len), *range_ratio).max(1.0) as u32;
                    // A distinct opening per request: no two share a cache
                    // prefix beyond the deliberate one.
                    let body = format!("{i} {}", words(&mut rng, len.saturating_sub(1)));
                    let content = if prefix.is_empty() {
                        body
                    } else {
                        format!("{prefix} {body}")
                    };
                    RequestSpec {
                        messages: vec![Message {
                            role: "user".into(),
                            content,
                        }],
                        max_tokens: out,
                        group: None,
                    }
                })
                .collect()
        }
        Dataset::Chat { path } => {
            let text = read(path.as_deref(), BUILTIN_CHAT)?;
            let mut convs = parse_chat(&text)?;
            convs.shuffle(&mut rng);
            cycle(&convs, n, |messages| RequestSpec {
                messages: messages.clone(),
                max_tokens,
                group: None,
            })
        }
        Dataset::Paraphrase { path } => {
            let text = read(path.as_deref(), BUILTIN_PARAPHRASES)?;
            let mut prompts = parse_paraphrases(&text)?;
            prompts.shuffle(&mut rng);
            cycle(&prompts, n, |(group, prompt)| RequestSpec {
                messages: vec![Message {
                    role: "user".into(),
                    content: prompt.clone(),
                }],
                max_tokens,
                group: Some(group.clone()),
            })
        }
    };
    Ok(specs)
}

/// A length drawn uniformly from `[len * (1 - ratio), len * (1 + ratio)]`.
fn vary(rng: &mut StdRng, len: f64, ratio: f64) -> f64 {
    if ratio <= 0.0 {
        return len;
    }
    rng.random_range(len * (1.0 - ratio)..=len * (1.0 + ratio))
        .round()
}

fn words(rng: &mut StdRng, n: usize) -> String {
    let w: Vec<&str> = (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect();
    w.join(" ")
}

fn cycle<T>(items: &[T], n: usize, f: impl Fn(&T) -> RequestSpec) -> Vec<RequestSpec> {
    items.iter().cycle().take(n).map(f).collect()
}

fn read(path: Option<&Path>, builtin: &str) -> anyhow::Result<String> {
    match path {
        None => Ok(builtin.to_owned()),
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read the dataset file {}", p.display())),
    }
}

#[derive(Deserialize)]
struct ChatLine {
    messages: Vec<Message>,
}

/// Conversations, each ending with a user turn.
pub fn parse_chat(text: &str) -> anyhow::Result<Vec<Vec<Message>>> {
    let mut out = Vec::new();
    for (no, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let mut c: ChatLine = serde_json::from_str(line).with_context(|| {
            format!(
                "chat dataset line {}: expected {{\"messages\": [...]}}",
                no + 1
            )
        })?;
        if c.messages.last().is_some_and(|m| m.role == "assistant") {
            c.messages.pop();
        }
        if c.messages.is_empty() {
            bail!("chat dataset line {}: no messages to send", no + 1);
        }
        out.push(c.messages);
    }
    if out.is_empty() {
        bail!("the chat dataset is empty");
    }
    Ok(out)
}

#[derive(Deserialize)]
struct ParaphraseLine {
    group: String,
    prompts: Vec<String>,
}

/// (group, prompt) pairs.
pub fn parse_paraphrases(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (no, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let p: ParaphraseLine = serde_json::from_str(line).with_context(|| {
            format!(
                "paraphrase dataset line {}: expected {{\"group\": ..., \"prompts\": [...]}}",
                no + 1
            )
        })?;
        out.extend(p.prompts.into_iter().map(|q| (p.group.clone(), q)));
    }
    if out.is_empty() {
        bail!("the paraphrase dataset is empty");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(prefix_len: usize, ratio: f64) -> Dataset {
        Dataset::Random {
            input_len: 40,
            output_len: 16,
            range_ratio: ratio,
            prefix_len,
        }
    }

    #[test]
    fn random_prompts_have_the_asked_length_and_differ_from_the_first_word() {
        let specs = build(&random(0, 0.0), 20, 0, 1).expect("build");
        assert_eq!(specs.len(), 20);
        for (i, s) in specs.iter().enumerate() {
            let words: Vec<&str> = s.messages[0].content.split(' ').collect();
            assert_eq!(words.len(), 40);
            assert_eq!(words[0], i.to_string());
            assert_eq!(s.max_tokens, 16);
        }
        assert_eq!(
            specs,
            build(&random(0, 0.0), 20, 0, 1).expect("again"),
            "seeded"
        );
    }

    #[test]
    fn a_shared_prefix_opens_every_prompt_and_lengths_stay_in_range() {
        let specs = build(&random(25, 0.5), 50, 0, 2).expect("build");
        let prefix: Vec<&str> = specs[0].messages[0].content.split(' ').take(25).collect();
        for s in &specs {
            let words: Vec<&str> = s.messages[0].content.split(' ').collect();
            assert_eq!(&words[..25], prefix.as_slice());
            assert!(
                (25 + 20..=25 + 60).contains(&words.len()),
                "{}",
                words.len()
            );
            assert!((8..=24).contains(&s.max_tokens));
        }
    }

    #[test]
    fn builtin_sets_parse_and_cycle() {
        let chat = build(&Dataset::Chat { path: None }, 60, 64, 3).expect("chat");
        assert_eq!(chat.len(), 60);
        assert!(
            chat.iter()
                .all(|s| s.messages.last().is_some_and(|m| m.role == "user"))
        );
        let para = build(&Dataset::Paraphrase { path: None }, 10, 32, 3).expect("paraphrase");
        assert!(para.iter().all(|s| s.group.is_some()));
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let missing = Dataset::Chat {
            path: Some("/nonexistent/x.jsonl".into()),
        };
        let err = build(&missing, 1, 1, 0).expect_err("missing file");
        assert!(
            err.to_string().contains("cannot read the dataset file"),
            "{err}"
        );
        let err = parse_chat("{\"messages\": 3}").expect_err("bad line");
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
        assert!(parse_paraphrases("").is_err());
    }
}
