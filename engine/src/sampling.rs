//! Next-token sampling, in vLLM's order: logit bias, then repetition /
//! frequency / presence penalties, then the allowed-token mask of
//! structured output, then temperature, top-k, top-p and min-p, then a
//! draw. Greedy decoding takes the argmax of the processed logits.
//! Log-probabilities are reported from the raw distribution.
//!
//! Sampling is a pure function of a sequence's `SamplingSpec`, its
//! `PenaltyState` (the tokens it has seen), the step's `TokenMask`, the
//! output position and the logits: the draw for position `i` of a request
//! with seed `s` uses an RNG seeded from `(s, i)` alone (requests without a
//! seed get a random one when they are created). So any executor, local or
//! remote, continues the same text, and only token ids need to cross a
//! process or device boundary.

use std::collections::{HashMap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::request::{SamplingParams, TokenLogprob};

/// Temperatures below this are treated as greedy.
const GREEDY_EPS: f32 = 1e-5;

/// How a sequence samples: its processors and its seed (plain data, the
/// same on every executor).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingSpec {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    /// Report the sampled token's log-probability and this many others.
    pub logprobs: Option<usize>,
    /// The request's seed, or a random one drawn at creation.
    pub seed: u64,
}

impl SamplingSpec {
    pub fn new(params: &SamplingParams) -> Self {
        Self {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: params.top_k,
            min_p: params.min_p,
            repetition_penalty: params.repetition_penalty,
            frequency_penalty: params.frequency_penalty,
            presence_penalty: params.presence_penalty,
            logit_bias: params.logit_bias.clone(),
            logprobs: params.logprobs,
            seed: params.seed.unwrap_or_else(|| rand::rng().random()),
        }
    }

    /// Whether this sequence takes the argmax (no random draw).
    pub fn greedy(&self) -> bool {
        self.temperature < GREEDY_EPS
    }

    /// Whether any penalty applies (then draws need the `PenaltyState`).
    pub fn penalized(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }
}

/// The tokens a sequence's penalties look at: the prompt's (repetition
/// penalty) and how often each output token occurred.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PenaltyState {
    output_counts: HashMap<u32, u32>,
    prompt_tokens: HashSet<u32>,
}

impl PenaltyState {
    pub fn new(spec: &SamplingSpec, prompt: &[u32]) -> Self {
        let prompt_tokens = if spec.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Self {
            output_counts: HashMap::new(),
            prompt_tokens,
        }
    }

    /// Counts one more output token.
    pub fn push(&mut self, token: u32) {
        *self.output_counts.entry(token).or_default() += 1;
    }

    /// Its parts, sorted (to send it elsewhere): each output token with
    /// its count, and the prompt's tokens.
    pub fn to_parts(&self) -> (Vec<(u32, u32)>, Vec<u32>) {
        let mut counts: Vec<(u32, u32)> =
            self.output_counts.iter().map(|(&t, &n)| (t, n)).collect();
        counts.sort_unstable();
        let mut prompt: Vec<u32> = self.prompt_tokens.iter().copied().collect();
        prompt.sort_unstable();
        (counts, prompt)
    }

    /// The state `to_parts` described.
    pub fn from_parts(counts: &[(u32, u32)], prompt: &[u32]) -> Self {
        Self {
            output_counts: counts.iter().copied().collect(),
            prompt_tokens: prompt.iter().copied().collect(),
        }
    }
}

/// The tokens structured output allows at one position, as a bitset over
/// the vocabulary (what crosses to an executor instead of a grammar).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    bits: Vec<u64>,
}

impl TokenMask {
    /// The tokens of `0..vocab` for which `allowed` holds.
    pub fn from_fn(vocab: usize, allowed: impl Fn(u32) -> bool) -> Self {
        let mut bits = vec![0u64; vocab.div_ceil(64)];
        for t in 0..vocab {
            if allowed(t as u32) {
                bits[t / 64] |= 1 << (t % 64);
            }
        }
        Self { bits }
    }

    /// The bitset's words (token `t` is bit `t % 64` of word `t / 64`).
    pub fn words(&self) -> &[u64] {
        &self.bits
    }

    /// The mask of `words` (as `words` gives them).
    pub fn from_words(words: Vec<u64>) -> Self {
        Self { bits: words }
    }

    pub fn allows(&self, token: u32) -> bool {
        let t = token as usize;
        self.bits
            .get(t / 64)
            .is_some_and(|w| (w >> (t % 64)) & 1 == 1)
    }

    /// Sets every disallowed token's logit to -inf.
    pub fn apply(&self, logits: &mut [f32]) {
        for (t, l) in logits.iter_mut().enumerate() {
            if !self.allows(t as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// What an executor needs to sample one chunk's rows.
#[derive(Debug, Clone, Copy)]
pub struct RowSampling<'a> {
    pub spec: &'a SamplingSpec,
    /// Output position of the chunk's first sampled token (tokens
    /// generated before it).
    pub position: u64,
    /// The tokens seen so far, when a penalty applies.
    pub penalties: Option<&'a PenaltyState>,
    /// Structured output: the tokens allowed at `position` (constrained
    /// sequences never carry drafts, so only the first row is masked).
    pub allowed: Option<&'a TokenMask>,
}

/// A chunk's sampling with everything it refers to owned: what a stage
/// on another machine, or a spot check long after the step, samples with.
#[derive(Debug, Clone)]
pub struct OwnedSampling {
    pub spec: SamplingSpec,
    pub position: u64,
    pub penalties: Option<PenaltyState>,
    pub allowed: Option<TokenMask>,
}

impl OwnedSampling {
    pub fn row(&self) -> RowSampling<'_> {
        RowSampling {
            spec: &self.spec,
            position: self.position,
            penalties: self.penalties.as_ref(),
            allowed: self.allowed.as_ref(),
        }
    }
}

impl RowSampling<'_> {
    pub fn to_owned(&self) -> OwnedSampling {
        OwnedSampling {
            spec: self.spec.clone(),
            position: self.position,
            penalties: self.penalties.cloned(),
            allowed: self.allowed.cloned(),
        }
    }
}

/// One sampled token with its log-probabilities (when asked for).
pub type Sampled = (u32, Option<TokenLogprob>);

/// The RNG of one draw: a function of the seed and the position only.
fn rng_at(seed: u64, position: u64) -> StdRng {
    StdRng::seed_from_u64(splitmix64(seed ^ splitmix64(position)))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Samples one token at `position` from raw `logits` (pure).
pub fn sample(
    spec: &SamplingSpec,
    penalties: Option<&PenaltyState>,
    allowed: Option<&TokenMask>,
    position: u64,
    logits: &[f32],
) -> Sampled {
    let mut processed = apply_processors(spec, penalties, logits);
    if let Some(mask) = allowed {
        mask.apply(processed.get_or_insert_with(|| logits.to_vec()));
    }
    let scores = processed.as_deref().unwrap_or(logits);
    let token = if spec.greedy() {
        argmax(scores)
    } else {
        draw(spec, scores, &mut rng_at(spec.seed, position))
    };
    let lp = spec.logprobs.map(|k| logprobs(logits, token, k));
    (token, lp)
}

/// Samples a chunk's rows in order, verifying drafts: row `j` is sampled
/// at `position + j` exactly as plain decoding would (so greedy and seeded
/// outputs do not depend on drafting), and sampling stops after the first
/// token that differs from `draft[j]` (the correction) or after the last
/// row.
pub fn sample_chunk<'r>(
    s: &RowSampling<'_>,
    rows: impl IntoIterator<Item = &'r [f32]>,
    draft: &[u32],
) -> Vec<Sampled> {
    let mut out = Vec::new();
    let mut seen: Option<PenaltyState> = None;
    for (j, row) in rows.into_iter().enumerate() {
        let penalties = seen.as_ref().or(s.penalties);
        let allowed = if j == 0 { s.allowed } else { None };
        let (token, lp) = sample(s.spec, penalties, allowed, s.position + j as u64, row);
        out.push((token, lp));
        if draft.get(j) != Some(&token) {
            break;
        }
        if let Some(p) = s.penalties {
            seen.get_or_insert_with(|| p.clone()).push(token);
        }
    }
    out
}

/// A sequence's sampler as one object (spec, penalties, position), for
/// callers that sample one row at a time.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub spec: SamplingSpec,
    penalties: Option<PenaltyState>,
    position: u64,
}

impl Sampler {
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Self {
        let spec = SamplingSpec::new(params);
        let penalties = spec.penalized().then(|| PenaltyState::new(&spec, prompt));
        Self {
            spec,
            penalties,
            position: 0,
        }
    }

    /// Picks the next token from raw `logits` and records it.
    pub fn sample(&mut self, logits: &[f32]) -> Sampled {
        let out = sample(
            &self.spec,
            self.penalties.as_ref(),
            None,
            self.position,
            logits,
        );
        self.position += 1;
        if let Some(p) = &mut self.penalties {
            p.push(out.0);
        }
        out
    }
}

/// Logit bias and penalties; `None` when none apply (no copy needed).
fn apply_processors(
    spec: &SamplingSpec,
    penalties: Option<&PenaltyState>,
    logits: &[f32],
) -> Option<Vec<f32>> {
    let penalties = penalties.filter(|_| spec.penalized());
    if spec.logit_bias.is_empty() && penalties.is_none() {
        return None;
    }
    let mut l = logits.to_vec();
    for &(t, b) in &spec.logit_bias {
        if let Some(v) = l.get_mut(t as usize) {
            *v += b;
        }
    }
    let Some(p) = penalties else {
        return Some(l);
    };
    if spec.repetition_penalty != 1.0 {
        let seen = p.prompt_tokens.iter().chain(p.output_counts.keys());
        for &t in seen {
            if let Some(v) = l.get_mut(t as usize) {
                *v = if *v > 0.0 {
                    *v / spec.repetition_penalty
                } else {
                    *v * spec.repetition_penalty
                };
            }
        }
    }
    for (&t, &c) in &p.output_counts {
        if let Some(v) = l.get_mut(t as usize) {
            *v -= spec.frequency_penalty * c as f32 + spec.presence_penalty;
        }
    }
    Some(l)
}

/// Temperature, top-k, top-p, min-p, then a draw.
fn draw(spec: &SamplingSpec, logits: &[f32], rng: &mut StdRng) -> u32 {
    let inv_t = 1.0 / spec.temperature;
    if spec.top_k > 0 && spec.top_k < logits.len() {
        return draw_top_k(spec, logits, inv_t, rng);
    }
    // Every token's softmax numerator, `exp(l / t - max)`, eight at a time
    // (a 128k vocabulary costs tens of microseconds, not milliseconds);
    // tokens whose logit is not finite get 0.
    let mut w: Vec<f32> = logits
        .iter()
        .map(|&l| {
            if l.is_finite() {
                l * inv_t
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let max = lanes_max(&w);
    if max == f32::NEG_INFINITY {
        return argmax(logits);
    }
    kernels::cpu::ops::exp_shifted_fast(&mut w, max);
    let sums: Vec<f32> = w.chunks(PICK_CHUNK).map(lanes_sum).collect();
    let z: f32 = sums.iter().sum();
    if spec.top_p >= 1.0 && spec.min_p <= 0.0 {
        // Temperature alone: a draw over every token, in token order (the
        // chunk holding the draw found from the chunks' sums first).
        let mut r = rng.random::<f32>() * z;
        let last = w.iter().rposition(|&x| x > 0.0).unwrap_or(0) / PICK_CHUNK;
        let mut chunk = 0;
        while chunk < last && r >= sums[chunk] {
            r -= sums[chunk];
            chunk += 1;
        }
        let at = chunk * PICK_CHUNK;
        let weights = w[at..].iter().enumerate();
        return pick(weights.map(|(i, &x)| ((at + i) as u32, x)), r);
    }
    // The top-p nucleus is the fewest most likely tokens holding `top_p`
    // of the mass. No token under `(1 - top_p) / n` can be in it (all of
    // them together hold less than the `1 - top_p` left out), so only the
    // tokens above that are candidates: a handful for a trained model.
    let floor = if spec.top_p < 1.0 {
        (1.0 - spec.top_p) / w.len() as f32 * z
    } else {
        spec.min_p
    };
    let mut cands: Vec<(u32, f32)> = w
        .iter()
        .enumerate()
        .filter(|&(_, &x)| x > 0.0 && x >= floor)
        .map(|(i, &x)| (i as u32, x))
        .collect();
    nucleus_and_min_p(spec, &mut cands, z);
    let total: f32 = cands.iter().map(|c| c.1).sum();
    let r = rng.random::<f32>() * total;
    pick(cands.iter().copied(), r)
}

/// Tokens per partial sum of a draw over the whole vocabulary.
const PICK_CHUNK: usize = 256;

/// The largest of `xs` (no NaN among them), eight lanes at a time.
fn lanes_max(xs: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut it = xs.chunks_exact(8);
    for c in &mut it {
        for (m, &x) in m.iter_mut().zip(c) {
            if x > *m {
                *m = x;
            }
        }
    }
    let tail = it.remainder().iter().copied();
    m.into_iter().chain(tail).fold(f32::NEG_INFINITY, f32::max)
}

/// The sum of `xs`, eight lanes at a time.
fn lanes_sum(xs: &[f32]) -> f32 {
    let mut s = [0.0f32; 8];
    let mut it = xs.chunks_exact(8);
    for c in &mut it {
        for (s, &x) in s.iter_mut().zip(c) {
            *s += x;
        }
    }
    s.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
}

/// Top-k first (then top-p and min-p among those `k`).
fn draw_top_k(spec: &SamplingSpec, logits: &[f32], inv_t: f32, rng: &mut StdRng) -> u32 {
    let mut cands: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l * inv_t))
        .collect();
    if cands.is_empty() {
        return argmax(logits);
    }
    if spec.top_k < cands.len() {
        cands.select_nth_unstable_by(spec.top_k - 1, |a, b| b.1.total_cmp(&a.1));
        cands.truncate(spec.top_k);
        // Drawn in token order, like every other setting without top-p
        // (not in whatever order the selection left).
        cands.sort_unstable_by_key(|c| c.0);
    }
    softmax_pairs(&mut cands);
    let z = cands.iter().map(|c| c.1).sum();
    nucleus_and_min_p(spec, &mut cands, z);
    let total: f32 = cands.iter().map(|c| c.1).sum();
    let r = rng.random::<f32>() * total;
    pick(cands.iter().copied(), r)
}

/// Keeps the top-p nucleus of `cands` (token order, weights summing to
/// `z` over the whole vocabulary), then the tokens at least `min_p` times
/// as likely as the most likely; the kept ones stay in token order.
fn nucleus_and_min_p(spec: &SamplingSpec, cands: &mut Vec<(u32, f32)>, z: f32) {
    if spec.top_p < 1.0 {
        keep_nucleus(cands, spec.top_p, z);
    }
    if spec.min_p > 0.0 {
        let top = cands.iter().map(|c| c.1).fold(0.0, f32::max);
        cands.retain(|c| c.1 >= spec.min_p * top);
    }
}

/// Buckets of weight by their bits: the exponent and three mantissa bits
/// (eight buckets an octave; every weight here is in `(0, 1]`).
const NUCLEUS_SHIFT: u32 = 20;
const NUCLEUS_BUCKETS: usize = (0x3F80_0000 >> NUCLEUS_SHIFT) + 1;

/// Keeps the fewest most likely tokens holding `top_p` of the mass `z`,
/// without sorting them all: the weights are summed by bucket from the
/// top, and only the bucket where the mass reaches `top_p` is sorted (by
/// weight, then token). A flat distribution's nucleus of 100k tokens then
/// costs a sort of a few hundred.
fn keep_nucleus(cands: &mut Vec<(u32, f32)>, top_p: f32, z: f32) {
    let key = |x: f32| ((x.to_bits() >> NUCLEUS_SHIFT) as usize).min(NUCLEUS_BUCKETS - 1);
    let mut mass = vec![0.0f64; NUCLEUS_BUCKETS];
    for &(_, x) in cands.iter() {
        mass[key(x)] += f64::from(x);
    }
    let target = f64::from(top_p) * f64::from(z);
    let mut acc = 0.0;
    let Some(edge_key) = (0..NUCLEUS_BUCKETS).rev().find(|&b| {
        let reached = mass[b] > 0.0 && acc + mass[b] >= target;
        if !reached {
            acc += mass[b];
        }
        reached
    }) else {
        return; // rounding left the mass short of `top_p`: keep them all
    };
    let mut edge: Vec<(u32, f32)> = cands
        .iter()
        .copied()
        .filter(|c| key(c.1) == edge_key)
        .collect();
    edge.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut last = edge[edge.len() - 1];
    for &c in &edge {
        acc += f64::from(c.1);
        if acc >= target {
            last = c;
            break;
        }
    }
    cands.retain(|&(id, x)| {
        let k = key(x);
        k > edge_key || (k == edge_key && (x > last.1 || (x == last.1 && id <= last.0)))
    });
}

/// The token where the running sum of the weights passes `r` (the last
/// one if rounding leaves `r` past them all).
fn pick(weights: impl Iterator<Item = (u32, f32)>, mut r: f32) -> u32 {
    let mut last = 0;
    for (id, p) in weights {
        if p <= 0.0 {
            continue;
        }
        if r < p {
            return id;
        }
        r -= p;
        last = id;
    }
    last
}

/// Log-probability of `token` and the `k` most likely tokens under the raw
/// distribution of `logits`.
pub fn logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    // The kernels' `exp` and an f64 `ln` rounded once: the same floats on
    // every platform (a browser tab's libm is not glibc), so a worker
    // reports the log-probabilities the house engine scores, bit for bit.
    let sum = logits
        .iter()
        .filter(|v| v.is_finite())
        .map(|v| kernels::cpu::ops::exp(v - max))
        .sum::<f32>();
    let lse = max + f64::from(sum).ln() as f32;
    let lp = |t: u32| {
        logits
            .get(t as usize)
            .map_or(f32::NEG_INFINITY, |v| v - lse)
    };
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect();
        let k = k.min(all.len());
        all.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        all.truncate(k);
        all.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        top = all.into_iter().map(|(t, v)| (t, v - lse)).collect();
    }
    TokenLogprob {
        token,
        logprob: lp(token),
        top,
    }
}

/// Index of the largest value (first on ties); NaN never wins.
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in xs.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Replaces the scores in `pairs` with their softmax probabilities,
/// through the kernels' `exp` (not the platform's libm: a browser tab and
/// a native worker draw the same token from the same seed).
fn softmax_pairs(pairs: &mut [(u32, f32)]) {
    let max = pairs.iter().map(|p| p.1).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for p in pairs.iter_mut() {
        p.1 = kernels::cpu::ops::exp(p.1 - max);
        sum += p.1;
    }
    for p in pairs.iter_mut() {
        p.1 /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: Some(seed),
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(&params(0.0, 1.0, 0, 1), &[]);
        assert_eq!(s.sample(&[0.1, 3.0, f32::NAN, 2.0]).0, 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(&params(1.0, 1.0, 0, seed), &[]);
            (0..50).map(|_| s.sample(&logits).0).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_and_top_p_never_pick_outside_the_nucleus() {
        // Token 3 holds ~88% of the mass, token 0 ~12%, the rest ~0.
        let logits = [2.0, -20.0, -20.0, 4.0, -20.0];
        let mut k1 = Sampler::new(&params(1.0, 1.0, 1, 3), &[]);
        let mut p = Sampler::new(&params(1.0, 0.5, 0, 3), &[]);
        for _ in 0..200 {
            assert_eq!(k1.sample(&logits).0, 3);
            assert_eq!(p.sample(&logits).0, 3);
        }
        let mut k2 = Sampler::new(&params(1.0, 1.0, 2, 3), &[]);
        let picks: Vec<u32> = (0..400).map(|_| k2.sample(&logits).0).collect();
        assert!(picks.iter().all(|&t| t == 0 || t == 3));
        let zeros = picks.iter().filter(|&&t| t == 0).count();
        assert!(
            (20..100).contains(&zeros),
            "token 0 drawn {zeros}/400 times"
        );
    }

    #[test]
    fn a_draw_depends_on_the_seed_and_position_only() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let spec = SamplingSpec::new(&params(1.0, 1.0, 0, 5));
        // Position 9 drawn directly equals the 10th draw of a running sampler.
        let mut s = Sampler::new(&params(1.0, 1.0, 0, 5), &[]);
        let tenth = (0..10).map(|_| s.sample(&logits).0).last();
        assert_eq!(Some(sample(&spec, None, None, 9, &logits).0), tenth);
        // Drafts do not change what each row samples.
        let rows: Vec<&[f32]> = vec![&logits; 4];
        let plain: Vec<u32> = (0..4)
            .map(|j| sample(&spec, None, None, 3 + j, &logits).0)
            .collect();
        let row = RowSampling {
            spec: &spec,
            position: 3,
            penalties: None,
            allowed: None,
        };
        let verified = sample_chunk(&row, rows.iter().copied(), &plain[..3]);
        assert_eq!(verified.iter().map(|t| t.0).collect::<Vec<_>>(), plain);
    }

    /// The plain definition of a draw, in f64: softmax over every finite
    /// token, every candidate sorted, the nucleus, min-p, then, in token
    /// order, the token where the running sum passes `u` times the kept
    /// mass. Returns it and the kept set.
    fn reference_draw(spec: &SamplingSpec, logits: &[f32], u: f64) -> (u32, Vec<u32>) {
        let t = f64::from(spec.temperature);
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, f64::from(l) / t))
            .collect();
        if spec.top_k > 0 && spec.top_k < c.len() {
            c.sort_by(|a, b| b.1.total_cmp(&a.1));
            c.truncate(spec.top_k);
        }
        let max = c.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = c.iter().map(|x| (x.1 - max).exp()).sum();
        c.iter_mut().for_each(|x| x.1 = (x.1 - max).exp() / z);
        let sorted = spec.top_p < 1.0;
        if sorted {
            c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut mass = 0.0;
            let keep = c
                .iter()
                .position(|x| {
                    mass += x.1;
                    mass >= f64::from(spec.top_p)
                })
                .map_or(c.len(), |i| i + 1);
            c.truncate(keep);
        }
        c.sort_by_key(|x| x.0);
        let top = c.iter().map(|x| x.1).fold(0.0, f64::max);
        c.retain(|x| x.1 >= f64::from(spec.min_p) * top);
        let mut r = u * c.iter().map(|x| x.1).sum::<f64>();
        let kept: Vec<u32> = c.iter().map(|x| x.0).collect();
        for &(id, p) in &c {
            if r < p {
                return (id, kept);
            }
            r -= p;
        }
        (*kept.last().expect("a token"), kept)
    }

    #[test]
    fn draws_match_the_plain_definition_on_random_logits_and_settings() {
        let mut rng = StdRng::seed_from_u64(19);
        let (mut same, cases) = (0, 2000);
        for case in 0..cases {
            let n = rng.random_range(1..3000);
            let spread = [0.5f32, 2.0, 6.0][case % 3];
            let mut logits: Vec<f32> = (0..n)
                .map(|_| (rng.random::<f32>() - 0.5) * 2.0 * spread)
                .collect();
            // A few tokens far above the rest (a trained model's shape),
            // and some that are not finite (masked or broken).
            for _ in 0..rng.random_range(0..4) {
                let i = rng.random_range(0..n);
                logits[i] += 10.0;
            }
            if n > 1 && case % 5 == 0 {
                logits[rng.random_range(0..n)] = f32::NEG_INFINITY;
                logits[rng.random_range(0..n)] = f32::NAN;
            }
            let spec = SamplingSpec {
                temperature: [0.3, 0.8, 1.0, 1.7][case % 4],
                top_p: [1.0, 0.95, 0.5, 0.1, 0.0][(case / 4) % 5],
                top_k: [0, 0, 40, 1][(case / 16) % 4],
                min_p: [0.0, 0.0, 0.05][(case / 7) % 3],
                ..SamplingSpec::new(&params(1.0, 1.0, 0, 1))
            };
            let mut a = rng_at(case as u64, 0);
            let u = f64::from(rng_at(case as u64, 0).random::<f32>());
            let got = draw(&spec, &logits, &mut a);
            let (want, kept) = reference_draw(&spec, &logits, u);
            assert!(
                kept.contains(&got),
                "case {case}: drew {got}, outside the {} kept tokens ({spec:?})",
                kept.len()
            );
            same += usize::from(got == want);
        }
        // Only a draw within rounding of a boundary between two tokens may
        // go the other way.
        assert!(
            same >= cases * 995 / 1000,
            "{same} of {cases} draws as defined"
        );
    }

    #[test]
    fn a_mask_leaves_only_allowed_tokens() {
        let spec = SamplingSpec::new(&params(0.0, 1.0, 0, 1));
        let mask = TokenMask::from_fn(130, |t| t == 7 || t == 129);
        assert!(mask.allows(129) && !mask.allows(128) && !mask.allows(500));
        let logits: Vec<f32> = (0..130).map(|i| i as f32).collect();
        assert_eq!(sample(&spec, None, Some(&mask), 0, &logits).0, 129);
    }
}
