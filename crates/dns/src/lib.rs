//! ambit's DNS proxy (reference §10.5): answers A/AAAA for mesh services from the mesh
//! state, forwards every other query to the resolvers of resolv.conf, and serves both on
//! 15053 over UDP and TCP, inside each pod's network namespace in shared mode.
//!
//! The decisions ([`message`], [`mesh`]) are sans-IO; sockets live in [`forward`] and
//! [`server`], created through a [`DnsSockets`] factory so in-pod mode makes them in the
//! pod's namespace.
#![forbid(unsafe_code)]

pub mod forward;
pub mod mesh;
pub mod message;
pub mod metrics;
pub mod resolver;
pub mod server;
pub mod sockets;

pub use forward::{ForwardError, ResolvConf};
pub use mesh::{SearchList, Settings};
pub use message::{
    decide, encode_reply, handle_locally, parse_request, Decision, Parsed, Protocol,
};
pub use metrics::DnsMetrics;
pub use resolver::{ClientIdentity, DnsConfig, DnsError, Resolver, StateSource};
pub use server::{DnsServer, ListenAddr, DNS_PORT};
pub use sockets::{DnsSockets, LocalSockets};

#[cfg(test)]
mod tests;
