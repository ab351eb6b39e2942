//! The few things this crate needs from SPIFFE identities.

use ambit_identity::SpiffeId;

/// Builds `spiffe://<td>/ns/<ns>/sa/<sa>`, or says why the parts do not make one.
pub(crate) fn make(
    trust_domain: &str,
    namespace: &str,
    service_account: &str,
) -> Result<SpiffeId, String> {
    SpiffeId::new(trust_domain, namespace, service_account).map_err(|e| e.to_string())
}

/// Trust domain of [`unusable_identity`]: `.invalid` is reserved (RFC 2606) and never a
/// real trust domain, so no peer can present a certificate for it.
const UNUSABLE_TRUST_DOMAIN: &str = "invalid";

/// An identity no real peer holds; what [`crate::Workload::identity`] yields for a workload
/// whose fields do not make a valid identity (never the case for a stored workload).
/// Expecting it fails closed.
pub(crate) fn unusable_identity() -> SpiffeId {
    match SpiffeId::new(UNUSABLE_TRUST_DOMAIN, "invalid", "invalid") {
        Ok(id) => id,
        // The parts are constants that satisfy the SPIFFE rules (see the test below).
        Err(e) => unreachable!("constant identity rejected: {e}"),
    }
}

/// The identity as RBAC principals see it: without the `spiffe://` prefix.
pub(crate) fn principal(id: &SpiffeId) -> String {
    let s = id.to_string();
    match s.strip_prefix("spiffe://") {
        Some(rest) => rest.to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_is_valid_and_invalid_domain() {
        assert_eq!(
            unusable_identity().to_string(),
            "spiffe://invalid/ns/invalid/sa/invalid"
        );
    }

    #[test]
    fn principal_strips_scheme() {
        let id = make("cluster.local", "ns", "sa").unwrap();
        assert_eq!(principal(&id), "cluster.local/ns/ns/sa/sa");
    }
}
