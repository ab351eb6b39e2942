//! The body of `POST /cmdadd` (the CNI plugin's call to the agent in Kubernetes mode, on a
//! socket any local process can reach): `ambit_cni::istio_api::parse`.
//!
//! Input: the request body.
#![no_main]

use ambit_cni::istio_api::{parse, MAX_IPS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = parse(data) {
        assert!(!req.pod_name.is_empty() && !req.pod_namespace.is_empty());
        assert!(req.ips.len() <= MAX_IPS);
        let addrs = req.addresses();
        assert!(addrs.len() <= req.ips.len());
        // What we accept, we can send again, and it reads back the same.
        assert_eq!(parse(&req.encode()).expect("our own encoding parses"), req);
    }
});
