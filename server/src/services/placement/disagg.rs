//! The cost model of prefill/decode disaggregation, as a pure function
//! over plain numbers: whether a choice placed on decode worker D should
//! prefill on another worker P, and what each plan is expected to take.
//!
//! Colocated on D, the prompt costs D's prefill time, and every choice D
//! runs stalls for it (D's outstanding choices x that time). Split, the
//! prompt runs on P (P's prefill time, P's choices stall), then its KV
//! moves (bytes from the model's geometry for the positions D's cache
//! lacks, over the link bandwidth measured on earlier transfers, plus
//! both links' round trips), and D decodes. Times come from each
//! worker's calibrated profile and production correction; prices from
//! their terms. The plan with the lower weighted log-score of time and
//! price wins (`auto`), by a margin (moving KV is a new way to fail);
//! `always` splits whenever a second worker can prefill; `never` never
//! does.

use super::score::{Measure, Terms, Weights};

/// Whether choices may prefill on another worker (`--fleet-split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitMode {
    Never,
    #[default]
    Auto,
    Always,
}

impl std::str::FromStr for SplitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "never" => Ok(Self::Never),
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            _ => Err(format!("`{s}`: expected never, auto or always")),
        }
    }
}

/// What the cost model expects of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Estimate {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    /// Moving the KV (0 colocated).
    pub transfer_ms: f64,
    pub kv_bytes: u64,
}

/// The smallest prompt (uncached on the decode worker) worth moving.
pub const MIN_SPLIT_TOKENS: usize = 32;
/// How much better (in log-score) a split must be than colocation.
const MARGIN: f64 = 0.05;

/// One worker as the split's cost model sees it.
#[derive(Debug, Clone)]
pub struct SplitWorker {
    pub measure: Measure,
    pub terms: Terms,
    /// Prompt tokens it likely holds in its prefix cache.
    pub cached: usize,
    /// Its link's round trip to this server, in ms.
    pub rtt_ms: f64,
    /// Its link's measured bandwidth, bytes/s.
    pub bandwidth: f64,
}

/// What the split's cost model sees of one choice.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SplitInputs {
    pub mode: SplitMode,
    pub weights: Weights,
    pub prompt: usize,
    pub max_tokens: usize,
    /// KV bytes of one position over all layers (the model's geometry).
    pub kv_bytes_per_token: u64,
    /// The decode worker, and whether it is on this replica (a transfer
    /// goes through this server's gateway).
    pub decode: SplitWorker,
    pub decode_local: bool,
    /// The other workers of this replica that could prefill.
    pub prefills: Vec<SplitWorker>,
}

impl SplitInputs {
    pub fn new(decode: SplitWorker, decode_local: bool, prompt: usize, max_tokens: usize) -> Self {
        Self {
            mode: SplitMode::default(),
            weights: Weights::default(),
            prompt,
            max_tokens,
            kv_bytes_per_token: 0,
            decode,
            decode_local,
            prefills: Vec::new(),
        }
    }
}

/// Expected ms to prefill `tokens` on an executor (its profile's: the
/// correction is learned from decode steps, which other choices' prefill
/// chunks slow down; it says nothing of a prefill's own speed).
fn prefill_ms(m: &Measure, tokens: usize) -> Option<f64> {
    Some(m.profile?.prefill_ms(tokens))
}

/// Expected decode step with one more choice.
fn tpot_ms(m: &Measure) -> Option<f64> {
    Some(m.profile?.step_ms(m.outstanding + 1) * m.correction)
}

/// Prefills already on a worker share its steps (on average half done,
/// each taken as long as this one).
fn queued(m: &Measure) -> f64 {
    1.0 + 0.5 * f64::from(m.prefilling)
}

/// What `computed`, `cached` and `out` tokens cost on `t` (at least 1).
fn price(t: &Terms, computed: usize, cached: usize, out: usize) -> f64 {
    let p = &t.prices;
    (computed as f64 * p.input as f64
        + cached as f64 * p.cached_input as f64
        + out as f64 * p.output as f64)
        .max(1.0)
}

/// The colocated estimate (default when D is not calibrated), and the
/// prefill worker (an index into `prefills`) with its estimate when the
/// model splits.
pub fn plan(i: &SplitInputs) -> (Estimate, Option<(usize, Estimate)>) {
    let d = &i.decode;
    let uncached_d = i.prompt - d.cached.min(i.prompt);
    let (Some(pre_d), Some(tpot)) = (prefill_ms(&d.measure, uncached_d), tpot_ms(&d.measure))
    else {
        return (Estimate::default(), None);
    };
    let colocated = Estimate {
        ttft_ms: pre_d * queued(&d.measure) + d.rtt_ms,
        tpot_ms: tpot,
        transfer_ms: 0.0,
        kv_bytes: 0,
    };
    if i.mode == SplitMode::Never
        || i.max_tokens < 2
        || uncached_d < MIN_SPLIT_TOKENS
        || !i.decode_local
    {
        return (colocated, None);
    }
    let max = i.max_tokens as f64;
    let time_c = colocated.ttft_ms + max * tpot + f64::from(d.measure.outstanding) * pre_d;
    let cost_c = price(&d.terms, uncached_d, i.prompt - uncached_d, i.max_tokens);
    let mut best: Option<(f64, usize, Estimate)> = None;
    for (n, p) in i.prefills.iter().enumerate() {
        let Some((score, estimate)) = split_score(i, p, (uncached_d, tpot), (time_c, cost_c))
        else {
            continue;
        };
        if best.as_ref().is_none_or(|(s, ..)| score < *s) {
            best = Some((score, n, estimate));
        }
    }
    let pick = match i.mode {
        SplitMode::Always => best,
        SplitMode::Auto | SplitMode::Never => best.filter(|(s, ..)| *s < -MARGIN),
    };
    (colocated, pick.map(|(_, n, e)| (n, e)))
}

/// Prefilling on `p`: its score against colocation (`Always`: its time)
/// and its estimate; `None` when `p` cannot (uncalibrated, or full).
fn split_score(
    i: &SplitInputs,
    p: &SplitWorker,
    (uncached_d, tpot): (usize, f64),
    (time_c, cost_c): (f64, f64),
) -> Option<(f64, Estimate)> {
    let d = &i.decode;
    let cached_p = p.cached.min(i.prompt);
    let pre_p = prefill_ms(&p.measure, i.prompt - cached_p)?;
    // A full worker is no prefill candidate, unless told to always split.
    if p.measure.full() && i.mode != SplitMode::Always {
        return None;
    }
    let bytes = i.kv_bytes_per_token * uncached_d as u64;
    let transfer = bytes as f64 * 1e3 / p.bandwidth + p.rtt_ms + d.rtt_ms;
    let estimate = Estimate {
        ttft_ms: pre_p * queued(&p.measure) + p.rtt_ms,
        tpot_ms: tpot,
        transfer_ms: transfer,
        kv_bytes: bytes,
    };
    let max = i.max_tokens as f64;
    let time_s =
        estimate.ttft_ms + transfer + (max - 1.0) * tpot + f64::from(p.measure.outstanding) * pre_p;
    if i.mode == SplitMode::Always {
        return Some((time_s, estimate));
    }
    let cost_s =
        price(&p.terms, i.prompt - cached_p, cached_p, 0) + price(&d.terms, 0, 0, i.max_tokens);
    let wt = i.weights.latency + i.weights.load;
    let score = wt * (time_s / time_c).ln() + i.weights.cost * (cost_s / cost_c).ln();
    Some((score, estimate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::registry::Profile;
    use money::ledger::amount::{BPS, Prices};

    /// A calibrated worker prefilling `tokens_per_s`, decoding at 5 ms.
    fn side(tokens_per_s: f64) -> SplitWorker {
        SplitWorker {
            measure: Measure {
                profile: Some(Profile {
                    prefill_tokens_per_s: tokens_per_s,
                    prefill_ms_long: 0.0,
                    decode_step_ms_1: 5.0,
                    decode_step_ms_4: 8.0,
                    measured_at: 0,
                }),
                cap: 8,
                ..Measure::default()
            },
            terms: Terms {
                provider_id: "p".into(),
                prices: Prices {
                    input: 100,
                    cached_input: 100,
                    output: 100,
                },
                payout_bps: BPS,
                reputation_bps: BPS,
            },
            cached: 0,
            rtt_ms: 0.0,
            bandwidth: 500e6,
        }
    }

    fn inputs(prompt: usize, decode: f64, prefill: f64) -> SplitInputs {
        SplitInputs {
            weights: "latency=1".parse().expect("weights"),
            kv_bytes_per_token: 4,
            prefills: vec![side(prefill)],
            ..SplitInputs::new(side(decode), true, prompt, 16)
        }
    }

    #[test]
    fn boundary_a_prompt_one_short_of_the_minimum_never_moves() {
        let at = inputs(MIN_SPLIT_TOKENS, 500.0, 100_000.0);
        assert!(plan(&at).1.is_some(), "at the minimum it may");
        let short = inputs(MIN_SPLIT_TOKENS - 1, 500.0, 100_000.0);
        assert!(plan(&short).1.is_none());
        // Cached on D: what D lacks is what counts.
        let mut cached = inputs(MIN_SPLIT_TOKENS + 16, 500.0, 100_000.0);
        cached.decode.cached = 17;
        assert!(plan(&cached).1.is_none());
    }

    #[test]
    fn boundary_a_split_must_win_by_the_margin() {
        // Equally fast workers: the split only adds the transfer.
        let even = inputs(2048, 1000.0, 1000.0);
        assert!(plan(&even).1.is_none());
        // `always` takes it all the same.
        let always = SplitInputs {
            mode: SplitMode::Always,
            ..even
        };
        assert_eq!(plan(&always).1.map(|(n, _)| n), Some(0));
    }

    #[test]
    fn a_long_prompt_goes_to_a_much_faster_prefill_worker_with_its_kv_counted() {
        let i = inputs(2048, 500.0, 100_000.0);
        let (colocated, split) = plan(&i);
        let (n, e) = split.expect("a split");
        assert_eq!(n, 0);
        assert!((colocated.ttft_ms - 4096.0).abs() < 1.0, "{colocated:?}");
        assert!(e.ttft_ms < 25.0 && e.kv_bytes == 2048 * 4, "{e:?}");
        // One token to generate, an uncalibrated decode worker, a decode
        // worker on another replica, or `never`: no split.
        let one = SplitInputs {
            max_tokens: 1,
            ..i.clone()
        };
        assert!(plan(&one).1.is_none());
        let mut blind = i.clone();
        blind.decode.measure.profile = None;
        assert_eq!(plan(&blind), (Estimate::default(), None));
        let remote = SplitInputs {
            decode_local: false,
            ..i.clone()
        };
        assert!(plan(&remote).1.is_none());
        let never = SplitInputs {
            mode: SplitMode::Never,
            ..i
        };
        assert!(plan(&never).1.is_none());
    }

    #[test]
    fn a_full_prefill_worker_is_passed_over_unless_told_to_always_split() {
        let mut i = inputs(2048, 500.0, 100_000.0);
        i.prefills[0].measure.outstanding = 8;
        assert!(plan(&i).1.is_none());
        i.mode = SplitMode::Always;
        assert!(plan(&i).1.is_some());
    }
}
