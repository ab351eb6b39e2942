//! Consistent hashing of requests onto endpoints: ring hash (Karger's ring, each endpoint
//! at many points in proportion to its weight) and Maglev (Google's lookup table, filled
//! from each endpoint's own permutation). Both are deterministic functions of the
//! endpoints' names and weights, with xxHash64 as Envoy uses, so every replica of the
//! waypoint, and the same one after a restart, sends a key to the same endpoint; when an
//! endpoint leaves, only its keys move.

use twox_hash::XxHash64;

fn xxh64(bytes: &[u8], seed: u64) -> u64 {
    XxHash64::oneshot(seed, bytes)
}

use crate::{HashAlgorithm, MAX_RING_SIZE};

/// A key's hash (a header's value, a cookie, an address).
pub fn hash_of(bytes: &[u8]) -> u64 {
    xxh64(bytes, 0)
}

/// One endpoint as the table sees it: a stable name (its `ip:port`) and its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// At least 1 is used.
    pub weight: u32,
}

/// A built table: which member a hash goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashTable {
    /// Points on the ring, sorted by hash, each with its member's index.
    Ring(Vec<(u64, u32)>),
    /// The member's index in each slot.
    Maglev(Vec<u32>),
}

impl HashTable {
    /// The table of `members` (in any order: the result depends on their names and
    /// weights only). `None` without members.
    pub fn build(algorithm: HashAlgorithm, members: &[Member]) -> Option<HashTable> {
        if members.is_empty() {
            return None;
        }
        Some(match algorithm {
            HashAlgorithm::RingHash { minimum_ring_size } => {
                HashTable::Ring(ring(members, minimum_ring_size))
            }
            HashAlgorithm::Maglev { table_size } => HashTable::Maglev(maglev(members, table_size)),
        })
    }

    /// The index (in the members the table was built from) that `hash` goes to.
    pub fn lookup(&self, hash: u64) -> usize {
        match self {
            HashTable::Ring(points) => {
                // The first point at or after the hash, wrapping to the first.
                let at = points.partition_point(|(h, _)| *h < hash);
                points.get(at).unwrap_or(&points[0]).1 as usize
            }
            HashTable::Maglev(slots) => slots[(hash % slots.len() as u64) as usize] as usize,
        }
    }

    /// Entries held (points or slots): the table's memory, for the bound on it.
    pub fn len(&self) -> usize {
        match self {
            HashTable::Ring(p) => p.len(),
            HashTable::Maglev(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn weights(members: &[Member]) -> impl Iterator<Item = u64> + '_ {
    members.iter().map(|m| u64::from(m.weight.max(1)))
}

/// Each member gets `per_weight * weight` points, `per_weight` the power of two that
/// makes the ring at least `minimum_ring_size` (at most [`MAX_RING_SIZE`]); point `i` of a
/// member is at the hash of `"<name>_<i>"`. A power of two, not the exact quotient: a
/// member leaving or joining leaves the others' points as they were (until the pool
/// halves or doubles), so only the keys of the member that left move.
fn ring(members: &[Member], minimum_ring_size: u64) -> Vec<(u64, u32)> {
    let total: u64 = weights(members).sum();
    let wanted = minimum_ring_size.min(MAX_RING_SIZE).div_ceil(total).max(1);
    let mut per_weight = wanted.next_power_of_two();
    while per_weight > 1 && per_weight * total > MAX_RING_SIZE {
        per_weight /= 2;
    }
    let mut points = Vec::with_capacity((per_weight * total) as usize);
    for ((index, member), weight) in members.iter().enumerate().zip(weights(members)) {
        let count = per_weight * weight;
        let mut key = String::with_capacity(member.name.len() + 8);
        for i in 0..count {
            key.clear();
            key.push_str(&member.name);
            key.push('_');
            key.push_str(&i.to_string());
            points.push((hash_of(key.as_bytes()), index as u32));
        }
    }
    // Ties (two names colliding) broken by name, so the order of members never matters.
    points.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| members[a.1 as usize].name.cmp(&members[b.1 as usize].name))
    });
    points
}

/// Maglev's population: each member walks its permutation of the slots (offset and skip
/// from two hashes of its name) and takes the next free slot in its turn; a member takes
/// turns in proportion to its weight.
fn maglev(members: &[Member], table_size: u64) -> Vec<u32> {
    let m = table_size;
    // Members in name order, so the turns (and so the table) do not depend on the order
    // they were given in.
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by(|a, b| members[*a].name.cmp(&members[*b].name));
    let max_weight = weights(members).max().unwrap_or(1) as f64;
    struct Walk {
        index: u32,
        offset: u64,
        skip: u64,
        next: u64,
        share: f64,
        credit: f64,
    }
    let mut walks: Vec<Walk> = order
        .into_iter()
        .map(|i| {
            let name = members[i].name.as_bytes();
            Walk {
                index: i as u32,
                offset: xxh64(name, 0) % m,
                skip: xxh64(name, 1) % (m - 1) + 1,
                next: 0,
                share: f64::from(members[i].weight.max(1)) / max_weight,
                credit: 0.0,
            }
        })
        .collect();
    const FREE: u32 = u32::MAX;
    let mut slots = vec![FREE; m as usize];
    let mut filled = 0u64;
    while filled < m {
        for walk in walks.iter_mut() {
            walk.credit += walk.share;
            if walk.credit < 1.0 {
                continue;
            }
            walk.credit -= 1.0;
            // The next free slot on this member's permutation.
            loop {
                let slot = ((walk.offset + walk.next * walk.skip) % m) as usize;
                walk.next += 1;
                if slots[slot] == FREE {
                    slots[slot] = walk.index;
                    filled += 1;
                    break;
                }
            }
            if filled == m {
                break;
            }
        }
    }
    slots
}

/// True when `n` is prime (Maglev's table size must be).
pub fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DEFAULT_MAGLEV_TABLE, DEFAULT_RING_SIZE};

    const RING: HashAlgorithm = HashAlgorithm::RingHash {
        minimum_ring_size: DEFAULT_RING_SIZE,
    };
    const MAGLEV: HashAlgorithm = HashAlgorithm::Maglev {
        table_size: DEFAULT_MAGLEV_TABLE,
    };

    fn members(names: &[&str]) -> Vec<Member> {
        names
            .iter()
            .map(|n| Member {
                name: n.to_string(),
                weight: 1,
            })
            .collect()
    }

    fn owner(table: &HashTable, members: &[Member], key: &str) -> String {
        members[table.lookup(hash_of(key.as_bytes()))].name.clone()
    }

    const KEYS: usize = 10_000;

    fn keys() -> impl Iterator<Item = String> {
        (0..KEYS).map(|i| format!("user-{i}"))
    }

    #[test]
    fn the_hash_is_xxhash64_with_seed_zero() {
        // Published xxHash64 test vectors (seed 0): the empty input and "abc".
        assert_eq!(hash_of(b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(hash_of(b"abc"), 0x44BC_2CF5_AD77_0999);
    }

    #[test]
    fn the_same_members_in_any_order_make_the_same_choices() {
        for algorithm in [RING, MAGLEV] {
            let a = members(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]);
            let b = members(&["10.0.0.3:80", "10.0.0.1:80", "10.0.0.2:80"]);
            let (ta, tb) = (
                HashTable::build(algorithm, &a).unwrap(),
                HashTable::build(algorithm, &b).unwrap(),
            );
            for key in keys().take(2000) {
                assert_eq!(owner(&ta, &a, &key), owner(&tb, &b, &key), "{algorithm:?}");
            }
        }
    }

    #[test]
    fn keys_spread_evenly_and_by_weight() {
        // Each of 4 equal members should own a quarter of 10,000 keys; hashing is not a fair
        // draw, so the bound is loose (±25 % of the share) but catches a member left out or
        // doubled.
        for algorithm in [RING, MAGLEV] {
            let ms = members(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"]);
            let table = HashTable::build(algorithm, &ms).unwrap();
            let mut counts = [0usize; 4];
            for key in keys() {
                counts[table.lookup(hash_of(key.as_bytes()))] += 1;
            }
            assert!(
                counts.iter().all(|c| (1875..=3125).contains(c)),
                "{algorithm:?}: {counts:?}"
            );
        }
        // Weight 3 against 1: three quarters.
        for algorithm in [RING, MAGLEV] {
            let ms = vec![
                Member {
                    name: "heavy:80".into(),
                    weight: 3,
                },
                Member {
                    name: "light:80".into(),
                    weight: 1,
                },
            ];
            let table = HashTable::build(algorithm, &ms).unwrap();
            let heavy = keys()
                .filter(|k| table.lookup(hash_of(k.as_bytes())) == 0)
                .count();
            assert!((7000..=8000).contains(&heavy), "{algorithm:?}: {heavy}");
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_keys() {
        for algorithm in [RING, MAGLEV] {
            let all = members(&["a:80", "b:80", "c:80", "d:80", "e:80"]);
            let without_c: Vec<Member> = all.iter().filter(|m| m.name != "c:80").cloned().collect();
            let before = HashTable::build(algorithm, &all).unwrap();
            let after = HashTable::build(algorithm, &without_c).unwrap();
            let mut moved_elsewhere = 0;
            for key in keys() {
                let was = owner(&before, &all, &key);
                let now = owner(&after, &without_c, &key);
                if was != "c:80" && was != now {
                    moved_elsewhere += 1;
                }
            }
            // Ring hash moves none; Maglev a little (its table is refilled), well under
            // the fifth a modulo hash would move.
            let bound = match algorithm {
                HashAlgorithm::RingHash { .. } => 0,
                HashAlgorithm::Maglev { .. } => KEYS / 50,
            };
            assert!(moved_elsewhere <= bound, "{algorithm:?}: {moved_elsewhere}");
            // And back: the same table as before.
            assert_eq!(HashTable::build(algorithm, &all).unwrap(), before);
        }
    }

    #[test]
    fn sizes_and_bounds() {
        let one = members(&["only:80"]);
        let ring = HashTable::build(RING, &one).unwrap();
        assert_eq!(ring.len(), 1024);
        assert!(keys()
            .take(100)
            .all(|k| ring.lookup(hash_of(k.as_bytes())) == 0));
        let huge = HashTable::build(
            HashAlgorithm::RingHash {
                minimum_ring_size: u64::MAX,
            },
            &one,
        )
        .unwrap();
        assert_eq!(huge.len() as u64, MAX_RING_SIZE);
        // Three members: 1024 / 3 rounded up to a power of two each.
        let three = HashTable::build(RING, &members(&["a", "b", "c"])).unwrap();
        assert_eq!(three.len(), 3 * 512);
        let small = HashTable::build(
            HashAlgorithm::Maglev { table_size: 7 },
            &members(&["a", "b"]),
        )
        .unwrap();
        assert_eq!(small.len(), 7);
        assert!(HashTable::build(RING, &[]).is_none());
        assert!(is_prime(65537) && is_prime(5_000_011) && is_prime(2));
        assert!(!is_prime(65536) && !is_prime(1) && !is_prime(0) && !is_prime(9));
    }
}
