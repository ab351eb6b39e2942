//! ambit's DNS proxy (reference §10.5): answers A/AAAA for mesh services from the mesh
//! state, forwards every other query to the resolvers of resolv.conf, and serves both on
//! 15053 over UDP and TCP, inside each pod's network namespace in shared mode.
//!
//! The decisions ([`message`], [`mesh`]) are sans-IO; sockets live in [`forward`] and
//! [`server`], created through a [`DnsSockets`] factory so in-pod mode makes them in the
//! pod's namespace.
#![forbid(unsafe_code)]

pub mod mesh;
pub mod message;

pub use mesh::{SearchList, Settings};
pub use message::{
    decide, encode_reply, handle_locally, parse_request, Decision, Parsed, Protocol,
};

#[cfg(test)]
mod tests;
