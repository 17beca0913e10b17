//! The verifier on the cases that matter: paraphrases pass, each kind of
//! near miss is rejected for its own reason.

use super::*;

fn check(a: &str, b: &str) -> Result<(), Reject> {
    verify(&Facts::of(a), &Facts::of(b), Checks::ALL, &NoVectors)
}

#[test]
fn paraphrases_pass() {
    for (a, b) in [
        (
            "What is the capital of France?",
            "Which city is the capital of France?",
        ),
        (
            "What is the capital of France?",
            "France's capital is which city?",
        ),
        (
            "What is the capital of France?",
            "what's the capital of france",
        ),
        ("How do I boil an egg?", "What's the way to boil an egg?"),
        (
            "Convert 10 miles to kilometers",
            "convert ten miles to km please",
        ),
        (
            "Convert 10 miles to kilometers",
            "How many km are in 10 miles?",
        ),
        (
            "What's the first step to install Python?",
            "What do I do first to install Python?",
        ),
    ] {
        assert_eq!(check(a, b), Ok(()), "{a:?} / {b:?}");
    }
}

#[test]
fn near_misses_are_rejected_for_their_reason() {
    for (a, b, why) in [
        (
            "Convert 10 miles to kilometers",
            "Convert 10 kilometers to miles",
            Reject::Direction,
        ),
        (
            "Convert 10 miles to kilometers",
            "Convert 12 miles to kilometers",
            Reject::Numbers,
        ),
        (
            "Convert 10 miles to kilometers",
            "Convert 10 miles to meters",
            Reject::Units,
        ),
        (
            "What is the capital of France?",
            "What is the capital of Spain?",
            Reject::Names,
        ),
        (
            "Which foods are high in protein?",
            "Which foods are not high in protein?",
            Reject::Negation,
        ),
        (
            "What are the advantages of nuclear power?",
            "What are the disadvantages of nuclear power?",
            Reject::Opposite,
        ),
        (
            "How do I install Docker on Ubuntu?",
            "How do I uninstall Docker on Ubuntu?",
            Reject::Opposite,
        ),
        (
            "What is the capital of France?",
            "¿Cuál es la capital de Francia?",
            Reject::Language,
        ),
        (
            "What's the first step to install Python?",
            "What's the second step to install Python?",
            Reject::Numbers,
        ),
        (
            "What's the first step to install Python?",
            "What's the next step to install Python?",
            Reject::Numbers,
        ),
        (
            "When was Einstein born?",
            "Where was Einstein born?",
            Reject::Kind,
        ),
        (
            "What is the capital of France?",
            "What is the population of France?",
            Reject::Topic,
        ),
        (
            "Translate 'good morning' into Dutch",
            "Translate 'good night' into Dutch",
            Reject::Opposite,
        ),
        (
            "Translate hello from English to French",
            "Translate hello from French to English",
            Reject::Direction,
        ),
    ] {
        assert_eq!(check(a, b), Err(why), "{a:?} / {b:?}");
    }
}

#[test]
fn stems_meet_across_inflections() {
    for (a, b) in [
        ("boils", "boiling"),
        ("bake", "baked"),
        ("running", "run"),
        ("countries", "country"),
        ("boxes", "box"),
    ] {
        assert_eq!(stem(a), stem(b), "{a} / {b}");
    }
    assert_ne!(stem("boil"), stem("poach"));
}

#[test]
fn numbers_are_read_in_words_digits_and_ordinals() {
    let n = |t: &str| Facts::of(t).numbers;
    assert_eq!(n("twenty five apples and 3 pears"), ["25", "3"]);
    assert_eq!(n("two hundred grams"), ["200"]);
    assert_eq!(n("the 2nd step"), ["2"]);
    assert_eq!(n("the second step"), ["2"]);
    assert_eq!(n("$1,000 in 10km"), ["1000", "10"]);
    assert_eq!(n("one of the best"), Vec::<String>::new());
}

#[test]
fn odd_input_never_panics() {
    for t in [
        "",
        "?",
        "'",
        "\"\"",
        "'a",
        "ñ",
        "10",
        "$",
        "...",
        "‘quoted’",
        "日本の首都は？",
        "one two three hundred thousand and",
    ] {
        let f = Facts::of(t);
        let _ = verify(&f, &Facts::of("What?"), Checks::ALL, &NoVectors);
    }
}
