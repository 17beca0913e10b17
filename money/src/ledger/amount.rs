//! Money and the arithmetic of a bill: amounts are `i64` counts of ticks
//! (10^-10 of a currency unit), never floats; prices are ticks per million
//! tokens; a quote fixes the prices of one request, its worst case (the
//! hold) and, from its usage, its cost and how that cost is split between
//! the provider and the treasury.
//!
//! Why ticks: a short request at the house's idle prices costs a few
//! hundred billionths of a unit, so a micro-unit (or even a nano-unit)
//! ledger would round its cost by a large fraction of itself. A tick keeps
//! the rounding of such a request under 0.1% of its cost while `i64`
//! still holds 9.2 * 10^8 units, well above the bounds below.
//!
//! One rounding rule, for every charge (a request's cost, a cache hit, a
//! hold, a bid's worst case, a market fill): what the user pays is rounded
//! up to a whole tick. The cost is then split: the protocol fee inside it
//! is rounded up too (a charge never rounds the fee away), the provider
//! gets the rest times its payout share (at most 1x), rounded down, and
//! the treasury takes the difference, so the parts always sum to the cost
//! and the treasury's part is never below the fee.

use serde::{Deserialize, Serialize};

/// An amount of money in ticks.
pub type Amount = i64;

/// Ticks in one currency unit.
pub const TICKS_PER_UNIT: i64 = 10_000_000_000;

/// Decimal places of a tick.
const TICK_DECIMALS: usize = 10;

/// The most one operation may move (a top-up, a penalty, a hold, a
/// charge): 10^5 units. Also the bound on a credit limit.
pub const MAX_AMOUNT: Amount = 100_000 * TICKS_PER_UNIT;

/// The bound on any balance, sum of holds, key budget or key spending:
/// 10^8 units. Three of them still sum far inside `i64` (about 9.2 *
/// 10^18 ticks), so `balance + credit_limit - held` can never wrap, and a
/// SQL sum of a bounded value and a bounded amount never overflows (SQLite
/// would silently turn it into a REAL).
pub const MAX_BALANCE: Amount = 1_000 * MAX_AMOUNT;

/// Checks an amount one operation moves: `0 < amount <= MAX_AMOUNT`.
pub fn check_amount(what: &str, amount: Amount) -> Result<Amount, String> {
    if amount <= 0 {
        Err(format!("a {what} must be positive"))
    } else if amount > MAX_AMOUNT {
        Err(format!(
            "a {what} is at most {} (got {})",
            show_units(MAX_AMOUNT),
            show_units(amount)
        ))
    } else {
        Ok(amount)
    }
}

/// Checks a bound a user sets (credit limit, budget): `0..=max`.
pub fn check_bound(what: &str, value: Amount, max: Amount) -> Result<Amount, String> {
    if !(0..=max).contains(&value) {
        return Err(format!(
            "{what} must be between 0 and {} (got {})",
            show_units(max),
            show_units(value)
        ));
    }
    Ok(value)
}

/// Tokens a price is quoted for.
const PER_TOKENS: i128 = 1_000_000;

/// Basis points in 1 (fees and multipliers are integers of 1/10,000).
pub const BPS: i64 = 10_000;

/// Formats ticks as a decimal string of units (`-1.2500000000`).
pub fn format_units(m: Amount) -> String {
    let sign = if m < 0 { "-" } else { "" };
    let a = m.unsigned_abs();
    let per = TICKS_PER_UNIT.unsigned_abs();
    format!("{sign}{}.{:0w$}", a / per, a % per, w = TICK_DECIMALS)
}

/// `a` ticks as units, without trailing zeros past the cents (`"25.00"`,
/// `"0.50"`, `"0.0000001234"`, `"-3.10"`).
pub fn show_units(a: Amount) -> String {
    let full = format_units(a);
    let trimmed = full.trim_end_matches('0');
    let dot = trimmed.find('.').unwrap_or(trimmed.len());
    let decimals = trimmed.len() - dot - 1;
    if decimals >= 2 {
        trimmed.to_string()
    } else {
        full[..dot + 3].to_string()
    }
}

/// Parses a decimal amount of units (`12`, `0.5`, `1.0000000001`) exactly
/// into ticks; more than ten decimals or past `i64` is an error (a value
/// that parses may still be past an operation's bound).
pub fn parse_units(s: &str) -> Result<Amount, String> {
    let bad = || format!("`{s}` is not an amount (up to 10 decimals, like 12.5)");
    let t = s.trim();
    let (neg, t) = t.strip_prefix('-').map_or((false, t), |r| (true, r));
    let (whole, frac) = t.split_once('.').unwrap_or((t, "0"));
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) || frac.len() > TICK_DECIMALS {
        return Err(bad());
    }
    let too_large = || {
        format!(
            "`{s}` is too large: amounts are at most {}",
            show_units(MAX_BALANCE)
        )
    };
    let w: i64 = whole.parse().map_err(|_| too_large())?;
    let f: i64 = format!("{frac:0<w$}", w = TICK_DECIMALS)
        .parse()
        .map_err(|_| bad())?;
    let v = w
        .checked_mul(TICKS_PER_UNIT)
        .and_then(|v| v.checked_add(f))
        .ok_or_else(too_large)?;
    Ok(if neg { -v } else { v })
}

/// Prices of one model at one provider, per million tokens (ticks inside,
/// units strings on the API),
/// fee included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Prices {
    /// Prompt tokens computed (prefill).
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub input: Amount,
    /// Prompt tokens served from the prefix cache.
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub cached_input: Amount,
    /// Generated tokens (decode).
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub output: Amount,
}

/// The tokens of one finished (or cut) request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub prompt: u64,
    /// Of `prompt`, how many came from the prefix cache.
    pub cached: u64,
    pub completion: u64,
}

/// The terms a request runs under: who provides it, at which prices, the
/// protocol fee and the provider's reward multiplier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quote {
    pub provider_id: String,
    pub model: String,
    pub prices: Prices,
    /// The protocol fee inside the prices, in basis points of the
    /// provider's share (500 = 5%).
    pub fee_bps: i64,
    /// The provider's share of the cost net of the fee, in basis points
    /// (10,000 = all of it; a poor reputation less; never more).
    pub payout_bps: i64,
    /// Which executors run the request's stages (recorded on its usage).
    pub stages: Stages,
}

/// The executors (or providers' workers) that run a request's prefill and
/// its decode; empty where nothing ran (a cache hit, a market trade).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Stages {
    pub prefill: String,
    pub decode: String,
}

impl Stages {
    /// Both stages on one executor.
    pub fn one(executor: &str) -> Self {
        Self {
            prefill: executor.to_string(),
            decode: executor.to_string(),
        }
    }
}

/// How a cost is divided; `provider + treasury == cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub cost: Amount,
    pub provider: Amount,
    pub treasury: Amount,
}

impl Quote {
    /// The most a request can cost: every prompt token computed and every
    /// allowed token generated. Settlement never exceeds it.
    pub fn worst_case(&self, prompt: u64, max_completion: u64) -> Amount {
        self.cost(Tokens {
            prompt,
            cached: 0,
            completion: max_completion,
        })
    }

    /// What `t` costs, rounded up to a whole tick.
    pub fn cost(&self, t: Tokens) -> Amount {
        let cached = t.cached.min(t.prompt);
        let p = &self.prices;
        let total = i128::from(t.prompt - cached) * i128::from(p.input)
            + i128::from(cached) * i128::from(p.cached_input.min(p.input))
            + i128::from(t.completion) * i128::from(p.output);
        let ticks = (total + PER_TOKENS - 1) / PER_TOKENS;
        i64::try_from(ticks).unwrap_or(i64::MAX)
    }

    /// Divides `cost`: the fee (rounded up) goes to the treasury, the
    /// provider gets the rest times its payout share (clamped to 0-1x,
    /// rounded down), and the treasury keeps any difference, so the parts
    /// always sum to the cost and the provider never gets more than the
    /// cost less the fee.
    pub fn split(&self, cost: Amount) -> Split {
        let c = i128::from(cost.max(0));
        let fee = fee_inside(c, self.fee_bps);
        let share = i128::from(self.payout_bps.clamp(0, BPS));
        let provider = (c - fee) * share / i128::from(BPS);
        let provider = i64::try_from(provider).unwrap_or(0);
        Split {
            cost,
            provider,
            treasury: cost - provider,
        }
    }
}

/// The most a price may be (ticks per million tokens): 1,000 units
/// per million tokens, far above any real model's price.
pub const MAX_PRICE: Amount = 1_000 * TICKS_PER_UNIT;

/// What `tokens_per_s` tokens a second for `secs` seconds cost at `price`
/// per million tokens, rounded up; `None` past `i64`.
pub fn capacity_cost(price: Amount, tokens_per_s: u64, secs: i64) -> Option<Amount> {
    let total = i128::from(price) * i128::from(tokens_per_s) * i128::from(secs.max(0));
    i64::try_from((total + PER_TOKENS - 1) / PER_TOKENS).ok()
}

/// The fee inside a cost that includes it (`cost * fee / (1 + fee)`),
/// rounded up: the treasury never loses its fee to rounding.
fn fee_inside(cost: i128, fee_bps: i64) -> i128 {
    let den = i128::from(BPS + fee_bps.max(0));
    (cost * i128::from(fee_bps.max(0)) + den - 1) / den
}

/// Divides `cost` with a fee of `fee_bps` inside it: the fee (rounded
/// up) to the treasury, the rest to the provider.
pub fn split_fee(cost: Amount, fee_bps: i64) -> Split {
    let fee = fee_inside(i128::from(cost.max(0)), fee_bps);
    let treasury = i64::try_from(fee).unwrap_or(0);
    Split {
        cost,
        provider: cost - treasury,
        treasury,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quote(fee_bps: i64, payout_bps: i64) -> Quote {
        Quote {
            provider_id: "provider:house".into(),
            model: "m".into(),
            prices: Prices {
                input: 100_000,
                cached_input: 10_000,
                output: 400_000,
            },
            fee_bps,
            payout_bps,
            stages: Stages::default(),
        }
    }

    #[test]
    fn amounts_parse_and_print_exactly() {
        assert_eq!(parse_units("12"), Ok(12 * TICKS_PER_UNIT));
        assert_eq!(parse_units("0.5"), Ok(TICKS_PER_UNIT / 2));
        assert_eq!(parse_units("-1.0000000001"), Ok(-TICKS_PER_UNIT - 1));
        assert_eq!(parse_units("0.000001"), Ok(10_000));
        for bad in [
            "",
            "1.23456789012",
            "1e3",
            "abc",
            ".5",
            "1.",
            "999999999999",
        ] {
            assert!(parse_units(bad).is_err(), "{bad}");
        }
        let huge = parse_units("9223372036854").expect_err("past i64");
        assert!(huge.contains("at most"), "{huge}");
        assert_eq!(format_units(-12_500_000_000), "-1.2500000000");
        assert_eq!(format_units(7), "0.0000000007");
        for v in [0, 1, -1, MAX_AMOUNT, -MAX_BALANCE, i64::MAX, i64::MIN + 1] {
            assert_eq!(parse_units(&format_units(v)), Ok(v), "{v}");
        }
    }

    #[test]
    fn costs_round_up_and_never_exceed_the_worst_case() {
        let q = quote(500, BPS);
        // 1 token of input at 0.1 tick: rounds up to 1.
        let one = Tokens {
            prompt: 1,
            ..Tokens::default()
        };
        assert_eq!(q.cost(one), 1);
        assert_eq!(q.worst_case(1000, 100), 100 + 40);
        let mut rng = 0x2545f491u64;
        for _ in 0..10_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let prompt = rng % 5000;
            let max = (rng >> 20) % 3000;
            let t = Tokens {
                prompt,
                cached: (rng >> 32) % (prompt + 1),
                completion: (rng >> 40) % (max + 1),
            };
            assert!(q.cost(t) <= q.worst_case(prompt, max), "{t:?}");
        }
    }

    #[test]
    fn splits_always_sum_to_the_cost_and_never_pay_past_the_fee() {
        for (fee, payout) in [(500, BPS), (1000, 5_000), (700, 24_000), (0, BPS)] {
            let q = quote(fee, payout);
            for cost in [0, 1, 7, 999, 1_000_003, 123_456_789] {
                let s = q.split(cost);
                assert_eq!(s.provider + s.treasury, cost);
                assert!(s.provider >= 0);
                assert!(
                    s.treasury >= split_fee(cost, fee).treasury,
                    "{fee} {payout} {cost}"
                );
            }
        }
        // A 5% fee on top of the provider's price: 105 -> 100 + 5.
        let s = quote(500, BPS).split(105);
        assert_eq!((s.provider, s.treasury), (100, 5));
    }

    #[test]
    fn the_fee_is_never_rounded_away() {
        for cost in [1, 2, 20, 21, 313, 3_133, 1_000_003] {
            for fee_bps in [500, 700, 1_000] {
                let exact = cost as f64 * fee_bps as f64 / (BPS + fee_bps) as f64;
                let s = quote(fee_bps, BPS).split(cost);
                assert!(
                    s.treasury >= 1 && s.treasury as f64 >= exact,
                    "{cost} {fee_bps}"
                );
                assert!((s.treasury as f64) < exact + 1.0, "{cost} {fee_bps}");
                let m = split_fee(cost, fee_bps);
                assert_eq!((m.provider, m.treasury), (s.provider, s.treasury));
            }
        }
        assert_eq!(quote(0, BPS).split(99).treasury, 0);
    }
}
