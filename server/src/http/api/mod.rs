//! The OpenAI-compatible wire layer: DTOs, JSON extraction with field-naming
//! errors, conversion into engine requests, and SSE encoding.

pub mod bodies;
pub mod json;
pub mod logprobs;
pub mod stream;
pub mod tools;
pub mod types;
pub mod validate;
pub mod workers;

/// Seconds since the Unix epoch (the `created` field).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh response id with an OpenAI-style prefix.
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}
