//! A model's own sampling defaults (what a request that leaves a field
//! out gets): read from the GGUF's `general.sampling.*` keys (llama.cpp's
//! names), then from a Hugging Face `generation_config.json` beside the
//! file (vLLM's source), then from what the operator set at load
//! (`--override-generation-config`, or `generation_config` in
//! `POST /admin/models`); a later source wins field by field. The default
//! completion length is capped so that a request without `max_tokens`
//! cannot run for minutes.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::gguf::Value;

/// The completion length a request without `max_tokens` gets when the
/// model names none (the rest of the context, vLLM's default, lets a
/// small model ramble for minutes).
pub const DEFAULT_MAX_TOKENS: usize = 1024;

/// The defaults of one model; `None` leaves the API's own default
/// (temperature 1, top_p 1, no top_k, no min_p, no penalty).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Completion tokens when a request gives no `max_tokens` (Hugging
    /// Face's `max_new_tokens`).
    #[serde(
        default,
        alias = "max_new_tokens",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_tokens: Option<usize>,
}

/// The fields of a Hugging Face `generation_config.json` we read; the
/// rest of the file (token ids, `do_sample`, versions) is ignored.
#[derive(Debug, Default, Deserialize)]
struct HfConfig {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    max_new_tokens: Option<usize>,
    /// `false`: greedy decoding is the model's default.
    do_sample: Option<bool>,
}

impl GenerationDefaults {
    /// From a GGUF's `general.sampling.*` keys (absent keys leave `None`;
    /// a key of the wrong type is ignored).
    pub fn from_gguf(metadata: &HashMap<String, Value>) -> Self {
        let num = |k: &str| {
            metadata
                .get(&format!("general.sampling.{k}"))
                .and_then(number)
        };
        Self {
            temperature: num("temp").map(|v| v as f32),
            top_p: num("top_p").map(|v| v as f32),
            top_k: num("top_k").and_then(|v| (v >= 0.0).then_some(v as u32)),
            min_p: num("min_p").map(|v| v as f32),
            repetition_penalty: num("penalty_repeat").map(|v| v as f32),
            max_tokens: None,
        }
    }

    /// From `generation_config.json` in `dir`, if there is one.
    pub fn from_dir(dir: &Path) -> Result<Self, String> {
        let path = dir.join("generation_config.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(Self::default());
        };
        Self::from_hf_json(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// From the text of a Hugging Face `generation_config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, String> {
        let hf: HfConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let greedy = hf.do_sample == Some(false);
        Self {
            temperature: if greedy { Some(0.0) } else { hf.temperature },
            top_p: hf.top_p,
            top_k: hf.top_k,
            min_p: hf.min_p,
            repetition_penalty: hf.repetition_penalty,
            max_tokens: hf.max_new_tokens,
        }
        .checked()
    }

    /// Parses an operator's override (`{"temperature": 0.2, ...}`), every
    /// field checked.
    pub fn parse_override(json: &str) -> Result<Self, String> {
        let o: Self = serde_json::from_str(json).map_err(|e| {
            format!(
                "{e} (fields: temperature, top_p, top_k, min_p, repetition_penalty, max_tokens)"
            )
        })?;
        o.checked()
    }

    /// Refuses values the sampler would refuse.
    pub fn checked(self) -> Result<Self, String> {
        let bad = |what: &str, ok: bool, range: &str| {
            if ok {
                Ok(())
            } else {
                Err(format!("{what} must be {range}"))
            }
        };
        let within = |v: Option<f32>, lo: f32, hi: f32| v.is_none_or(|v| (lo..=hi).contains(&v));
        bad(
            "temperature",
            within(self.temperature, 0.0, 2.0),
            "in [0, 2]",
        )?;
        bad(
            "top_p",
            within(self.top_p, 0.0, 1.0) && self.top_p != Some(0.0),
            "in (0, 1]",
        )?;
        bad("min_p", within(self.min_p, 0.0, 1.0), "in [0, 1]")?;
        bad(
            "repetition_penalty",
            within(self.repetition_penalty, 0.0, 2.0) && self.repetition_penalty != Some(0.0),
            "in (0, 2]",
        )?;
        bad("max_tokens", self.max_tokens != Some(0), "at least 1")?;
        Ok(self)
    }

    /// `self` with every field `later` sets taken from `later`.
    pub fn then(self, later: Self) -> Self {
        Self {
            temperature: later.temperature.or(self.temperature),
            top_p: later.top_p.or(self.top_p),
            top_k: later.top_k.or(self.top_k),
            min_p: later.min_p.or(self.min_p),
            repetition_penalty: later.repetition_penalty.or(self.repetition_penalty),
            max_tokens: later.max_tokens.or(self.max_tokens),
        }
    }
}

/// A numeric metadata value as `f64`; `None` for anything else.
fn number(v: &Value) -> Option<f64> {
    Some(match v {
        Value::U8(x) => f64::from(*x),
        Value::I8(x) => f64::from(*x),
        Value::U16(x) => f64::from(*x),
        Value::I16(x) => f64::from(*x),
        Value::U32(x) => f64::from(*x),
        Value::I32(x) => f64::from(*x),
        Value::U64(x) => *x as f64,
        Value::I64(x) => *x as f64,
        Value::F32(x) => f64::from(*x),
        Value::F64(x) => *x,
        Value::Bool(_) | Value::String(_) | Value::Array(_) => return None,
    })
    .filter(|x| x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_keys_are_read_by_llama_cpps_names() {
        let mut m = HashMap::new();
        m.insert("general.sampling.temp".into(), Value::F32(0.6));
        m.insert("general.sampling.top_p".into(), Value::F32(0.95));
        m.insert("general.sampling.top_k".into(), Value::I32(20));
        m.insert("general.sampling.penalty_repeat".into(), Value::F32(1.1));
        m.insert("general.sampling.min_p".into(), Value::String("x".into()));
        let d = GenerationDefaults::from_gguf(&m);
        assert_eq!(d.temperature, Some(0.6));
        assert_eq!(d.top_p, Some(0.95));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.repetition_penalty, Some(1.1));
        assert_eq!(d.min_p, None, "a key of the wrong type is ignored");
        assert_eq!(
            GenerationDefaults::from_gguf(&HashMap::new()),
            Default::default()
        );
    }

    #[test]
    fn a_hugging_face_config_gives_its_fields_and_greedy_when_it_does_not_sample() {
        let d = GenerationDefaults::from_hf_json(
            r#"{"bos_token_id": 1, "temperature": 0.2, "top_p": 0.9, "max_new_tokens": 256,
                "transformers_version": "4.42"}"#,
        )
        .expect("parses");
        assert_eq!(d.temperature, Some(0.2));
        assert_eq!(d.top_p, Some(0.9));
        assert_eq!(d.max_tokens, Some(256));
        let greedy =
            GenerationDefaults::from_hf_json(r#"{"do_sample": false, "temperature": 0.7}"#)
                .expect("parses");
        assert_eq!(greedy.temperature, Some(0.0));
        assert!(GenerationDefaults::from_hf_json(r#"{"temperature": 9}"#).is_err());
    }

    #[test]
    fn an_override_wins_field_by_field_and_is_checked() {
        let file = GenerationDefaults {
            temperature: Some(0.7),
            top_k: Some(40),
            ..Default::default()
        };
        let o = GenerationDefaults::parse_override(r#"{"temperature": 0.2, "max_tokens": 64}"#)
            .expect("parses");
        let d = file.then(o);
        assert_eq!(d.temperature, Some(0.2));
        assert_eq!(d.top_k, Some(40));
        assert_eq!(d.max_tokens, Some(64));
        for bad in [
            r#"{"temperature": -1}"#,
            r#"{"top_p": 0}"#,
            r#"{"max_tokens": 0}"#,
            r#"{"temprature": 0.2}"#,
        ] {
            assert!(GenerationDefaults::parse_override(bad).is_err(), "{bad}");
        }
    }
}
