//! The labelled paraphrase sets of `loadtest/data/` as the semantic
//! benches read them: groups of phrasings with one answer, and their near
//! misses (tagged by kind, or plain in the first set).

/// A near miss, tagged with its kind or not (the first set).
#[derive(serde::Deserialize)]
#[serde(untagged)]
pub enum Near {
    Tagged { text: String, kind: String },
    Plain(String),
}

impl Near {
    pub fn text(&self) -> &str {
        match self {
            Near::Tagged { text, .. } | Near::Plain(text) => text,
        }
    }

    /// Its kind (`-` when untagged).
    pub fn kind(&self) -> &str {
        match self {
            Near::Tagged { kind, .. } => kind,
            Near::Plain(_) => "-",
        }
    }
}

/// One group: its phrasings (the first is the one cached) and near misses.
#[derive(serde::Deserialize)]
pub struct Group {
    pub prompts: Vec<String>,
    pub near_misses: Vec<Near>,
}

/// The groups of a set in `loadtest/data/` (`None` when it is missing).
pub fn groups_of(file: &str) -> Option<Vec<Group>> {
    let path = format!("{}/../loadtest/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).ok()?;
    Some(
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("group"))
            .collect(),
    )
}
