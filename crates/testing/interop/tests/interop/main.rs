//! The interop and differential suites: ambit and Istio's own ztunnel on the two ends of
//! every wire they share, in network namespaces each test creates and removes. Run by
//! `scripts/interop` (root; the peer in `../shared/peers/istio-ztunnel` or `AMBIT_PEER_DIR`).
//! A test whose peer is missing fails, naming what is missing.
//!
//! - `hbone`: HBONE between the two, both directions, IPv4 and IPv6, dedicated mode;
//! - `agent`: ambit's agent and CNI plugin driving Istio's ztunnel, in-pod HBONE between
//!   the two across nodes, fail-closed with Istio's ztunnel down, in-pod observables;
//! - `zds`: an independent agent peer driving both through the same ZDS sequence;
//! - `differential`: `/config_dump`, metrics and access logs for the same scenarios;
//! - `connect`: the CONNECT request each client sends, recorded;
//! - `answers`: the HBONE server's answers to the same raw requests;
//! - `waypoint`: the lab's test waypoint with either proxy as the client or the server node.

mod agent;
mod answers;
mod connect;
mod control;
mod differential;
mod hbone;
mod pods;
mod semantics;
mod single;
mod waypoint;
mod zds;
