//! Money and the arithmetic of a bill: amounts are `i64` micro-units (one
//! millionth of a currency unit), never floats; prices are micro-units per
//! million tokens; a quote fixes the prices of one request, its worst case
//! (the hold) and, from its usage, its cost and how that cost is split
//! between the provider and the treasury.
//!
//! One rounding rule: what a user pays is rounded up to a whole micro-unit
//! (a request's cost, a hold, a bid's worst case, a cache hit's prices);
//! a cost is then split with the fee rounded down and the provider's
//! share rounded down, the treasury taking the difference, so the parts
//! always sum to the cost.

use serde::{Deserialize, Serialize};

/// An amount of money in micro-units.
pub type Micros = i64;

/// Micro-units in one currency unit.
pub const MICROS_PER_UNIT: i64 = 1_000_000;

/// The most one operation may move (a top-up, a penalty, a hold, a
/// charge): 10^9 units. Also the bound on a credit limit.
pub const MAX_AMOUNT: Micros = 1_000_000_000 * MICROS_PER_UNIT;

/// The bound on any balance, sum of holds, key budget or key spending:
/// 10^12 units. Three of them still sum far inside `i64` (about 9.2 *
/// 10^18), so `balance + credit_limit - held` can never wrap, and a SQL
/// sum of a bounded value and a bounded amount never overflows (SQLite
/// would silently turn it into a REAL).
pub const MAX_BALANCE: Micros = 1_000 * MAX_AMOUNT;

/// Checks an amount one operation moves: `0 < amount <= MAX_AMOUNT`.
pub fn check_amount(what: &str, amount: Micros) -> Result<Micros, String> {
    if amount <= 0 {
        Err(format!("a {what} must be positive"))
    } else if amount > MAX_AMOUNT {
        Err(format!(
            "a {what} is at most {} (got {})",
            format_units(MAX_AMOUNT),
            format_units(amount)
        ))
    } else {
        Ok(amount)
    }
}

/// Checks a bound a user sets (credit limit, budget): `0..=max`.
pub fn check_bound(what: &str, value: Micros, max: Micros) -> Result<Micros, String> {
    if !(0..=max).contains(&value) {
        return Err(format!(
            "{what} must be between 0 and {} (got {})",
            format_units(max),
            format_units(value)
        ));
    }
    Ok(value)
}

/// Tokens a price is quoted for.
const PER_TOKENS: i128 = 1_000_000;

/// Basis points in 1 (fees and multipliers are integers of 1/10,000).
pub const BPS: i64 = 10_000;

/// Formats micro-units as a decimal string (`-1.250000`).
pub fn format_units(m: Micros) -> String {
    let sign = if m < 0 { "-" } else { "" };
    let a = m.unsigned_abs();
    format!("{sign}{}.{:06}", a / 1_000_000, a % 1_000_000)
}

/// Parses a decimal amount (`12`, `0.5`, `1.000001`) exactly into
/// micro-units; more than six decimals or overflow is an error.
pub fn parse_units(s: &str) -> Result<Micros, String> {
    let bad = || format!("`{s}` is not an amount (up to 6 decimals, like 12.5)");
    let t = s.trim();
    let (neg, t) = t.strip_prefix('-').map_or((false, t), |r| (true, r));
    let (whole, frac) = t.split_once('.').unwrap_or((t, "0"));
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) || frac.len() > 6 {
        return Err(bad());
    }
    let w: i64 = whole.parse().map_err(|_| bad())?;
    let f: i64 = format!("{frac:0<6}").parse().map_err(|_| bad())?;
    let v = w
        .checked_mul(MICROS_PER_UNIT)
        .and_then(|v| v.checked_add(f))
        .ok_or_else(bad)?;
    Ok(if neg { -v } else { v })
}

/// Prices of one model at one provider, in micro-units per million tokens,
/// fee included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Prices {
    /// Prompt tokens computed (prefill).
    pub input: Micros,
    /// Prompt tokens served from the prefix cache.
    pub cached_input: Micros,
    /// Generated tokens (decode).
    pub output: Micros,
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
    /// Reputation x uptime bonus, in basis points (10,000 = 1x).
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
    pub cost: Micros,
    pub provider: Micros,
    pub treasury: Micros,
}

impl Quote {
    /// The most a request can cost: every prompt token computed and every
    /// allowed token generated. Settlement never exceeds it.
    pub fn worst_case(&self, prompt: u64, max_completion: u64) -> Micros {
        self.cost(Tokens {
            prompt,
            cached: 0,
            completion: max_completion,
        })
    }

    /// What `t` costs, rounded up to a whole micro-unit.
    pub fn cost(&self, t: Tokens) -> Micros {
        let cached = t.cached.min(t.prompt);
        let p = &self.prices;
        let total = i128::from(t.prompt - cached) * i128::from(p.input)
            + i128::from(cached) * i128::from(p.cached_input.min(p.input))
            + i128::from(t.completion) * i128::from(p.output);
        let micros = (total + PER_TOKENS - 1) / PER_TOKENS;
        i64::try_from(micros).unwrap_or(i64::MAX)
    }

    /// Divides `cost`: the fee (rounded down) goes to the treasury, the
    /// provider gets the rest times its payout multiplier (rounded down),
    /// and the treasury makes up any difference, so the parts always sum to
    /// the cost.
    pub fn split(&self, cost: Micros) -> Split {
        let c = i128::from(cost);
        let fee = c * i128::from(self.fee_bps) / i128::from(BPS + self.fee_bps);
        let provider = (c - fee) * i128::from(self.payout_bps) / i128::from(BPS);
        let provider = i64::try_from(provider).unwrap_or(0);
        Split {
            cost,
            provider,
            treasury: cost - provider,
        }
    }
}

/// The most a price may be (micro-units per million tokens): 1,000 units
/// per million tokens, far above any real model's price.
pub const MAX_PRICE: Micros = 1_000 * MICROS_PER_UNIT;

/// What `tokens_per_s` tokens a second for `secs` seconds cost at `price`
/// per million tokens, rounded up; `None` past `i64`.
pub fn capacity_cost(price: Micros, tokens_per_s: u64, secs: i64) -> Option<Micros> {
    let total = i128::from(price) * i128::from(tokens_per_s) * i128::from(secs.max(0));
    i64::try_from((total + PER_TOKENS - 1) / PER_TOKENS).ok()
}

/// Divides `cost` with a fee of `fee_bps` inside it: the fee (rounded
/// down) to the treasury, the rest to the provider.
pub fn split_fee(cost: Micros, fee_bps: i64) -> Split {
    let fee = i128::from(cost) * i128::from(fee_bps) / i128::from(BPS + fee_bps);
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
        assert_eq!(parse_units("12"), Ok(12_000_000));
        assert_eq!(parse_units("0.5"), Ok(500_000));
        assert_eq!(parse_units("-1.000001"), Ok(-1_000_001));
        for bad in [
            "",
            "1.2345678",
            "1e3",
            "abc",
            ".5",
            "1.",
            "99999999999999999",
        ] {
            assert!(parse_units(bad).is_err(), "{bad}");
        }
        assert_eq!(format_units(-1_250_000), "-1.250000");
        assert_eq!(format_units(7), "0.000007");
    }

    #[test]
    fn costs_round_up_and_never_exceed_the_worst_case() {
        let q = quote(500, BPS);
        // 1 token of input at 0.1 micro-units: rounds up to 1.
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
    fn splits_always_sum_to_the_cost() {
        for (fee, payout) in [(500, BPS), (1000, 5_000), (700, 24_000), (0, BPS)] {
            let q = quote(fee, payout);
            for cost in [0, 1, 7, 999, 1_000_003, 123_456_789] {
                let s = q.split(cost);
                assert_eq!(s.provider + s.treasury, cost);
                assert!(s.provider >= 0);
            }
        }
        // A 5% fee on top of the provider's price: 105 -> 100 + 5.
        let s = quote(500, BPS).split(105);
        assert_eq!((s.provider, s.treasury), (100, 5));
    }
}
