//! The redirection rules, sans IO: what to install in a pod's netns and on the host, rendered
//! as `iptables-restore` input (and the policy routing beside them), plus a parser for `iptables-save`
//! output and the comparison that decides whether a netns already holds exactly our rules.
//!
//! The rule sets are Istio's (reference `istio-cni.md` §2.1 and §2.3), rule for rule and in
//! the same order, so that a pod enrolled by either agent looks the same to Istio's tooling:
//!
//! - in-pod, tables `mangle`, `nat` and (DNS capture only) `raw`, chains `ISTIO_PRERT` and
//!   `ISTIO_OUTPUT`; outbound TCP is redirected to 15001, inbound TCP (except HBONE on
//!   15008) to 15006, DNS to 15053; the node proxy's own sockets carry mark `0x539/0xfff`,
//!   and its spoofed-source return path is steered with connmark `0x111/0xfff`, an `ip rule`
//!   and a local route in table 100;
//! - on the host, `nat ISTIO_POSTRT` SNATs node-local TCP (kubelet probes) to enrolled pods
//!   (an ipset) to `169.254.7.127`, which the in-pod rules let through uncaptured.
//!
//! By concern: [`family`] (per-family names and addresses), [`set`] (a planned rule set and its
//! `iptables-restore` text), [`pod`] and [`host`] (the two rule sets), [`routing`] (the in-pod return path), [`saved`] (reading
//! `iptables-save`, comparing, removal), [`words`] (quote-aware word splitting).

pub mod family;
pub mod host;
pub mod pod;
pub mod routing;
pub mod saved;
pub mod set;
pub mod words;

pub use family::{unmap, Family};
pub use host::{host_probe_rules, POSTRT_CHAIN};
pub use pod::{pod_rules, PodRuleOptions, OUTPUT_CHAIN, OWNED_CHAIN_PREFIX, PRERT_CHAIN};
pub use routing::ReturnRouting;
pub use saved::{removal_text, Comparison, SavedRule, SavedRules, SavedTable};
pub use set::{Ownership, Rule, RuleSet, TableRules};
pub use words::rule_target;
pub use words::split_words;
