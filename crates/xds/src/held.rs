//! What a resource will hold once decoded, converted and in the store, estimated in bytes
//! from the counts its shape walk made on the encoded bytes ([`crate::shape::Counts`]),
//! before anything is decoded: the figure the delta client's budget adds up per type
//! ([`crate::Limits::max_held_addresses`], [`crate::Limits::max_held_policies`]).
//!
//! The estimate errs on the safe side, never below what is held:
//! - each heap block is charged what jemalloc (the node proxy's allocator) may hand out
//!   for it: its size classes are at most a quarter above a request, 16 bytes for the
//!   smallest ([`block`]);
//! - a list filled by pushes (`prost`'s repeated fields, a `collect` of a filter) at
//!   twice its length and at least 4 slots; one made with its length, at its length;
//! - a B-tree (`std`'s: nodes of 11 entries, at least 5 in all but the root) at a root
//!   leaf per map and an internal node per 5 entries;
//! - a hash table (`hashbrown`'s: at most 7/8 full, doubled when it is) at 3 slots and
//!   their control bytes per entry;
//! - the store's indexes (by uid, address, VIP, hostname, service endpoints, the
//!   endpoints prepared for weighted choice, policies by namespace), and the delta
//!   client's own record of the name and version ([`tracking`]).
//!
//! The figures use `size_of` of the model's types, so a slimmer type lowers them at
//! once. `tests/held_estimate.rs` checks them against a counting allocator, above what is
//! held and within a small factor of it for real-shaped resources.

use std::mem::size_of;
use std::net::IpAddr;

use ambit_state::{
    Authorization, Clause, NetworkAddress, RbacMatch, Rule, Service, ServiceAccountMatch,
    StringMatch, Workload,
};
use ipnet::IpNet;

use crate::shape::{Counts, PolicyCounts, ServiceCounts, Text, WorkloadCounts};

/// Bytes of a `String`, `Vec` or `Arc` pointer (the slots of the maps below).
pub(crate) const STRING: usize = size_of::<String>();
pub(crate) const PTR: usize = size_of::<usize>();
/// An `Arc`'s two counters, in the same block as its value.
pub(crate) const ARC_COUNTS: usize = 2 * PTR;
/// The store's `OnceLock<EndpointIndex>` behind an `Arc` (two `Vec`s and the lock's
/// state; the type is private to the store, so its size is written out, rounded up).
const ENDPOINT_INDEX: usize = 64;

/// What the allocator may hand out for a block of `n` bytes.
pub(crate) const fn block(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        (n + n / 4 + 16) as u64
    }
}

/// `count` blocks of `bytes` bytes in all.
pub(crate) fn blocks(count: usize, bytes: usize) -> u64 {
    if count == 0 {
        0
    } else {
        (bytes + bytes / 4 + 16 * count) as u64
    }
}

fn text(t: Text) -> u64 {
    blocks(t.count, t.bytes)
}

/// `lists` lists of `n` items of `size` in all, filled by pushes: each at most twice
/// its length and at least 4 slots.
pub(crate) fn grown(lists: usize, n: usize, size: usize) -> u64 {
    blocks(lists, size * (4 * lists + 2 * n))
}

/// A B-tree leaf and internal node for entries of `kv` bytes.
pub(crate) const fn leaf(kv: usize) -> usize {
    2 * PTR + 11 * kv
}
const fn internal(kv: usize) -> usize {
    leaf(kv) + 12 * PTR
}

/// One more entry of a B-tree of `kv`-byte entries: a fifth of a node.
pub(crate) fn btree_entry(kv: usize) -> u64 {
    block(internal(kv)).div_ceil(5)
}

/// `maps` B-trees holding `entries` entries of `kv` bytes in all.
fn btree(maps: usize, entries: usize, kv: usize) -> u64 {
    maps as u64 * block(leaf(kv)) + entries as u64 * btree_entry(kv)
}

/// One more entry of a hash table of `kv`-byte entries.
fn hash_entry(kv: usize) -> u64 {
    3 * (kv as u64 + 1)
}

/// What the delta client keeps per tracked name: the name, the version, and its entry
/// (`entry` bytes) in a hash table.
pub(crate) fn tracking(name_len: usize, version_len: usize, entry: usize) -> u64 {
    block(name_len) + block(version_len) + hash_entry(STRING + entry)
}

/// The estimate for a body that the walk counted as `counts`, under the resource name
/// `name_len` bytes long (checked to be the store's key: a uid, `namespace/hostname` or
/// `namespace/name`).
pub(crate) fn estimate(counts: &Counts, name_len: usize) -> u64 {
    match counts {
        Counts::Policy(c) => policy(c, name_len),
        Counts::Workload(c) => workload(c, name_len),
        Counts::Service(c) => service(c, name_len),
        // Refused once decoded; what it holds until then is the empty message.
        Counts::Neither => 0,
    }
}

fn policy(c: &PolicyCounts, key: usize) -> u64 {
    let model = block(ARC_COUNTS + size_of::<Authorization>())
        + text(c.text)
        + blocks(c.rules.min(1), c.rules * size_of::<Rule>())
        + blocks(c.rules, c.clauses * size_of::<Clause>())
        + blocks(c.clauses, c.matches * size_of::<RbacMatch>())
        + grown(
            c.string_matches.lists,
            c.string_matches.values,
            size_of::<StringMatch>(),
        )
        + grown(
            c.service_accounts.lists,
            c.service_accounts.values,
            size_of::<ServiceAccountMatch>(),
        )
        + grown(c.cidrs.lists, c.cidrs.values, size_of::<IpNet>())
        + grown(c.ports.lists, c.ports.values, size_of::<u16>());
    // `policies` and `policies_by_namespace`: the key twice with an `Arc` each, and the
    // namespace's own entry (its name, a hash slot and a map of its policies).
    let store = 2 * (block(key) + btree_entry(STRING + PTR))
        + block(key)
        + hash_entry(2 * STRING)
        + block(leaf(STRING + PTR));
    model + store
}

fn workload(c: &WorkloadCounts, uid: usize) -> u64 {
    let port_maps = btree(c.services, c.ports, 4);
    let model = block(ARC_COUNTS + size_of::<Workload>())
        // `workload_type` is made from an enum: one short string more.
        + blocks(c.text.count + 1, c.text.bytes + 16)
        + block(c.addresses * size_of::<IpAddr>())
        + grown(c.policies.min(1), c.policies, STRING)
        + btree(c.services.min(1), c.services, 2 * STRING)
        + port_maps;
    // `workloads`: the uid and an `Arc`.
    let by_uid = block(uid) + btree_entry(STRING + PTR);
    // `workload_by_addr`: (network, ip) → uid, per address.
    let by_addr = c.addresses as u64
        * (hash_entry(size_of::<(String, IpAddr)>() + STRING)
            + block(c.network_bytes)
            + block(uid));
    // `endpoints`: service key → uid → port map, per service; the key may be new, and the
    // uid's entry may be the first of that service (a map of its own).
    let endpoints = blocks(c.services, c.service_key_bytes)
        + c.services as u64 * (btree_entry(2 * STRING) + block(leaf(2 * STRING)) + block(uid))
        + port_maps;
    // `endpoint_index`: service key → a lazily built index, which holds each endpoint's
    // `Arc` and port map (again) and a running sum, in lists filled by pushes.
    let index = blocks(c.services, c.service_key_bytes)
        + c.services as u64
            * (hash_entry(STRING + PTR)
                + block(ARC_COUNTS + ENDPOINT_INDEX)
                + 2 * (PTR + STRING) as u64
                + 2 * 8)
        + port_maps;
    model + by_uid + by_addr + endpoints + index
}

fn service(c: &ServiceCounts, key: usize) -> u64 {
    let model = block(ARC_COUNTS + size_of::<Service>())
        + text(c.text)
        + block(c.addresses * size_of::<NetworkAddress>())
        + btree(c.ports.min(1), c.ports, 4)
        + grown(c.subject_alt_names.min(1), c.subject_alt_names, STRING)
        + grown(c.routing_preferences.min(1), c.routing_preferences, 1);
    // `services`: the key and an `Arc`.
    let by_key = block(key) + btree_entry(STRING + PTR);
    // Per address, the larger of `service_by_vip` ((network, ip) → a set of keys: a slot,
    // the network, a set, the key) and `cidr_vips` (the address and the key in a list
    // filled by pushes).
    let vip = (hash_entry(size_of::<(String, IpAddr)>() + STRING) + block(leaf(STRING)))
        .max(2 * (size_of::<NetworkAddress>() + STRING) as u64)
        + block(key);
    let by_vip = c.addresses as u64 * vip + blocks(c.addresses, c.address_network_bytes);
    // `service_by_hostname`: hostname → a set of keys.
    let by_hostname =
        block(c.hostname_bytes) + hash_entry(2 * STRING) + block(leaf(STRING)) + block(key);
    model + by_key + by_vip + by_hostname
}
