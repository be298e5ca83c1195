//! Duration strings such as `"200ms"`, `"60s"`, `"1h30m"` or `"2.5s"`.
//!
//! The reference control plane parses these with the `duration-string`
//! crate: integer amounts with the units `ns`, `us`, `ms`, `s`, `m`, `h`,
//! `d`, `w`, `y`, several of them in a row, whitespace ignored. This parser
//! accepts all of that (so reference configs load unchanged) and also
//! decimals (`2.5s`), `µs`, and a bare `0`. It is small enough that a new
//! dependency is not worth it.

use std::fmt;
use std::time::Duration;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// Shown in every error so the operator sees the expected shape at once.
const EXAMPLES: &str = "examples: 200ms, 60s, 5m";

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Nanoseconds per unit; `y` is the reference's 365.2422-day year.
fn unit_nanos(unit: &str) -> Option<u128> {
    let secs = |s: u128| s * NANOS_PER_SEC;
    Some(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3_600),
        "d" => secs(86_400),
        "w" => secs(604_800),
        "y" => secs(31_556_926),
        _ => return None,
    })
}

/// Parses a duration string. The error is phrased for an operator and
/// does not name the key (the caller knows it).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration ({EXAMPLES})");
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    if compact == "0" {
        return Ok(Duration::ZERO);
    }
    if compact.is_empty() {
        return Err(bad());
    }
    let mut total: u128 = 0;
    let mut rest = compact.as_str();
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let per_unit = unit_nanos(unit).ok_or_else(bad)?;
        let part = scaled(number, per_unit).ok_or_else(bad)?;
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = tail;
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| bad())?;
    // The remainder is below 10^9, so it always fits.
    let nanos = u32::try_from(total % NANOS_PER_SEC).map_err(|_| bad())?;
    Ok(Duration::new(secs, nanos))
}

/// `number` (digits with at most one '.') times `per_unit` nanoseconds;
/// fractions finer than a nanosecond are truncated.
fn scaled(number: &str, per_unit: u128) -> Option<u128> {
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if !digits(whole) || !digits(frac) {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    // More than 18 fractional digits cannot matter at nanosecond precision
    // for any unit up to a year, and would overflow the arithmetic below.
    let frac = &frac[..frac.len().min(18)];
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(u32::try_from(frac.len()).ok()?);
    let whole_part = whole.checked_mul(per_unit)?;
    whole_part.checked_add(frac_value.checked_mul(per_unit)? / scale)
}

/// `deserialize_with` helper: reads a duration string, failing with a
/// message that shows the offending value and some examples.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    deserializer.deserialize_any(DurationVisitor)
}

struct DurationVisitor;

impl DurationVisitor {
    /// A number without a unit is the most likely mistake; say so.
    fn no_unit<E: de::Error>(value: impl fmt::Display) -> E {
        E::custom(format!(
            "{value} is not a duration: add a unit ({EXAMPLES})"
        ))
    }
}

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a duration string ({EXAMPLES})")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        if v == 0 {
            return Ok(Duration::ZERO);
        }
        Err(Self::no_unit(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        Err(Self::no_unit(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        Err(Self::no_unit(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        parse_duration(text).unwrap()
    }

    #[test]
    fn reference_forms() {
        assert_eq!(ok("200ms"), Duration::from_millis(200));
        assert_eq!(ok("60s"), Duration::from_secs(60));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("1h30m"), Duration::from_secs(5_400));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("1d"), Duration::from_secs(86_400));
        assert_eq!(ok("2w"), Duration::from_secs(2 * 604_800));
        assert_eq!(ok("1y"), Duration::from_secs(31_556_926));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        // duration-string ignores whitespace anywhere.
        assert_eq!(ok(" 1h 30m "), Duration::from_secs(5_400));
    }

    #[test]
    fn extensions() {
        assert_eq!(ok("2.5s"), Duration::from_millis(2_500));
        assert_eq!(ok("0.5m"), Duration::from_secs(30));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.5ms"), Duration::from_micros(1_500));
        assert_eq!(ok("3µs"), Duration::from_micros(3));
        assert_eq!(ok("0"), Duration::ZERO);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "fast",
            "10",
            "s",
            "1.2.3s",
            "5 minutes",
            "-1s",
            "1x",
            ".s",
            "1e3s",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("is not a duration"), "{bad}: {err}");
            assert!(err.contains("200ms"), "{err}");
        }
    }

    #[test]
    fn rejects_overflow() {
        assert!(parse_duration("99999999999999999999999y").is_err());
        assert!(parse_duration("600000000000y").is_err());
    }
}
