//! Durations as Kubernetes checks Istio's duration fields (its CEL `duration()`, which reads
//! them as Go's `time.ParseDuration` does): one or more parts, each a decimal number (a
//! fraction allowed) and a unit of `h`, `m`, `s`, `ms`, `us` (or `µs`) or `ns`: `5s`,
//! `1.5s`, `1m30s`, `250ms`. Not negative, and at most Go's longest (about 292 years).

use std::time::Duration;

/// Go's longest duration, in nanoseconds (`i64::MAX`).
const MAX_NANOS: u128 = i64::MAX as u128;

/// Fraction digits read; Go's reading drops what lies beyond a nanosecond too.
const MAX_FRACTION_DIGITS: usize = 18;

/// Reads a duration.
pub(crate) fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!("{s:?} is not a duration ({why}); write numbers with a unit h, m, s, ms, us or ns, like 5s, 1.5s, 1m30s or 250ms")
    };
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.starts_with('-') {
        return Err(bad("negative"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let digits = |t: &str| t.bytes().take_while(u8::is_ascii_digit).count();
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (whole, after) = rest.split_at(digits(rest));
        let (fraction, after) = match after.strip_prefix('.') {
            Some(f) => f.split_at(digits(f)),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(bad("a part has no number"));
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let per: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad("a number has no unit")),
            _ => return Err(bad("unknown unit")),
        };
        let too_long = || bad("longer than Go's longest duration");
        let whole: u128 = match whole {
            "" => 0,
            w => w.parse().map_err(|_| too_long())?,
        };
        let (mut numerator, mut scale) = (0u128, 1u128);
        for d in fraction.bytes().take(MAX_FRACTION_DIGITS) {
            numerator = numerator * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        total = whole
            .checked_mul(per)
            .and_then(|n| n.checked_add(per * numerator / scale))
            .and_then(|n| n.checked_add(total))
            .filter(|n| *n <= MAX_NANOS)
            .ok_or_else(too_long)?;
        rest = after;
    }
    // Within u64: MAX_NANOS is i64::MAX.
    Ok(Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_go_durations() {
        let table = [
            ("5s", 5_000_000_000),
            ("+5s", 5_000_000_000),
            ("0", 0),
            ("0s", 0),
            ("1.5s", 1_500_000_000),
            (".5s", 500_000_000),
            ("1.s", 1_000_000_000),
            ("250ms", 250_000_000),
            ("1m30s", 90_000_000_000),
            ("1h1m1s1ms1us1ns", 3_661_001_001_001),
            ("1s1s", 2_000_000_000),
            ("2\u{b5}s", 2_000),
            ("2\u{3bc}s", 2_000),
            ("1.0000000001s", 1_000_000_000),
            ("2562047h47m16.854775807s", i64::MAX as u64),
        ];
        for (text, nanos) in table {
            assert_eq!(
                parse_go_duration(text),
                Ok(Duration::from_nanos(nanos)),
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_what_go_refuses() {
        for bad in [
            "",
            "5",
            "s",
            ".s",
            "-1s",
            "1d",
            "1S",
            " 1s",
            "1s ",
            "1 s",
            "1..5s",
            "2562047h47m16.854775808s",
            "99999999999999999999999999999999999999999h",
        ] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_go_duration("5sec"),
            Err("\"5sec\" is not a duration (unknown unit); write numbers with a unit h, m, s, ms, us or ns, like 5s, 1.5s, 1m30s or 250ms".into())
        );
    }
}
