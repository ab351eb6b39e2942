//! What both proxies, the node proxy and the waypoint, report the same way:
//!
//! - [`TrafficLabels`]: Istio's label set of its standard metrics (`istio_tcp_*`,
//!   `istio_requests_total` & co), in ztunnel's order, with the [`Reporter`] that says
//!   which side counted and the [`ResponseFlag`] of a connection that failed;
//! - [`dry_run`]: `ambit_rbac_dry_run_matches`, the dry-run authorization policies a
//!   proxy's decisions matched.
#![forbid(unsafe_code)]

pub mod dry_run;
mod labels;

pub use labels::{or_unknown, Reporter, ResponseFlag, TrafficLabels, UNKNOWN};
