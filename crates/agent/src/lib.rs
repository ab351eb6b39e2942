//! The ambit node agent (the istio-cni node agent, minus Kubernetes).
#![forbid(unsafe_code)]

pub mod exec;
pub mod ipset;
pub mod iptables;
pub mod rules;
