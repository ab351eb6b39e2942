//! The `ambit` binary's command lines: the multi-call `main` dispatches to the node proxy
//! (`ambit-nodeproxy-process`), the node agent and its installer ([`agent_cli`], [`install_cni`]),
//! the control server ([`control_cli`]) and, with the `demo` feature, the demo
//! (`ambit-demo`). Everything else lives in the crates those name.
#![forbid(unsafe_code)]

pub mod agent_cli;
pub mod control_cli;
pub mod install_cni;
