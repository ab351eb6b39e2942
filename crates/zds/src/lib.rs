//! ZDS, the node agent → node proxy protocol (istio.workload.zds), and the network
//! namespace handles it passes: in-pod mode's plumbing on both ends.
//!
//! - [`proto`]: the ZDS protobuf messages, field numbers exact.
//! - [`protocol`]: sans-IO decoding (with the fd rules) and encoding.
//! - [`state`]: sans-IO snapshot/reconcile state machine of the node proxy.
//! - [`wire`]: the SEQPACKET socket with SCM_RIGHTS fd passing (tokio).
//! - [`netns`]: netns handles; run code (create sockets) inside a pod's netns.
//! - [`peer`]: who is at the other end (`SO_PEERCRED`) and whether we talk to them.
//! - [`sockfile`]: socket files bound with their final mode (0600) from the start.
//!
//! This is the one crate of the project allowed `unsafe` (fd passing); every block carries a
//! `// SAFETY:` comment.

// The workspace denies `unsafe`; this crate is the audited exception (fd passing, setns).
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod netns;
pub mod peer;
pub mod proto;
pub mod protocol;
pub mod sockfile;
pub mod state;
pub mod wire;

pub use netns::{Netns, NetnsId};
pub use peer::{PeerCredentials, PeerPolicy, PeerRefused, PeerRole};
pub use protocol::{Incoming, ProtocolError};
pub use state::{Action, StateError, WorkloadStates};
pub use wire::{WireError, ZdsListener, ZdsSocket};
