//! What the response cache stores: a finished answer (its choices' text
//! and finish reasons, its token counts, who produced it, for which scope
//! and model) and its exact key, derived from everything that determines
//! the answer.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One cached choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedChoice {
    pub text: String,
    pub finish_reason: String,
}

/// A cached answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedAnswer {
    /// Tenant scope (account id, or `shared`).
    pub scope: String,
    pub model: String,
    pub choices: Vec<CachedChoice>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The provider that generated it (credited a share of cache hits).
    pub provider_id: String,
    /// Unix seconds.
    pub created_at: i64,
    /// The prices it was generated at, in ticks (a hit costs a fraction of
    /// them); absent for answers stored before they were recorded, or
    /// generated unmetered. Stored as `prices_ticks`: answers stored while
    /// the ledger counted micro-units wrote `prices`, which is ignored (a
    /// hit on one is priced from today's idle prices).
    #[serde(default, rename = "prices_ticks")]
    pub prices: Option<money::ledger::Prices>,
}

impl CachedAnswer {
    /// Approximate memory held, for the byte bounds.
    pub fn weight(&self) -> usize {
        let text: usize = self
            .choices
            .iter()
            .map(|c| c.text.len() + c.finish_reason.len() + 32)
            .sum();
        text + self.scope.len() + self.model.len() + self.provider_id.len() + 96
    }
}

/// Everything an exact key covers.
#[derive(Debug, Clone)]
pub struct KeyParts<'a> {
    pub scope: &'a str,
    pub model: &'a str,
    /// Changes when the model is reloaded (its load time).
    pub model_version: u64,
    pub endpoint: &'a str,
    /// The fully rendered prompt (the whole conversation), as token ids.
    pub prompt_tokens: &'a [u32],
    /// A stable, explicit encoding of every sampling parameter (versioned,
    /// so a renamed field never changes it).
    pub params: &'a str,
}

/// The SHA-256 of the key parts, hex.
pub fn exact_key(k: &KeyParts<'_>) -> String {
    let mut h = Sha256::new();
    for part in [k.scope, k.model, k.endpoint, k.params] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.update(k.model_version.to_le_bytes());
    h.update((k.prompt_tokens.len() as u64).to_le_bytes());
    for t in k.prompt_tokens {
        h.update(t.to_le_bytes());
    }
    hex(&h.finalize())
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A short stable hash of a string (Redis key segments, index keys).
pub fn short_hash(s: &str) -> String {
    hex(&Sha256::digest(s.as_bytes())[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(scope: &'a str, tokens: &'a [u32], params: &'a str) -> KeyParts<'a> {
        KeyParts {
            scope,
            model: "m",
            model_version: 1,
            endpoint: "chat",
            prompt_tokens: tokens,
            params,
        }
    }

    #[test]
    fn keys_change_with_every_part() {
        let base = exact_key(&parts("a", &[1, 2, 3], "t=0"));
        assert_eq!(base, exact_key(&parts("a", &[1, 2, 3], "t=0")));
        assert_eq!(base.len(), 64);
        assert_ne!(base, exact_key(&parts("b", &[1, 2, 3], "t=0")), "scope");
        assert_ne!(base, exact_key(&parts("a", &[1, 2], "t=0")), "conversation");
        assert_ne!(
            base,
            exact_key(&parts("a", &[1, 2, 3], "t=1")),
            "parameters"
        );
        let v2 = KeyParts {
            model_version: 2,
            ..parts("a", &[1, 2, 3], "t=0")
        };
        assert_ne!(base, exact_key(&v2), "model version");
        // Length prefixes: no ambiguity between ("ab","c") and ("a","bc").
        let x = KeyParts {
            scope: "ab",
            model: "c",
            ..parts("", &[], "")
        };
        let y = KeyParts {
            scope: "a",
            model: "bc",
            ..parts("", &[], "")
        };
        assert_ne!(exact_key(&x), exact_key(&y));
    }

    #[test]
    fn prices_stored_in_micro_units_are_not_read_as_ticks() {
        let prices = money::ledger::Prices {
            input: 56_940_000,
            cached_input: 5_694_000,
            output: 170_830_000,
        };
        let a = CachedAnswer {
            scope: "s".into(),
            model: "m".into(),
            choices: vec![],
            prompt_tokens: 1,
            completion_tokens: 1,
            provider_id: "p".into(),
            created_at: 0,
            prices: Some(prices),
        };
        let json = serde_json::to_string(&a).expect("json");
        let back: CachedAnswer = serde_json::from_str(&json).expect("back");
        assert_eq!(back.prices, Some(prices));
        let old = json.replace("prices_ticks", "prices");
        let back: CachedAnswer = serde_json::from_str(&old).expect("old answer");
        assert_eq!(back.prices, None);
    }
}
