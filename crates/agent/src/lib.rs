//! The ambit node agent: the istio-cni node agent's job, minus Kubernetes.
//!
//! It enrolls pods into the mesh: it installs the redirection rules inside each pod's
//! network namespace, keeps the host-side probe SNAT rules and ipsets, and hands each pod's
//! netns to the node proxy over ZDS. Pods are announced on a Unix socket by the CNI plugin
//! ([`ambit_cni::api`]) and persisted, so a restarted agent resumes where it stopped.
//!
//! - [`rules`]: the rule sets, sans IO (golden-tested against Istio's), the `iptables-save`
//!   parser and the idempotence comparison.
//! - [`iptables`]: applying and removing them in a netns (`iptables-restore`, started inside it).
//! - [`netlink`]: the in-pod return-path rule and route, over rtnetlink.
//! - [`ipset`]: the host probe sets (`ipset` tool), UID-checked removal.
//! - [`store`]: the enrolled pods on disk.
//! - [`zds_session`]: one ZDS connection, agent side, sans IO (hello, snapshot, acks,
//!   timeouts on an injected clock).
//! - [`zds`]: the ZDS server node proxies connect to: a thin driver over [`zds_session`].
//! - [`agent`]: the runtime ([`run`]).
//! - [`exec`]: running the tools in a netns.
//! - [`install`]: putting the CNI plugin on a Kubernetes node and keeping it there.
//! - [`k8s`]: Kubernetes mode: the API server drives the enrollment, as istio-cni's agent.
#![forbid(unsafe_code)]

pub mod agent;
pub mod env;
pub mod exec;
pub mod install;
pub mod ipset;
pub mod iptables;
pub mod k8s;
pub mod netlink;
pub mod rules;
pub mod store;
pub mod zds;
pub mod zds_session;

pub use agent::{run, run_with, uninstall_host, AgentConfig, RunOptions};
pub use rules::PodRuleOptions;
pub use zds::{ZdsError, ZdsServer};
