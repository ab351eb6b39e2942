//! The `cmdadd_request` target: the body of `POST /cmdadd` (the CNI plugin's call to the
//! agent in Kubernetes mode, on a socket any local process can reach),
//! `ambit_cni::istio_api::parse`.

use ambit_cni::istio_api::{parse, MAX_IPS};

/// What the body came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted: the pod (`namespace/name`) and how many addresses it carries.
    Accepted { pod: String, addresses: usize },
    /// Refused (the error's variant).
    Refused(String),
}

/// Input: the request body.
///
/// Checks: an accepted request names a pod and its namespace, carries at most `MAX_IPS`
/// entries, and re-encodes to a body that parses to the same request.
pub fn run(data: &[u8]) -> Outcome {
    let req = match parse(data) {
        Ok(req) => req,
        Err(e) => return Outcome::Refused(crate::variant(&e)),
    };
    assert!(!req.pod_name.is_empty() && !req.pod_namespace.is_empty());
    assert!(req.ips.len() <= MAX_IPS);
    let addrs = req.addresses();
    assert!(addrs.len() <= req.ips.len());
    // What we accept, we can send again, and it reads back the same.
    assert_eq!(parse(&req.encode()).expect("our own encoding parses"), req);
    Outcome::Accepted {
        pod: format!("{}/{}", req.pod_namespace, req.pod_name),
        addresses: addrs.len(),
    }
}
