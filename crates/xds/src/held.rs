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
    Authorization, Clause, GatewayAddress, Name, NetworkAddress, RbacMatch, Rule, Service,
    ServiceAccountMatch, StringMatch, Workload,
};
use ipnet::IpNet;

use crate::shape::{Counts, PolicyCounts, ServiceCounts, Text, WorkloadCounts};

/// Bytes of a `String`, `Vec` or `Arc` pointer (the slots of the maps below).
pub(crate) const STRING: usize = size_of::<String>();
/// The store's interned string (`ambit_state::Name`): a pointer and a length.
pub(crate) const NAME: usize = size_of::<Name>();
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

/// Interned strings, counted as if none were shared (what a peer that makes every one
/// unique makes us hold): each its own allocation (a reference count and the bytes) and
/// its entry in the interner's set.
fn names(t: Text) -> u64 {
    if t.count == 0 {
        return 0;
    }
    blocks(t.count, t.bytes + t.count * ARC_COUNTS) + t.count as u64 * hash_entry(NAME)
}

fn workload(c: &WorkloadCounts, uid: usize) -> u64 {
    // Each service's port map: one boxed slice of (port, port) pairs.
    let port_maps = blocks(c.services, c.ports * 4);
    let model = block(ARC_COUNTS + size_of::<Workload>())
        + names(c.text)
        // The uid filled in when empty, and the service keys.
        + names(Text {
            count: 1 + c.services,
            bytes: uid + c.service_key_bytes,
        })
        + block(c.addresses * size_of::<IpAddr>())
        + grown(c.policies.min(1), c.policies, NAME)
        + block(c.services * (NAME + 2 * PTR))
        + port_maps
        // The waypoint and network gateway, boxed.
        + 2 * block(size_of::<GatewayAddress>());
    // The indexes hold the workload's own names and a reference to it, no copies.
    let by_uid = btree_entry(NAME + PTR);
    let by_addr = c.addresses as u64 * hash_entry(size_of::<IpAddr>() + 4 * PTR + NAME);
    let endpoints = c.services as u64 * (btree_entry(NAME + PTR) + block(leaf(NAME + PTR)));
    let index = c.services as u64
        * (hash_entry(NAME + PTR) + block(ARC_COUNTS + ENDPOINT_INDEX) + 2 * (PTR + 8) as u64);
    model + by_uid + by_addr + endpoints + index
}

fn service(c: &ServiceCounts, key: usize) -> u64 {
    let model = block(ARC_COUNTS + size_of::<Service>())
        + names(c.text)
        + block(c.addresses * size_of::<NetworkAddress>())
        + block(c.ports * 4)
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
