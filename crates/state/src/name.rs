//! `Name`: the store's string. Immutable, 16 bytes, cloned by a reference count, and
//! interned: the namespaces, service accounts, nodes, trust domains, networks and service
//! keys that thousands of workloads repeat are held once, and every index of the store
//! shares the workload's own copy of its uid instead of holding another.
//!
//! The interner is process-wide (serde has no place to pass one) and sharded, so decoding
//! on several threads rarely meets on one lock. Strings nobody holds any more are dropped
//! from it whenever a shard has doubled since its last sweep, so a mesh whose pods come and
//! go does not grow it without bound.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex};

/// An interned, shared, immutable string. Reads as a `&str` (it derefs to one).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

const SHARDS: usize = 16;
/// A shard is swept once it holds this many strings, then again each time it doubles.
const FIRST_SWEEP: usize = 1024;

struct Shard {
    strings: HashSet<Arc<str>>,
    sweep_at: usize,
}

struct Interner {
    hasher: std::collections::hash_map::RandomState,
    shards: Vec<Mutex<Shard>>,
    empty: Arc<str>,
}

static INTERNER: LazyLock<Interner> = LazyLock::new(|| Interner {
    hasher: Default::default(),
    shards: (0..SHARDS)
        .map(|_| {
            Mutex::new(Shard {
                strings: HashSet::new(),
                sweep_at: FIRST_SWEEP,
            })
        })
        .collect(),
    empty: Arc::from(""),
});

impl Interner {
    fn intern(&self, s: &str) -> Arc<str> {
        if s.is_empty() {
            return self.empty.clone();
        }
        let shard = &self.shards[(self.hasher.hash_one(s) as usize) % SHARDS];
        // A poisoned shard is still a consistent set: a panic cannot leave half an insert.
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = shard.strings.get(s) {
            return held.clone();
        }
        let new: Arc<str> = Arc::from(s);
        shard.strings.insert(new.clone());
        if shard.strings.len() >= shard.sweep_at {
            // Only this shard's lock hands out clones of what it holds, so a count of 1
            // cannot grow under us: that string is held by nobody but the interner.
            shard.strings.retain(|a| Arc::strong_count(a) > 1);
            shard.sweep_at = (shard.strings.len() * 2).max(FIRST_SWEEP);
        }
        new
    }

    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).strings.len())
            .sum()
    }
}

impl Name {
    /// The interned copy of `s`.
    pub fn new(s: &str) -> Name {
        Name(INTERNER.intern(s))
    }

    /// The empty name (shared; allocates nothing).
    pub fn empty() -> Name {
        Name(INTERNER.empty.clone())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True if both are the same allocation (so equal without comparing bytes).
    pub fn ptr_eq(&self, other: &Name) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// How many distinct strings the interner holds now (for tests and benchmarks).
    pub fn interned_count() -> usize {
        INTERNER.len()
    }
}

impl Default for Name {
    fn default() -> Self {
        Name::empty()
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name::new(s)
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Name {
        Name::new(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name::new(&s)
    }
}

impl From<&Name> for Name {
    fn from(s: &Name) -> Name {
        s.clone()
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        n.as_str().to_owned()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == &*other.0
    }
}

impl serde::Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Name {
    /// Interned straight from the decoder's buffer: no `String` in between.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Name, E> {
                Ok(Name::new(v))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_share_one_allocation() {
        let a = Name::new("ns-shared-by-many");
        let b = Name::from(String::from("ns-shared-by-many"));
        assert!(a.ptr_eq(&b));
        assert_eq!(a, "ns-shared-by-many");
        assert_eq!("ns-shared-by-many", a);
        assert!(Name::default().ptr_eq(&Name::new("")));
        assert!(Name::default().is_empty());
        assert!(!a.ptr_eq(&Name::new("another")));
    }

    #[test]
    fn serde_round_trip_interns() {
        let a: Name = serde_json::from_str("\"node-7\"").unwrap();
        assert!(a.ptr_eq(&Name::new("node-7")));
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"node-7\"");
        let e = serde_json::from_str::<Name>("7").unwrap_err().to_string();
        assert!(e.contains("a string"), "{e}");
    }

    #[test]
    fn strings_nobody_holds_are_swept() {
        // Many strings made and dropped: the interner sweeps them as shards fill, so it
        // ends far below what was made (each shard keeps under 2 × FIRST_SWEEP, and twice
        // what the crate's other tests, running alongside, hold).
        let made = SHARDS * FIRST_SWEEP * 8;
        for i in 0..made {
            drop(Name::new(&format!("swept-{i}")));
        }
        let kept = Name::new("kept-while-held");
        assert!(
            Name::interned_count() < SHARDS * FIRST_SWEEP * 2 + 10_000,
            "{} strings held after {made} were dropped",
            Name::interned_count()
        );
        // A string still held survives a sweep and stays shared.
        for i in 0..made {
            drop(Name::new(&format!("again-{i}")));
        }
        assert!(kept.ptr_eq(&Name::new("kept-while-held")));
    }
}
