//! `ambit-cni`: ambit's chained CNI plugin, and the small JSON API it (and the `ambit`
//! CLI) uses to talk to the node agent.
//!
//! - [`api`]: the agent's "pod events" API: one newline-terminated JSON request per
//!   connection over a Unix stream socket ([`api::DEFAULT_AGENT_SOCKET`]), one JSON
//!   response line back. Client ([`api::call`]) and server-side helpers
//!   ([`api::read_request`], [`api::write_response`]).
//! - [`istio_api`]: the request Istio's plugin sends Istio's agent (`POST /cmdadd` over
//!   `pluginevent.sock`), which ambit's agent serves in Kubernetes mode.
//! - [`plugin`]: the CNI (spec 1.0, also 0.3.x/0.4.0) plugin logic, free of process
//!   state so it is tested in-memory: [`plugin::run`] takes the CNI environment, stdin
//!   and an [`plugin::Agent`] and returns what to print and the exit code.
//! - [`entry`]: the process, [`entry::main_with_process_env`], which the `ambit` binary
//!   calls when it is invoked as `ambit-cni`: it picks the mode and prints the outcome.
//!
//! The plugin is the fail-closed gate for new pods: an ADD for a pod that should be
//! captured succeeds only after the agent has confirmed the enrollment; when the agent
//! cannot be reached the runtime gets a "try again later" error and retries the
//! sandbox, so no pod starts uncaptured. DEL never fails.
//!
//! - [`kube_mode`]: the plugin as Istio's `istio-cni` (chosen by the config's keys): reads
//!   the pod from the API and announces ambient pods to the agent with [`cmdadd`].
//!
//! No logging here: stdout belongs to the CNI protocol. Only the Kubernetes mode runs an
//! async runtime (current-thread, for its API and agent calls).
#![forbid(unsafe_code)]

pub mod api;
pub mod cmdadd;
pub mod entry;
pub mod istio_api;
pub mod kube_mode;
pub mod plugin;

pub use api::{AgentCallError, AgentRequest, AgentResponse, PodInfo, DEFAULT_AGENT_SOCKET};
pub use plugin::{run, Agent, CniEnv, Outcome, SocketAgent};
