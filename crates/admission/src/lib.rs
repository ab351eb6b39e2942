//! Admission of connections whose peers have not proved anything yet.
//!
//! A listener that anyone can reach (the HBONE port, the control server, the operator
//! ports) must bound what an unauthenticated peer can make it hold, and must still serve
//! the legitimate newcomer while someone floods it. Refusing newcomers once a cap is
//! reached does the first and fails the second: the flood holds the slots and the
//! newcomer is the one turned away. So a [`Gate`] counts holders in total and per source
//! IP and, when a share is spent, evicts the *stalest unproven* holder for the newcomer:
//! the one least far along (its [`Stage`]), and among equals the one that has gone longest
//! without progress. A client that moves through its handshake promptly is therefore
//! never the one evicted while a stalled connection is held. Holders that have proved
//! themselves (authenticated, or busy with a request) are not evicted; when only those
//! are left, the newcomer is refused.
//!
//! [`choose`] is the decision, sans IO; [`Gate`] keeps the holders and signals the
//! evicted ones, whose owners close their connections.

#![forbid(unsafe_code)]

pub mod accept;
mod choose;
mod gate;

pub use accept::{accept, Accepted, ReportThrottle};
pub use choose::{choose, Full, Held, Limits, Standing, Verdict};
pub use gate::{Admitted, Gate, Stage, Ticket};
