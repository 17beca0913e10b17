//! The pricing engine (pure integer arithmetic). A provider's cost per
//! hour is its power draw x PUE x the electricity price of its region, plus
//! hardware depreciation and network per hour; divided by the tokens it
//! serves per hour it gives a base price per token, separately for input
//! (prefill), output (decode) and cached input. Demand (utilization and
//! queue depth) multiplies it by 0.5-2.0, preemptible capacity gets a
//! discount, and the protocol fee goes on top. Pay: a provider's share of
//! what its user paid net of the fee, cut (never raised) by a reputation
//! under 1.0.

use serde::{Deserialize, Serialize};

use crate::ledger::amount::{Amount, BPS, MAX_AMOUNT, MAX_PRICE, Prices, TICKS_PER_UNIT};

/// Upper bounds of a cost profile's inputs: a 10 MW site, a PUE of 5,
/// and hourly costs within one operation's money bound.
const MAX_WATTS: i64 = 10_000_000;
const MAX_PUE_MILLI: i64 = 5_000;
/// The dearest electricity a region may have: 100 units per kWh.
pub const MAX_MICROS_PER_KWH: i64 = 100_000_000;

/// Lowest and highest demand multiplier, in basis points.
pub const DEMAND_MIN_BPS: i64 = 5_000;
pub const DEMAND_MAX_BPS: i64 = 20_000;
/// Allowed protocol fee, in basis points.
pub const FEE_MIN_BPS: i64 = 500;
pub const FEE_MAX_BPS: i64 = 1_000;

/// What a provider's capacity costs and how fast it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CostProfile {
    /// Electricity region (a key of the region price table).
    pub region: String,
    /// Power draw under load, in watts.
    pub watts: i64,
    /// Power usage effectiveness x 1000 (1200 = 1.2).
    pub pue_milli: i64,
    /// Hardware depreciation per hour.
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub depreciation_per_hour: Amount,
    /// Network cost per hour.
    #[serde(with = "crate::ledger::units")]
    #[schema(value_type = String, example = "12.50")]
    pub network_per_hour: Amount,
    /// Measured prompt tokens per hour (prefill).
    pub prefill_tokens_per_hour: i64,
    /// Measured generated tokens per hour (decode).
    pub decode_tokens_per_hour: i64,
    /// Price of a cached prompt token as a fraction of an input token (bps).
    pub cached_bps: i64,
    /// Discount on preemptible (interruptible) capacity (bps).
    pub preemptible_discount_bps: i64,
}

impl CostProfile {
    /// Checks the profile's ranges; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let positive = [
            ("watts", self.watts),
            ("pue_milli", self.pue_milli),
            ("prefill_tokens_per_hour", self.prefill_tokens_per_hour),
            ("decode_tokens_per_hour", self.decode_tokens_per_hour),
        ];
        for (field, v) in positive {
            if v <= 0 {
                return Err((field, format!("{field} must be positive")));
            }
        }
        if self.pue_milli < 1000 {
            return Err(("pue_milli", "PUE is at least 1 (1000)".into()));
        }
        let bps = [
            ("cached_bps", self.cached_bps),
            ("preemptible_discount_bps", self.preemptible_discount_bps),
        ];
        for (field, v) in bps {
            if !(0..=BPS).contains(&v) {
                return Err((field, format!("{field} is between 0 and 10000")));
            }
        }
        let bounded = [
            ("watts", self.watts, MAX_WATTS),
            ("pue_milli", self.pue_milli, MAX_PUE_MILLI),
            (
                "depreciation_per_hour",
                self.depreciation_per_hour,
                MAX_AMOUNT,
            ),
            ("network_per_hour", self.network_per_hour, MAX_AMOUNT),
        ];
        for (field, v, max) in bounded {
            if !(0..=max).contains(&v) {
                return Err((field, format!("{field} is between 0 and {max}")));
            }
        }
        Ok(())
    }

    /// Cost of one hour of this capacity, in ticks (the electricity price
    /// is in micro-units per kWh).
    pub fn hourly_cost(&self, micros_per_kwh: i64) -> Amount {
        let ticks_per_micro = i128::from(TICKS_PER_UNIT / 1_000_000);
        let energy = i128::from(self.watts)
            * i128::from(self.pue_milli)
            * i128::from(micros_per_kwh)
            * ticks_per_micro
            / 1_000_000;
        let total =
            energy + i128::from(self.depreciation_per_hour) + i128::from(self.network_per_hour);
        i64::try_from(total).unwrap_or(i64::MAX)
    }
}

/// How busy the provider is right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Occupancy {
    pub running: u64,
    pub waiting: u64,
    /// Sequences it runs at once (utilization = running / capacity).
    pub capacity: u64,
}

/// The demand multiplier: 0.5 when idle, rising with utilization to 1.5
/// when full, and with the queue up to 2.0 (basis points).
pub fn demand_bps(load: Occupancy) -> i64 {
    let cap = i128::from(load.capacity.max(1));
    let m = i128::from(DEMAND_MIN_BPS)
        + i128::from(BPS) * i128::from(load.running) / cap
        + i128::from(BPS / 2) * i128::from(load.waiting) / cap;
    i64::try_from(m)
        .unwrap_or(DEMAND_MAX_BPS)
        .clamp(DEMAND_MIN_BPS, DEMAND_MAX_BPS)
}

/// `x * num / den`, rounded up, at least 1.
fn scale_up(x: i128, num: i128, den: i128) -> i128 {
    ((x * num + den - 1) / den).max(1)
}

/// The prices a user pays (fee included), per million tokens.
pub fn prices(
    profile: &CostProfile,
    micros_per_kwh: i64,
    load: Occupancy,
    fee_bps: i64,
    preemptible: bool,
) -> Prices {
    let hourly = i128::from(profile.hourly_cost(micros_per_kwh));
    let per_million =
        |tokens_per_hour: i64| scale_up(hourly, 1_000_000, i128::from(tokens_per_hour.max(1)));
    let mut factor_num = i128::from(demand_bps(load)) * i128::from(BPS + fee_bps);
    if preemptible {
        factor_num =
            factor_num * i128::from(BPS - profile.preemptible_discount_bps) / i128::from(BPS);
    }
    let factor_den = i128::from(BPS) * i128::from(BPS);
    // A price never passes MAX_PRICE, however odd the profile: requests
    // and the market's band stay within bounds.
    let price = |base: i128| {
        i64::try_from(scale_up(base, factor_num, factor_den))
            .unwrap_or(MAX_PRICE)
            .min(MAX_PRICE)
    };
    let input = price(per_million(profile.prefill_tokens_per_hour));
    let output = price(per_million(profile.decode_tokens_per_hour));
    let cached = i64::try_from(scale_up(
        i128::from(input),
        i128::from(profile.cached_bps),
        i128::from(BPS),
    ))
    .unwrap_or(input)
    .min(input);
    Prices {
        input,
        cached_input: cached,
        output,
    }
}

/// Prefill and decode tokens per hour that explain a measured window:
/// `prompt` and `generated` tokens took `busy_micros` of forward time,
/// assuming prefill is as many times faster per token than decode as the
/// profile says (`busy = prompt / P + generated / D`, `P / D` fixed).
/// `None` when the window says nothing (no time, no tokens).
pub fn measured_rates(
    profile: &CostProfile,
    prompt: u64,
    generated: u64,
    busy_micros: u64,
) -> Option<(i64, i64)> {
    let (p0, d0) = (
        i128::from(profile.prefill_tokens_per_hour.max(1)),
        i128::from(profile.decode_tokens_per_hour.max(1)),
    );
    if busy_micros == 0 || prompt + generated == 0 {
        return None;
    }
    let work = i128::from(prompt) * d0 + i128::from(generated) * p0;
    let decode = work * 3_600_000_000 / (p0 * i128::from(busy_micros));
    let prefill = decode * p0 / d0;
    Some((
        i64::try_from(prefill).ok()?.max(1),
        i64::try_from(decode).ok()?.max(1),
    ))
}

/// The share (bps) of its work's price, net of the fee, a provider is
/// paid: its reputation, from 0.5 up to 1.0 and never above, so pay never
/// exceeds what the user paid for that work less the protocol fee (a
/// provider who is also a user gains nothing by serving itself). A good
/// reputation and uptime earn placement, not a multiple of the user's
/// money; what a low reputation withholds stays with the treasury.
pub fn payout_bps(reputation_bps: i64) -> i64 {
    reputation_bps.clamp(DEMAND_MIN_BPS, BPS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> CostProfile {
        CostProfile {
            region: "us-east".into(),
            watts: 65,
            pue_milli: 1200,
            depreciation_per_hour: 200_000_000,
            network_per_hour: 50_000_000,
            prefill_tokens_per_hour: 3_240_000,
            decode_tokens_per_hour: 1_080_000,
            cached_bps: 1_000,
            preemptible_discount_bps: 3_000,
        }
    }

    #[test]
    fn hourly_cost_adds_energy_depreciation_and_network() {
        // 65 W x 1.2 x 0.13/kWh = 0.01014/h, + 0.02 + 0.005.
        assert_eq!(profile().hourly_cost(130_000), 101_400_000 + 250_000_000);
    }

    #[test]
    fn profiles_are_bounded_and_prices_never_pass_the_cap() {
        for (field, bad) in [
            (
                "watts",
                CostProfile {
                    watts: i64::MAX,
                    ..profile()
                },
            ),
            (
                "pue_milli",
                CostProfile {
                    pue_milli: i64::MAX,
                    ..profile()
                },
            ),
            (
                "depreciation_per_hour",
                CostProfile {
                    depreciation_per_hour: -1,
                    ..profile()
                },
            ),
            (
                "network_per_hour",
                CostProfile {
                    network_per_hour: i64::MAX,
                    ..profile()
                },
            ),
        ] {
            assert_eq!(bad.validate().map_err(|e| e.0), Err(field));
        }
        // The dearest valid profile, selling one token an hour, at full
        // demand: every price is capped, none wraps.
        let dear = CostProfile {
            watts: MAX_WATTS,
            pue_milli: MAX_PUE_MILLI,
            depreciation_per_hour: MAX_AMOUNT,
            network_per_hour: MAX_AMOUNT,
            prefill_tokens_per_hour: 1,
            decode_tokens_per_hour: 1,
            ..profile()
        };
        assert!(dear.validate().is_ok());
        let full = Occupancy {
            running: 16,
            waiting: u64::MAX / 4,
            capacity: 16,
        };
        for preemptible in [false, true] {
            let p = prices(&dear, MAX_MICROS_PER_KWH, full, 1_000, preemptible);
            assert_eq!((p.input, p.output), (MAX_PRICE, MAX_PRICE));
            assert!(p.cached_input <= MAX_PRICE);
        }
    }

    #[test]
    fn demand_moves_between_half_and_double() {
        let l = |running, waiting| Occupancy {
            running,
            waiting,
            capacity: 16,
        };
        assert_eq!(demand_bps(l(0, 0)), 5_000);
        assert_eq!(demand_bps(l(8, 0)), 10_000);
        assert_eq!(demand_bps(l(16, 0)), 15_000);
        assert_eq!(demand_bps(l(16, 16)), 20_000);
        assert_eq!(demand_bps(l(16, 1000)), 20_000);
        assert_eq!(demand_bps(Occupancy::default()), 5_000);
    }

    #[test]
    fn prices_follow_cost_demand_fee_and_preemption() {
        let p = profile();
        let busy = Occupancy {
            running: 8,
            waiting: 0,
            capacity: 16,
        };
        let at = |load, fee, pre| prices(&p, 130_000, load, fee, pre);
        let base = at(busy, 0, false);
        // 351,400,000 per hour / 1.08M tokens per hour = 325,370,370.4
        // per million.
        assert_eq!(base.output, 325_370_371);
        assert_eq!(base.input, 108_456_791);
        assert_eq!(base.cached_input, 10_845_680);
        let fee = at(busy, 500, false);
        assert_eq!(fee.output, (325_370_371 * 105 + 99) / 100);
        assert!(
            at(
                Occupancy {
                    running: 0,
                    waiting: 0,
                    capacity: 16
                },
                500,
                false
            )
            .output
                < fee.output
        );
        assert!(at(busy, 500, true).output < fee.output);
        assert!(
            prices(&p, 250_000, busy, 500, false).output > fee.output,
            "dearer power"
        );
    }

    /// The house's idle prices (the cheapest it sells at) make the
    /// smallest bills; even there a short request's cost is rounded by
    /// under 0.1% and its fee is never rounded away.
    #[test]
    fn a_short_request_is_billed_within_a_thousandth_of_its_exact_cost() {
        let idle = prices(
            &profile(),
            130_000,
            Occupancy::default(),
            FEE_MIN_BPS,
            false,
        );
        let quote = crate::ledger::Quote {
            provider_id: "provider:house".into(),
            model: "m".into(),
            prices: idle,
            fee_bps: FEE_MIN_BPS,
            payout_bps: BPS,
            stages: crate::ledger::amount::Stages::default(),
        };
        for (prompt, cached, completion) in [(10, 0, 8), (0, 0, 18), (18, 0, 0), (9, 9, 9)] {
            let t = crate::ledger::Tokens {
                prompt,
                cached,
                completion,
            };
            let exact = ((prompt - cached) as f64 * idle.input as f64
                + cached as f64 * idle.cached_input as f64
                + completion as f64 * idle.output as f64)
                / 1e6;
            let cost = quote.cost(t);
            assert!(cost as f64 >= exact, "{t:?}: {cost} < {exact}");
            assert!(
                (cost as f64 - exact) / exact < 1e-3,
                "{t:?}: {cost} vs {exact}"
            );
            assert!(quote.split(cost).treasury > 0, "{t:?}: fee rounded away");
        }
    }

    #[test]
    fn pay_is_cut_by_a_poor_reputation_and_never_raised() {
        assert_eq!(payout_bps(BPS), BPS);
        assert_eq!(payout_bps(20_000), BPS);
        assert_eq!(payout_bps(99_999), BPS);
        assert_eq!(payout_bps(7_000), 7_000);
        assert_eq!(payout_bps(0), 5_000);
    }

    #[test]
    fn measured_rates_explain_the_window_with_the_profile_ratio() {
        let p = profile(); // prefill 3x decode
        // 300 decode tokens/s and 900 prefill tokens/s: 900 prompt and 600
        // generated tokens take 1 + 2 = 3 s.
        let (pre, dec) = measured_rates(&p, 900, 600, 3_000_000).expect("rates");
        assert_eq!((pre, dec), (3_240_000, 1_080_000));
        // Twice as slow: rates halve.
        assert_eq!(
            measured_rates(&p, 900, 600, 6_000_000),
            Some((1_620_000, 540_000))
        );
        assert_eq!(measured_rates(&p, 0, 0, 1_000), None);
        assert_eq!(measured_rates(&p, 10, 10, 0), None);
    }

    #[test]
    fn profiles_are_validated() {
        assert!(profile().validate().is_ok());
        let bad = CostProfile {
            pue_milli: 900,
            ..profile()
        };
        assert_eq!(bad.validate().map_err(|e| e.0), Err("pue_milli"));
        let bad = CostProfile {
            decode_tokens_per_hour: 0,
            ..profile()
        };
        assert_eq!(
            bad.validate().map_err(|e| e.0),
            Err("decode_tokens_per_hour")
        );
    }
}
