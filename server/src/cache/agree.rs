//! Whether a generated answer agrees with a cached one: what a probe of
//! the semantic cache learns from. The same text (case, spacing and a
//! closing full stop aside) agrees; otherwise the two answers must be
//! close in meaning (their embeddings' similarity at least `AGREE`) and
//! say the same things where the verifier reads them (numbers, names,
//! units and their direction, negation, language). Anything else counts
//! as a different answer: a doubtful outcome teaches the cache to serve
//! less, never more.

use super::semantic::similarity;
use super::verify::{Checks, Facts, NoVectors, verify};

/// The similarity of two answers' embeddings that counts as the same
/// answer in other words.
pub const AGREE: f32 = 0.9;

/// The longest part of an answer that is compared (its start: an answer
/// that opens the same way and goes on differently still differs there).
pub const COMPARED_CHARS: usize = 1000;

/// An answer as compared: lower case, single spaces, no closing stop.
pub fn normalized(text: &str) -> String {
    let t: Vec<String> = text.split_whitespace().map(str::to_lowercase).collect();
    t.join(" ").trim_end_matches(['.', '!']).to_string()
}

/// The start of an answer that gets embedded for the comparison.
pub fn compared(text: &str) -> &str {
    match text.char_indices().nth(COMPARED_CHARS) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

/// Whether `a` and `b` are the same text as compared.
pub fn same_text(a: &str, b: &str) -> bool {
    normalized(compared(a)) == normalized(compared(b))
}

/// Whether answers `a` and `b`, with embeddings `va` and `vb` of their
/// compared parts, agree.
pub fn agree(a: &str, b: &str, va: &[f32], vb: &[f32]) -> bool {
    if same_text(a, b) {
        return true;
    }
    let (fa, fb) = (Facts::of(compared(a)), Facts::of(compared(b)));
    similarity(va, vb) >= AGREE && verify(&fa, &fb, Checks::STRUCTURE, &NoVectors).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_words_agree_and_other_facts_do_not() {
        let v = [1.0f32, 0.0];
        let far = [0.0f32, 1.0];
        assert!(same_text("Paris.", "  paris "));
        assert!(agree(
            "The capital is Paris.",
            "the capital is  Paris",
            &v,
            &far
        ));
        let close = [0.99f32, 0.141];
        assert!(agree(
            "Paris is the capital of France.",
            "The capital of France is Paris.",
            &v,
            &close
        ));
        assert!(
            !agree("It is 16.1 km.", "It is 6.2 km.", &v, &close),
            "numbers differ"
        );
        assert!(
            !agree("Boil it for 7 minutes.", "Poach it gently.", &v, &far),
            "far in meaning"
        );
        let long = "x".repeat(COMPARED_CHARS + 10);
        assert_eq!(compared(&long).len(), COMPARED_CHARS);
        assert_eq!(compared("é"), "é");
    }
}
