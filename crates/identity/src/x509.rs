//! Small read-only views of X.509 certificates (x509-parser underneath).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::CertificateDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

/// Parses a DER certificate, refusing trailing bytes.
pub(crate) fn parse<'a>(der: &'a [u8]) -> Result<X509Certificate<'a>, String> {
    match x509_parser::parse_x509_certificate(der) {
        Ok((rest, _)) if !rest.is_empty() => Err(format!(
            "{} unexpected bytes after the certificate",
            rest.len()
        )),
        Ok((_, cert)) => Ok(cert),
        Err(e) => Err(e.to_string()),
    }
}

/// All URI SANs of a certificate, in order (none when the extension is absent or invalid).
pub(crate) fn uri_sans<'a>(cert: &X509Certificate<'a>) -> Vec<&'a str> {
    match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::URI(u) => Some(*u),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// `(not_before, not_after)` of a certificate.
pub(crate) fn validity(cert: &X509Certificate<'_>) -> (SystemTime, SystemTime) {
    let v = cert.validity();
    (
        from_unix(v.not_before.timestamp()),
        from_unix(v.not_after.timestamp()),
    )
}

/// Same as [`validity`] for a DER certificate.
pub(crate) fn validity_of(der: &CertificateDer<'_>) -> Result<(SystemTime, SystemTime), String> {
    parse(der).map(|c| validity(&c))
}

fn from_unix(secs: i64) -> SystemTime {
    let magnitude = Duration::from_secs(secs.unsigned_abs());
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(magnitude)
    } else {
        UNIX_EPOCH.checked_sub(magnitude)
    };
    t.unwrap_or(UNIX_EPOCH)
}

/// Formats a time as RFC 3339 in UTC (empty when out of range).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix_secs(t)).ok();
    t.and_then(|t| {
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
    .unwrap_or_default()
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// Converts to the `time` crate's type, clamped to what certificates can carry.
pub(crate) fn to_offset(t: SystemTime) -> time::OffsetDateTime {
    // 9999-12-31T23:59:59Z is the latest GeneralizedTime; 1950 the earliest UTCTime.
    let secs = unix_secs(t).clamp(-631_152_000, 253_402_300_799);
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_helpers() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
        assert_eq!(from_unix(1_700_000_000), t);
        assert_eq!(to_offset(t).unix_timestamp(), 1_700_000_000);
        assert_eq!(from_unix(-10), UNIX_EPOCH - Duration::from_secs(10));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse(b"").is_err());
        assert!(parse(b"\x30\x03\x02\x01").is_err());
        assert!(parse(&[0xffu8; 64]).is_err());
    }
}
