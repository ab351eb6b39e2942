//! Gateway API durations (GEP-2257): one to four components, each one to five decimal
//! digits and a unit of `h`, `m`, `s` or `ms`, read as Go's `time.ParseDuration` reads
//! them (components add up, in any order, a unit may repeat): `1h30m`, `500ms`, `0s`.

use std::time::Duration;

/// Reads a GEP-2257 duration.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!("{s:?} is not a Gateway API duration ({why}); write 1 to 4 parts of up to 5 digits and a unit h, m, s or ms, like 10s, 1m30s or 500ms")
    };
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut parts = 0;
    let mut total = Duration::ZERO;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() {
            return Err(bad("a part has no number"));
        }
        if digits.len() > 5 {
            return Err(bad("a number has more than 5 digits"));
        }
        let unit_start = i;
        while i < bytes.len() && !bytes[i].is_ascii_digit() {
            i += 1;
        }
        let n: u64 = digits.parse().map_err(|_| bad("not a number"))?;
        let part = match &s[unit_start..i] {
            "h" => Duration::from_secs(n * 3600),
            "m" => Duration::from_secs(n * 60),
            "s" => Duration::from_secs(n),
            "ms" => Duration::from_millis(n),
            "" => return Err(bad("a number has no unit")),
            _ => return Err(bad("unknown unit")),
        };
        parts += 1;
        if parts > 4 {
            return Err(bad("more than 4 parts"));
        }
        total += part;
    }
    if parts == 0 {
        return Err(bad("empty"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_gep_examples() {
        let table = [
            ("0s", 0),
            ("1h", 3_600_000),
            ("5m", 300_000),
            ("1h5m", 3_900_000),
            ("1h30m30s500ms", 5_430_500),
            ("60m", 3_600_000),
            ("01h", 3_600_000),
            ("00060m", 3_600_000),
            ("500ms", 500),
            // As Go reads them: any order, a unit again adds up.
            ("1s1h", 3_601_000),
            ("1s1s", 2_000),
            (
                "99999h99999m99999s99999ms",
                99_999 * 3_600_000 + 99_999 * 60_000 + 99_999_000 + 99_999,
            ),
        ];
        for (text, ms) in table {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_what_the_pattern_refuses() {
        for bad in [
            "",
            "1",
            "s",
            "1.5s",
            "-1s",
            "1us",
            "1ns",
            "1d",
            "100000s",
            "1h1m1s1ms1h",
            " 1s",
            "1s ",
            "1S",
            "1m s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
