//! Stop strings: `StopMatcher` cuts generated text before the first stop
//! string and, while streaming, holds back any tail that could still grow
//! into one.
//!
//! The matcher is an Aho-Corasick automaton over the stop strings' bytes,
//! built once per request, whose state carries over from one text delta to
//! the next. Each byte fed moves the state (amortized O(1) through failure
//! links), so the cost of a token is proportional to its text, not to the
//! length or number of the stop strings; and the state's depth is the
//! longest tail of the text seen that is a prefix of some stop string,
//! which is exactly the text to hold back. Nothing is ever searched twice.
//! Matches are reported where they end first, as generation would meet
//! them token by token; of several ending at once, the longest wins.

/// Result of feeding text to a `StopMatcher`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to emit now.
    pub emit: String,
    /// A stop string matched; `emit` ends right before it.
    pub stopped: bool,
}

/// One automaton state: the text from the root is a prefix of a stop
/// string.
#[derive(Debug, Clone, Default)]
struct Node {
    /// Edges by byte, sorted.
    next: Vec<(u8, u32)>,
    /// The state of the longest proper suffix that is also a prefix.
    fail: u32,
    /// Length of this state's text.
    depth: u32,
    /// Length of the longest stop string that is a suffix of this state's
    /// text (0: none).
    out: u32,
}

/// Finds stop strings across delta boundaries.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    /// The automaton; empty when there are no stop strings.
    nodes: Vec<Node>,
    state: u32,
    /// Held-back text: always the current state's text.
    pending: String,
}

impl StopMatcher {
    /// Builds the automaton (time and memory linear in the stop strings'
    /// total length). Empty strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        if stops.is_empty() {
            return Self::default();
        }
        let mut nodes = vec![Node::default()];
        for s in &stops {
            let mut at = 0u32;
            for &b in s.as_bytes() {
                at = match child(&nodes, at, b) {
                    Some(n) => n,
                    None => add_child(&mut nodes, at, b),
                };
            }
            let n = &mut nodes[at as usize];
            n.out = n.depth;
        }
        link_failures(&mut nodes);
        Self {
            nodes,
            state: 0,
            pending: String::new(),
        }
    }

    /// Feeds a text delta.
    pub fn push(&mut self, delta: &str) -> StopStep {
        if self.nodes.is_empty() {
            return StopStep {
                emit: delta.to_string(),
                stopped: false,
            };
        }
        let start = self.pending.len();
        self.pending.push_str(delta);
        for (i, &b) in delta.as_bytes().iter().enumerate() {
            self.state = self.advance(self.state, b);
            let out = self.nodes[self.state as usize].out as usize;
            if out > 0 {
                // A stop string starts with a whole character, so its first
                // byte in valid UTF-8 text is a character boundary.
                let begin = start + i + 1 - out;
                let emit = self.pending[..begin].to_string();
                self.pending.clear();
                self.state = 0;
                return StopStep {
                    emit,
                    stopped: true,
                };
            }
        }
        // The held tail is a prefix of a stop string: it starts on a
        // character boundary too.
        let hold = self.nodes[self.state as usize].depth as usize;
        let cut = self.pending.len() - hold;
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopStep {
            emit,
            stopped: false,
        }
    }

    /// Releases held-back text when generation ends without a match.
    pub fn flush(&mut self) -> String {
        self.state = 0;
        std::mem::take(&mut self.pending)
    }

    /// The state after `b`, following failure links where `b` has no edge.
    fn advance(&self, mut state: u32, b: u8) -> u32 {
        loop {
            if let Some(n) = child(&self.nodes, state, b) {
                return n;
            }
            if state == 0 {
                return 0;
            }
            state = self.nodes[state as usize].fail;
        }
    }
}

fn child(nodes: &[Node], at: u32, b: u8) -> Option<u32> {
    let next = &nodes[at as usize].next;
    next.binary_search_by_key(&b, |e| e.0)
        .ok()
        .map(|i| next[i].1)
}

fn add_child(nodes: &mut Vec<Node>, at: u32, b: u8) -> u32 {
    let id = nodes.len() as u32;
    let depth = nodes[at as usize].depth + 1;
    nodes.push(Node {
        depth,
        ..Node::default()
    });
    let next = &mut nodes[at as usize].next;
    let pos = next.partition_point(|e| e.0 < b);
    next.insert(pos, (b, id));
    id
}

/// Sets failure links and outputs breadth-first (a state's failure target
/// is shallower, so it is final before the state reads it).
fn link_failures(nodes: &mut [Node]) {
    let mut queue = std::collections::VecDeque::from([0u32]);
    while let Some(u) = queue.pop_front() {
        let edges = nodes[u as usize].next.clone();
        for (b, v) in edges {
            let fail = if u == 0 {
                0
            } else {
                let mut f = nodes[u as usize].fail;
                loop {
                    if let Some(n) = child(nodes, f, b) {
                        break n;
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = nodes[f as usize].fail;
                }
            };
            let inherited = nodes[fail as usize].out;
            let node = &mut nodes[v as usize];
            node.fail = fail;
            node.out = node.out.max(inherited);
            queue.push_back(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for d in deltas {
            let step = m.push(d);
            out.push_str(&step.emit);
            if step.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stop_string_split_across_deltas_is_found() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".to_string(), true)
        );
    }

    #[test]
    fn partial_stop_prefix_is_released_when_it_does_not_complete() {
        assert_eq!(
            run(&["END"], &["abc E", "x"]),
            ("abc Ex".to_string(), false)
        );
        assert_eq!(run(&["END"], &["abc EN"]), ("abc EN".to_string(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["zz", "b"], &["a b zz"]), ("a ".to_string(), true));
    }

    #[test]
    fn held_text_respects_multibyte_characters() {
        assert_eq!(
            run(&["éx"], &["caf", "é", "!"]),
            ("café!".to_string(), false)
        );
        assert_eq!(run(&["éx"], &["café", "x"]), ("caf".to_string(), true));
    }

    #[test]
    fn no_stops_passes_text_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), false));
    }

    #[test]
    fn a_stop_that_ends_first_wins_and_of_two_ending_together_the_longer() {
        assert_eq!(run(&["abcd", "bc"], &["abcd"]), ("a".to_string(), true));
        assert_eq!(run(&["abc", "bc"], &["xabc"]), ("x".to_string(), true));
        assert_eq!(
            run(&["aab"], &["a", "a", "a", "b"]),
            ("a".to_string(), true)
        );
    }

    /// The reference: the first position where some stop string ends in
    /// the whole text, cutting before the longest one ending there.
    fn reference(stops: &[String], text: &str) -> (String, bool) {
        for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
            let best = stops
                .iter()
                .filter(|s| text[..end].ends_with(s.as_str()))
                .map(String::len)
                .max();
            if let Some(len) = best {
                return (text[..end - len].to_string(), true);
            }
        }
        (text.to_string(), false)
    }

    #[test]
    fn random_texts_and_stops_match_the_reference_whatever_the_deltas() {
        let mut rng = StdRng::seed_from_u64(12);
        let alphabet = ['a', 'b', 'é', 'c'];
        let word = |rng: &mut StdRng, max: usize| -> String {
            let n = rng.random_range(1..=max);
            (0..n)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect()
        };
        for _ in 0..3_000 {
            let stops: Vec<String> = (0..rng.random_range(1..=4))
                .map(|_| word(&mut rng, 5))
                .collect();
            let text = word(&mut rng, 40);
            let chars: Vec<char> = text.chars().collect();
            let mut deltas = Vec::new();
            let mut i = 0;
            while i < chars.len() {
                let n = rng.random_range(1..=3).min(chars.len() - i);
                deltas.push(chars[i..i + n].iter().collect::<String>());
                i += n;
            }
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let delta_refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
            let got = run(&stop_refs, &delta_refs);
            let want = reference(&stops, &text);
            assert_eq!(got, want, "stops {stops:?} deltas {deltas:?}");
        }
    }

    #[test]
    fn held_text_never_exceeds_the_longest_stop_string() {
        let long = "x".repeat(10_000) + "!";
        let mut m = StopMatcher::new(vec![long]);
        for _ in 0..20_000 {
            m.push("x");
            assert!(m.pending.len() <= 10_000);
        }
        assert!(m.push("!").stopped);
    }
}
