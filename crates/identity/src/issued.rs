//! What a certificate from an [`crate::Issuer`] must be before the cache serves it. Sans-IO:
//! the caller passes "now" (the manager's clock).
//!
//! In order, each failure naming its cause: for the identity asked for; a leaf, not a CA;
//! inside its validity (a not-before up to [`NOT_BEFORE_ALLOWANCE`] ahead is accepted, so
//! a node whose clock trails the CA's by a few seconds keeps working); and signed, through
//! the intermediates sent with it, by one of the roots sent with it (the WebPKI check a
//! client makes of our HBONE server, serverAuth usage and every link's validity included:
//! a leaf failing it for any reason is `does_not_chain`, its reason in the message).

use std::time::{Duration, SystemTime};

use rustls::pki_types::UnixTime;
use rustls::server::ParsedCertificate;
use rustls::RootCertStore;

use crate::cert::WorkloadCertificate;
use crate::error::IssueError;
use crate::spiffe::SpiffeId;
use crate::x509;

/// How far a leaf's not-before may lie ahead of this node's clock: a CA that does not
/// backdate, on a clock slightly ahead of ours, would otherwise be refused forever.
pub(crate) const NOT_BEFORE_ALLOWANCE: Duration = Duration::from_secs(60);

/// Checks `cert`, just returned for `requested`, at `now`.
pub(crate) fn check(
    requested: &SpiffeId,
    cert: &WorkloadCertificate,
    now: SystemTime,
) -> Result<(), IssueError> {
    // Issuers check this too; a certificate for another identity is never cached.
    if cert.identity != *requested {
        return Err(IssueError::WrongIdentity {
            expected: requested.to_string(),
            found: cert.identity.to_string(),
        });
    }
    let bad = |reason: String| IssueError::BadChain { reason };
    let Some(leaf) = cert.chain.first() else {
        return Err(bad("the chain is empty".into()));
    };
    let parsed = x509::parse(leaf).map_err(|e| bad(format!("the leaf cannot be parsed: {e}")))?;
    match parsed.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => {
            return Err(IssueError::CaLeaf {
                reason: "basicConstraints says CA:TRUE",
            })
        }
        Ok(_) => {}
        Err(e) => return Err(bad(format!("the leaf's basicConstraints is invalid: {e}"))),
    }
    match parsed.key_usage() {
        Ok(Some(ku)) if ku.value.key_cert_sign() => {
            return Err(IssueError::CaLeaf {
                reason: "keyUsage includes keyCertSign",
            })
        }
        Ok(_) => {}
        Err(e) => return Err(bad(format!("the leaf's keyUsage is invalid: {e}"))),
    }
    let (not_before, not_after) = (cert.not_before, cert.not_after);
    if now >= not_after {
        return Err(IssueError::Expired {
            not_after,
            by: now.duration_since(not_after).unwrap_or_default(),
        });
    }
    if let Ok(by) = not_before.duration_since(now) {
        if by > NOT_BEFORE_ALLOWANCE {
            return Err(IssueError::NotYetValid { not_before, by });
        }
    }
    let mut roots = RootCertStore::empty();
    for (index, root) in cert.roots.iter().enumerate() {
        roots
            .add(root.clone())
            .map_err(|e| bad(format!("root #{index} is not a usable trust anchor: {e}")))?;
    }
    let end_entity = ParsedCertificate::try_from(leaf)
        .map_err(|e| bad(format!("the leaf cannot be verified: {e}")))?;
    // Peers verify it from its not-before on; within the allowance that is a little ahead.
    let at = now.max(not_before);
    let at = UnixTime::since_unix_epoch(
        at.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &end_entity,
        &roots,
        &cert.chain[1..],
        at,
        crate::tls::crypto_provider()
            .signature_verification_algorithms
            .all,
    )
    .map_err(|e| IssueError::DoesNotChain {
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::human;
    use crate::testutil::rogue_ca::{Defect, RogueCa};
    use crate::testutil::{id, rogue_certificate};

    fn web() -> SpiffeId {
        id("spiffe://cluster.local/ns/default/sa/web")
    }

    #[test]
    fn each_bad_leaf_is_refused_with_its_cause() {
        let ca = RogueCa::new();
        let now = SystemTime::now();
        let cases = [
            (Defect::None, None),
            (Defect::ViaIntermediate, None),
            (Defect::SlightlyAhead, None),
            (Defect::Expired, Some("expired")),
            (Defect::NotYetValid, Some("not_yet_valid")),
            (Defect::CaTrue, Some("ca_leaf")),
            (Defect::KeyCertSign, Some("ca_leaf")),
            (Defect::ForeignRoot, Some("does_not_chain")),
            (Defect::ExpiredIntermediate, Some("does_not_chain")),
        ];
        for (defect, want) in cases {
            let cert = rogue_certificate(&ca, &web(), defect, now);
            let got = check(&web(), &cert, now).err();
            assert_eq!(
                got.as_ref().map(IssueError::cause),
                want,
                "{defect:?}: {got:?}"
            );
        }
        let other = id("spiffe://cluster.local/ns/x/sa/y");
        let cert = rogue_certificate(&ca, &other, Defect::None, now);
        let e = check(&web(), &cert, now).unwrap_err();
        assert_eq!(e.cause(), "wrong_identity");
        // The local CA's certificates pass.
        let local = crate::CertificateAuthority::ephemeral("cluster.local").unwrap();
        check(&web(), &local.issue_at(&web(), HOUR, now).unwrap(), now).unwrap();
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn clock_errors_say_the_node_clock_looks_skewed_and_by_how_much() {
        let ca = RogueCa::new();
        let now = SystemTime::now();
        let expired = rogue_certificate(&ca, &web(), Defect::Expired, now);
        let e = check(&web(), &expired, now).unwrap_err();
        let IssueError::Expired { by, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*by, now.duration_since(expired.not_after).unwrap());
        assert!(*by >= 2 * HOUR, "{by:?}");
        let text = e.to_string();
        assert!(text.contains("node clock looks skewed ahead"), "{text}");
        assert!(
            text.contains(&format!("{} before this node's clock", human(*by))),
            "{text}"
        );
        let early = rogue_certificate(&ca, &web(), Defect::NotYetValid, now);
        let e = check(&web(), &early, now).unwrap_err();
        let IssueError::NotYetValid { by, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*by, early.not_before.duration_since(now).unwrap());
        let text = e.to_string();
        assert!(text.contains("node clock looks skewed behind"), "{text}");
        assert!(
            text.contains(&format!("{} after this node's clock", human(*by))),
            "{text}"
        );
        // The edges: valid until the instant of not_after; a not-before up to the
        // allowance ahead.
        let good = rogue_certificate(&ca, &web(), Defect::None, now);
        assert!(check(&web(), &good, good.not_after - Duration::from_millis(1)).is_ok());
        assert_eq!(
            check(&web(), &good, good.not_after).unwrap_err().cause(),
            "expired"
        );
        let t = good.not_before - NOT_BEFORE_ALLOWANCE;
        assert!(check(&web(), &good, t).is_ok());
        let e = check(&web(), &good, t - Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.cause(), "not_yet_valid");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_secs(59)), "59s");
        assert_eq!(human(Duration::from_secs(61)), "1m1s");
        assert_eq!(human(Duration::from_secs(7205)), "2h0m5s");
    }
}
