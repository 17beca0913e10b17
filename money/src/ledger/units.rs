//! Amounts as people read and type them: every amount in an API body is a
//! decimal string of currency units (`"12.50"`, `"0.0000001234"`), exact
//! to the tick, while the ledger keeps `i64` ticks inside. Use it as
//! `#[serde(with = "units")]` (or `units::opt` for an `Option`).
//!
//! A bare JSON number is refused, with a message that names the unit: a
//! client written when amounts were ticks (10^-10 of a unit) would
//! otherwise move 10^10 times what it meant. Prices are the same strings,
//! per million tokens; electricity prices are units per kWh to the
//! micro-unit (`units::micros`).

use std::fmt;

use serde::{Deserializer, Serializer, de};

pub use super::amount::show_units as show;
use super::amount::{Amount, TICKS_PER_UNIT, parse_units};

/// Why a number is refused where an amount is expected.
const BARE: &str = "amounts are decimal strings of currency units, like \"12.50\" or \
                    \"0.0004\"; a bare number is refused (it was read as ticks, 10^-10 of a \
                    unit, before)";

/// Serializes ticks as a units string.
pub fn serialize<S: Serializer>(a: &Amount, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&show(*a))
}

/// Reads a units string into ticks; refuses numbers (`BARE`).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Amount, D::Error> {
    d.deserialize_any(UnitsVisitor)
}

struct UnitsVisitor;

impl de::Visitor<'_> for UnitsVisitor {
    type Value = Amount;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a decimal string of currency units, like \"12.50\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Amount, E> {
        parse_units(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Amount, E> {
        Err(E::custom(BARE))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Amount, E> {
        Err(E::custom(BARE))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Amount, E> {
        Err(E::custom(BARE))
    }
}

/// `Option<Amount>` as an optional units string (`null` is `None`).
pub mod opt {
    use super::*;

    pub fn serialize<S: Serializer>(a: &Option<Amount>, s: S) -> Result<S::Ok, S::Error> {
        match a {
            Some(a) => s.serialize_str(&show(*a)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Amount>, D::Error> {
        d.deserialize_option(OptVisitor)
    }

    struct OptVisitor;

    impl<'de> de::Visitor<'de> for OptVisitor {
        type Value = Option<Amount>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("null or a decimal string of currency units")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

/// Micro-units (electricity prices per kWh) as a units string with at
/// most six decimals.
pub mod micros {
    use super::*;

    /// Ticks in a micro-unit.
    const TICKS_PER_MICRO: i64 = TICKS_PER_UNIT / 1_000_000;

    /// `m` micro-units as a units string.
    pub fn show(m: i64) -> String {
        super::show(m.saturating_mul(TICKS_PER_MICRO))
    }

    pub fn serialize<S: Serializer>(m: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&show(*m))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let ticks = super::deserialize(d)?;
        if ticks % TICKS_PER_MICRO != 0 {
            return Err(de::Error::custom(
                "a price per kWh has at most 6 decimals (micro-units)",
            ));
        }
        Ok(ticks / TICKS_PER_MICRO)
    }
}

/// A map of amounts (a transaction's entries by account) as units strings.
pub mod map {
    use super::*;
    use serde::ser::SerializeMap;
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(m: &BTreeMap<String, Amount>, s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_map(Some(m.len()))?;
        for (k, v) in m {
            out.serialize_entry(k, &show(*v))?;
        }
        out.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Body {
        #[serde(with = "super")]
        amount: Amount,
        #[serde(default, with = "opt", skip_serializing_if = "Option::is_none")]
        budget: Option<Amount>,
        #[serde(default, with = "micros")]
        kwh: i64,
    }

    #[test]
    fn amounts_show_as_units_with_cents_and_every_tick() {
        assert_eq!(show(25 * TICKS_PER_UNIT), "25.00");
        assert_eq!(show(TICKS_PER_UNIT / 2), "0.50");
        assert_eq!(show(1_234), "0.0000001234");
        assert_eq!(show(-31 * TICKS_PER_UNIT / 10), "-3.10");
        assert_eq!(show(249_999_995_124), "24.9999995124");
        assert_eq!(show(0), "0.00");
    }

    #[test]
    fn units_strings_round_trip_and_bare_numbers_are_refused_with_the_unit() {
        let b: Body =
            serde_json::from_str(r#"{"amount": "12.5", "budget": "0.0004", "kwh": "0.12"}"#)
                .expect("parses");
        assert_eq!(b.amount, 125 * TICKS_PER_UNIT / 10);
        assert_eq!(b.budget, Some(4 * TICKS_PER_UNIT / 10_000));
        assert_eq!(b.kwh, 120_000);
        let back = serde_json::to_string(&b).expect("writes");
        assert_eq!(back, r#"{"amount":"12.50","budget":"0.0004","kwh":"0.12"}"#);
        for bare in [
            r#"{"amount": 5000000}"#,
            r#"{"amount": 2.5}"#,
            r#"{"amount": "1", "budget": 7}"#,
        ] {
            let e = serde_json::from_str::<Body>(bare)
                .expect_err(bare)
                .to_string();
            assert!(e.contains("decimal strings of currency units"), "{e}");
        }
        let e = serde_json::from_str::<Body>(r#"{"amount": "1", "kwh": "0.0000001"}"#)
            .expect_err("7 decimals");
        assert!(e.to_string().contains("6 decimals"), "{e}");
        let none: Body = serde_json::from_str(r#"{"amount": "1", "budget": null}"#).expect("null");
        assert_eq!(none.budget, None);
        assert!(serde_json::from_str::<Body>(r#"{"amount": "1.2.3"}"#).is_err());
    }
}
