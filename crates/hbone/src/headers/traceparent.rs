//! The `traceparent` header (W3C trace context): `00-<trace id>-<parent id>-<flags>`.

use std::fmt;
use std::str::FromStr;

use crate::error::HeaderError;
use crate::headers::excerpt;

/// A W3C trace context parent. HBONE clients send a random one per outbound connection with
/// flags `00`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// 128-bit trace id (never zero when valid).
    pub trace_id: u128,
    /// 64-bit parent span id (never zero when valid).
    pub parent_id: u64,
}

impl TraceParent {
    /// A random trace context (non-zero ids).
    pub fn random() -> TraceParent {
        TraceParent {
            trace_id: rand::random::<u128>().max(1),
            parent_id: rand::random::<u64>().max(1),
        }
    }

    /// Parses `version-traceid-parentid-flags`. Version `00` must be exactly 55 bytes; a later
    /// version may carry more fields after a `-`. Version `ff`, all-zero ids and non-hex
    /// characters are rejected. Hex may be in either case.
    pub fn parse(s: &str) -> Result<TraceParent, HeaderError> {
        let err = || HeaderError::InvalidTraceParent(excerpt(s));
        let b = s.trim().as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(err());
        }
        let version = hex(&b[0..2]).ok_or_else(err)?;
        if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return Err(err());
        }
        let trace_id = hex(&b[3..35]).ok_or_else(err)?;
        let parent_id = hex(&b[36..52]).ok_or_else(err)?;
        hex(&b[53..55]).ok_or_else(err)?;
        if trace_id == 0 || parent_id == 0 {
            return Err(err());
        }
        Ok(TraceParent {
            trace_id,
            parent_id: u64::try_from(parent_id).map_err(|_| err())?,
        })
    }
}

/// Decodes up to 32 hex digits; `None` on any other byte.
fn hex(b: &[u8]) -> Option<u128> {
    if b.is_empty() || b.len() > 32 {
        return None;
    }
    b.iter().try_fold(0u128, |acc, &c| {
        let d = char::from(c).to_digit(16)?;
        Some((acc << 4) | u128::from(d))
    })
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{:032x}-{:016x}-00", self.trace_id, self.parent_id)
    }
}

impl FromStr for TraceParent {
    type Err = HeaderError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceParent::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format() {
        let t = TraceParent {
            trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736,
            parent_id: 0x00f067aa0ba902b7,
        };
        assert_eq!(
            t.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
        let small = TraceParent {
            trace_id: 1,
            parent_id: 2,
        };
        assert_eq!(
            small.to_string(),
            "00-00000000000000000000000000000001-0000000000000002-00"
        );
    }

    #[test]
    fn random_is_valid_and_round_trips() {
        for _ in 0..100 {
            let t = TraceParent::random();
            let s = t.to_string();
            assert_eq!(s.len(), 55);
            assert!(http::HeaderValue::from_str(&s).is_ok());
            assert_eq!(TraceParent::parse(&s).unwrap(), t);
        }
        assert_ne!(TraceParent::random(), TraceParent::random());
    }

    #[test]
    fn parse_variants() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(TraceParent::parse(ok).is_ok());
        assert!(TraceParent::parse(&ok.to_uppercase()).is_ok());
        assert!(TraceParent::parse(&format!(" {ok} ")).is_ok());
        // A future version may append fields.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_ok()
        );
    }

    #[test]
    fn parse_rejects() {
        for s in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "ééééééééééééééééééééééééééééééééééééééééééééééééééééééééé",
        ] {
            assert!(TraceParent::parse(s).is_err(), "{s:?}");
        }
    }
}
