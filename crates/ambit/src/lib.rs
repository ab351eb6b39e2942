//! The `ambit` binary's pieces: configuration from the environment, the node proxy
//! runtime and its operator endpoints, the demo, and the network-namespace lab that the
//! demo and the end-to-end tests build their nodes with.
#![forbid(unsafe_code)]
#![recursion_limit = "256"]

pub mod admin;
pub mod agent_cli;
pub mod app;
pub mod config;
pub mod config_dump;
pub mod demo;
pub mod demo_inpod;
pub mod http;
pub mod lab;
pub mod log_format;
pub mod logging;
pub mod process_metrics;
pub mod readiness;
pub mod version;
