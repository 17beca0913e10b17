//! The semantic cache's judge: a served text model asked whether two
//! questions get exactly the same answer, read as its probability of
//! `Yes` against `No` as the first word of its reply (two prefills that
//! share the question's prefix, between the engine's steps). A near match
//! the judge accepts is served as a hit; one it refuses is generated.
//! BENCHMARKS.md measures the signal: a 1.5B model separates paraphrases
//! from near misses far better than sentence embeddings, a 135M one
//! hardly at all.

use engine::{ChatMessage, EngineHandle};

/// The judge's question about a cached question and a new one.
pub fn question(cached: &str, asked: &str) -> String {
    format!(
        "Would these two questions get exactly the same answer?\nQuestion 1: {cached}\nQuestion 2: {asked}\nAnswer Yes or No."
    )
}

/// The chance the judge gives `Yes` over `No`, from their
/// log-probabilities.
pub fn yes_share(yes: f32, no: f32) -> f64 {
    1.0 / (1.0 + (f64::from(no) - f64::from(yes)).exp())
}

/// The first token of `word` (no BOS) in `engine`'s vocabulary.
fn token(engine: &EngineHandle, word: &str) -> Option<u32> {
    let e = engine.tokenizer().inner().encode(word, false).ok()?;
    e.get_ids().first().copied()
}

/// `engine`'s chance that `cached` and `asked` get the same answer;
/// `None` when it cannot say (the prompt past its context, a failed
/// prefill): the near match is then generated.
pub async fn same_answer(engine: &EngineHandle, cached: &str, asked: &str) -> Option<f64> {
    let text = engine
        .render_chat(&[ChatMessage::new("user", question(cached, asked))])
        .ok()?;
    let prompt = engine.tokenizer().encode_prompt(&text).ok()?;
    let mut logprob = [0.0f32; 2];
    for (slot, word) in logprob.iter_mut().zip(["Yes", "No"]) {
        let mut tokens = prompt.clone();
        tokens.push(token(engine, word)?);
        match engine.score(tokens, prompt.len()).await {
            Ok(s) => *slot = s.first()?.logprob,
            Err(e) => {
                tracing::warn!(error = %e, "semantic cache: the judge failed");
                return None;
            }
        }
    }
    Some(yes_share(logprob[0], logprob[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_of_yes_is_a_two_way_softmax() {
        assert!((yes_share(-1.0, -1.0) - 0.5).abs() < 1e-12);
        assert!(yes_share(-0.1, -5.0) > 0.99);
        assert!(yes_share(-9.0, -0.2) < 0.01);
        let q = question(
            "What is the capital of France?",
            "Which city is France's capital?",
        );
        assert!(q.contains("Question 1: What is the capital of France?\nQuestion 2: Which"));
    }
}
