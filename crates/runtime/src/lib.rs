//! What every long-running ambit process needs, whichever proxy or agent it runs:
//!
//! - [`drain`]: graceful shutdown (stop taking work, finish within a deadline, then close);
//! - [`shared`]: the snapshot of mesh state every reader takes, updated a batch at a time;
//! - [`http`]: the operator HTTP server (admin, metrics, readiness) with its connection
//!   shares, [`operator`]: the readiness and metrics handlers every process serves, and
//!   [`readiness`]: what a process waits for before it says ready;
//! - [`logging`] and [`log_format`]: ztunnel's log layouts (plain and JSON), with a filter
//!   that can be changed at run time;
//! - [`process_metrics`]: the process's CPU, memory and file descriptors, and the runtime's;
//! - [`version`]: build information, with the keys of ztunnel's `version`.
#![forbid(unsafe_code)]

pub mod drain;
pub mod file_watch;
pub mod http;
pub mod log_format;
pub mod logging;
pub mod memory;
pub mod operator;
pub mod process_metrics;
pub mod readiness;
pub mod shared;
pub mod version;
