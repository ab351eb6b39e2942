//! Compact maps for what every workload carries: its port map per service, and the
//! services it serves. Sorted boxed slices: a workload's handful of entries cost their own
//! bytes and one allocation, where a B-tree allocates a node of eleven slots per map.
//! Lookups are a binary search over a few entries; an insert rebuilds the slice, which is
//! what decoding a workload does once.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::name::Name;

/// A sorted map of small `Copy` keys and values in one boxed slice.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SortedMap<K, V>(Box<[(K, V)]>);

impl<K: Ord, V> SortedMap<K, V> {
    pub fn new() -> Self {
        SortedMap(Box::new([]))
    }

    fn position<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.position(key).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
    {
        self.position(key).is_ok()
    }

    /// Adds or replaces an entry; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let mut entries = std::mem::take(&mut self.0).into_vec();
        let old = match entries.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => Some(std::mem::replace(&mut entries[i], (key, value)).1),
            Err(i) => {
                entries.insert(i, (key, value));
                None
            }
        };
        self.0 = entries.into_boxed_slice();
        old
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
    {
        let i = self.position(key).ok()?;
        let mut entries = std::mem::take(&mut self.0).into_vec();
        let (_, v) = entries.remove(i);
        self.0 = entries.into_boxed_slice();
        Some(v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator + '_ {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + '_ {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator + '_ {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.0.first().map(|(k, v)| (k, v))
    }
}

impl<K: Ord, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V, Q> std::ops::Index<&Q> for SortedMap<K, V>
where
    K: Ord + std::borrow::Borrow<Q>,
    Q: Ord + ?Sized,
{
    type Output = V;

    /// # Panics
    ///
    /// If the key is absent, as a map's indexing does.
    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry for the key")
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SortedMap<K, V> {
    /// Later entries replace earlier ones with the same key, as a map's inserts do.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        // Stable: among equal keys the last one given is kept below.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for e in entries {
            match kept.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => kept.push(e),
            }
        }
        SortedMap(kept.into_boxed_slice())
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for SortedMap<K, V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<K: Ord, V> From<BTreeMap<K, V>> for SortedMap<K, V> {
    fn from(map: BTreeMap<K, V>) -> Self {
        // Already sorted and unique.
        SortedMap(map.into_iter().collect())
    }
}

impl<'a, K: Ord, V> IntoIterator for &'a SortedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;
    fn into_iter(self) -> Self::IntoIter {
        fn pair<K, V>((k, v): &(K, V)) -> (&K, &V) {
            (k, v)
        }
        self.0.iter().map(pair)
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for SortedMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<K: Serialize, V: Serialize> Serialize for SortedMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for SortedMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::<K, V>::deserialize(d).map(SortedMap::from)
    }
}

/// One endpoint's ports for a service: service port → target port.
pub type PortMap = SortedMap<u16, u16>;

/// The services a workload serves: `namespace/hostname` → its port map.
pub type ServicePorts = SortedMap<Name, PortMap>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_like_a_map() {
        let mut m: PortMap = [(443, 8443), (80, 8080)].into();
        assert_eq!(m.get(&80), Some(&8080));
        assert_eq!(m.get(&81), None);
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [80, 443]);
        assert_eq!(m.insert(80, 9090), Some(8080));
        assert_eq!(m.insert(8, 8), None);
        assert_eq!(
            m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(),
            [(8, 8), (80, 9090), (443, 8443)]
        );
        assert_eq!(m.remove(&8), Some(8));
        assert_eq!(m.len(), 2);
        assert_eq!(format!("{m:?}"), "{80: 9090, 443: 8443}");
        // The last of equal keys wins, as with a map's inserts.
        let dup: PortMap = [(1, 1), (1, 2)].into_iter().collect();
        assert_eq!(dup.get(&1), Some(&2));
    }

    #[test]
    fn service_keys_by_str() {
        let mut s = ServicePorts::new();
        s.insert("ns/b".into(), [(80, 80)].into());
        s.insert("ns/a".into(), PortMap::new());
        assert!(s.contains_key("ns/a"));
        assert_eq!(s.get("ns/b").and_then(|p| p.get(&80)), Some(&80));
        assert_eq!(
            s.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["ns/a", "ns/b"]
        );
    }

    #[test]
    fn serde_as_a_map() {
        let m: PortMap = serde_json::from_str(r#"{"80": 8080, "443": 8443}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"80":8080,"443":8443}"#
        );
        let s: ServicePorts = yaml_serde::from_str("{ns/a.ns: {80: 8080}}").unwrap();
        assert_eq!(s.get("ns/a.ns").and_then(|p| p.get(&80)), Some(&8080));
    }
}
