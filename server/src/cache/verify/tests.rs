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

#[test]
fn conversions_keep_their_direction_however_they_are_asked() {
    for (a, b) in [
        (
            "What is 100 degrees Fahrenheit in Celsius?",
            "What's 100 F in celsius?",
        ),
        (
            "How many ounces are in a pound?",
            "Tell me the number of ounces in one pound.",
        ),
        ("Convert 100 US dollars to euros.", "What's $100 in euros?"),
        (
            "Translate 'good morning' from English to German.",
            "How do you say 'good morning' in German?",
        ),
        (
            "How do I convert a string to an integer in Python?",
            "What's the way to turn a string into an int in Python?",
        ),
    ] {
        assert_eq!(check(a, b), Ok(()), "{a:?} / {b:?}");
    }
    for (a, b) in [
        (
            "What is 100 degrees Fahrenheit in Celsius?",
            "What is 100 degrees Celsius in Fahrenheit?",
        ),
        (
            "How many kilograms is 5 pounds?",
            "How many pounds is 5 kilograms?",
        ),
        (
            "How do I convert a string to an integer in Python?",
            "How do I convert an integer to a string in Python?",
        ),
        (
            "Translate 'hello' from English to German.",
            "Translate 'hello' from German to English.",
        ),
    ] {
        assert_eq!(check(a, b), Err(Reject::Direction), "{a:?} / {b:?}");
    }
}

#[test]
fn quoted_words_are_the_subject_and_never_filler() {
    assert_eq!(
        check(
            "When do I use 'who' versus 'whom'?",
            "When do I use 'who' versus 'whose'?"
        ),
        Err(Reject::Topic)
    );
    assert_eq!(
        check("What is the past tense of 'run'?", "past tense of run"),
        Ok(())
    );
    // A quoted question does not make the prompt a "where" question.
    assert_eq!(
        check(
            "Translate 'Where is the train station?' into Spanish.",
            "where is the train station in spanish"
        ),
        Ok(())
    );
}

#[test]
fn lists_are_not_counts_and_yes_no_is_its_own_kind() {
    assert_eq!(
        check(
            "Which countries border Germany?",
            "How many countries border Germany?"
        ),
        Err(Reject::Kind)
    );
    assert_eq!(
        check(
            "Which countries border Germany?",
            "What countries border Germany?"
        ),
        Ok(())
    );
    assert_eq!(
        check(
            "What is the capital of France?",
            "Is Paris the capital of France?"
        ),
        Err(Reject::Names)
    );
    assert_eq!(
        check("Is coffee bad for you?", "What is coffee?"),
        Err(Reject::Kind)
    );
    assert_eq!(
        check(
            "Can you tell me the capital of France?",
            "What is the capital of France?"
        ),
        Ok(())
    );
}

#[test]
fn numbers_with_multipliers_and_aliases_are_read_as_one() {
    assert_eq!(
        check(
            "How do I start training for a 5K run?",
            "How do I start training for a 10K run?"
        ),
        Err(Reject::Numbers)
    );
    assert_eq!(
        check("When did World War II end?", "What year did WW2 end?"),
        Ok(())
    );
    assert_eq!(
        check(
            "Who was the first president of the United States?",
            "first US president?"
        ),
        Ok(())
    );
    assert_eq!(
        check(
            "Explain the 50/30/20 budget rule.",
            "Explain the 50-30-20 budget rule."
        ),
        Ok(())
    );
}

/// A seeded generator of prompts from the parts the verifier reads.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }

    fn prompt(&mut self) -> String {
        const STARTS: &[&str] = &[
            "What is",
            "How do I",
            "Why does",
            "Which",
            "Tell me",
            "Is",
            "When did",
            "Convert",
            "¿Cuál es",
        ];
        const WORDS: &[&str] = &[
            "the",
            "capital",
            "of",
            "France",
            "Spain",
            "10",
            "miles",
            "to",
            "km",
            "not",
            "largest",
            "smallest",
            "'who'",
            "in",
            "Python",
            "a",
            "list",
            "first",
            "next",
            "step",
            "boil",
            "egg",
            "USA",
            "from",
            "English",
            "German",
            "twenty",
            "five",
            "$5",
            "3.5",
            "50/30/20",
            "install",
            "uninstall",
            "without",
            "—",
            "?",
            "'",
            "\"",
            "“quoted”",
            "日本",
        ];
        let mut s = self.pick(STARTS).to_string();
        for _ in 0..(2 + self.next() % 9) {
            s.push(' ');
            s.push_str(self.pick(WORDS));
        }
        s
    }
}

#[test]
fn the_verifier_is_reflexive_symmetric_and_sees_every_changed_number() {
    let mut g = Gen(0x5eed_cafe_f00d_u64);
    for _ in 0..3000 {
        let (a, b) = (g.prompt(), g.prompt());
        let (fa, fb) = (Facts::of(&a), Facts::of(&b));
        assert_eq!(verify(&fa, &fa, Checks::ALL, &NoVectors), Ok(()), "{a:?}");
        assert_eq!(
            verify(&fa, &fb, Checks::ALL, &NoVectors).is_ok(),
            verify(&fb, &fa, Checks::ALL, &NoVectors).is_ok(),
            "{a:?} / {b:?}"
        );
        let n = g.next() % 1000 + 2;
        let (x, y) = (format!("{a} {n}"), format!("{a} {}", n + 1));
        assert!(check(&x, &y).is_err(), "{x:?} / {y:?}");
    }
}
