//! The node proxy's data path: listeners, outbound routing to HBONE or plain TCP, the
//! HBONE inbound server, the plaintext inbound, and telemetry.
#![forbid(unsafe_code)]

pub mod admission;
pub mod connections;
pub mod copy;
pub mod decide;
pub use ambit_telemetry::dry_run;
pub mod error;
mod inbound;
pub mod inputs;
mod lookups;
pub mod metrics;
pub mod on_demand;
mod outbound;
mod plaintext;
pub mod pods;
pub mod proxy;
pub mod proxy_protocol;
pub mod settings;
pub mod socket;
pub mod socks5;
pub mod telemetry;

pub use error::{Error, Fault};
pub use inputs::{LocalIdentity, ProxyInputs, SharedState};
pub use proxy::{BoundProxy, ListenAddresses};
