//! The `ambit` binary's pieces: configuration from the environment, the node proxy
//! runtime and its operator endpoints, and (with the `demo` feature, on by default) the
//! demo, which builds its nodes with the network-namespace lab in `ambit-lab`.
#![forbid(unsafe_code)]
#![recursion_limit = "256"]

pub mod admin;
pub mod agent_cli;
pub mod app;
pub mod config;
pub mod config_dump;
pub mod control_cli;
#[cfg(feature = "demo")]
pub mod demo;
#[cfg(feature = "demo")]
pub mod demo_inpod;
pub mod http;
pub mod install_cni;
pub mod local_config;
pub mod log_format;
pub mod logging;
pub mod process_metrics;
pub mod readiness;
pub mod version;
