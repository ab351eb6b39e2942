//! The object store: one global resourceVersion counter, the objects, and a bounded event
//! history watches resume from. Sans IO: callers fan events out.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::resource::Resource;

/// (resource, namespace or "", name): sorted like etcd keys, so lists page stably.
pub type Key = (Resource, String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change. `object` is the new state (for `Deleted`: the last state with the deletion's
/// resourceVersion); `old` the state before (none for `Added`).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub key: Key,
    pub old: Option<Arc<Value>>,
    pub object: Arc<Value>,
}

/// A resourceVersion older than the history kept (410 for the client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

impl From<TooOld> for ApiError {
    fn from(t: TooOld) -> ApiError {
        ApiError::expired(t.requested, t.oldest)
    }
}

pub struct Store {
    objects: BTreeMap<Key, Arc<Value>>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    cap: usize,
    /// Every event with a resourceVersion above this is in `history`.
    complete_after: u64,
}

pub(crate) fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

pub(crate) fn key_of(resource: Resource, ns: Option<&str>, name: &str) -> Key {
    let ns = if resource.namespaced() {
        ns.unwrap_or_default()
    } else {
        ""
    };
    (resource, ns.to_string(), name.to_string())
}

impl Store {
    /// An empty store keeping the last `history` events (at least one).
    pub fn new(history: usize) -> Store {
        Store {
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            cap: history.max(1),
            complete_after: 0,
        }
    }

    /// The current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, key: &Key) -> Option<&Arc<Value>> {
        self.objects.get(key)
    }

    /// Objects of `resource` (in namespace `ns` if given), in key order, from `after`
    /// (exclusive) on.
    pub fn list<'a>(
        &'a self,
        resource: Resource,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> + 'a {
        let start = (resource, ns.unwrap_or_default().to_string(), String::new());
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.0 == resource && ns.is_none_or(|n| k.1 == n))
    }

    /// The objects of `resource` (in `ns`) as they were at resourceVersion `rv`, rebuilt by
    /// undoing later events, or `TooOld` if the history no longer reaches back that far.
    pub fn snapshot_at(
        &self,
        resource: Resource,
        ns: Option<&str>,
        rv: u64,
    ) -> Result<BTreeMap<Key, Arc<Value>>, TooOld> {
        if rv < self.complete_after && rv < self.rv {
            return Err(TooOld {
                requested: rv,
                oldest: self.complete_after,
            });
        }
        let mut snap: BTreeMap<Key, Arc<Value>> = self
            .list(resource, ns)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ev in self.history.iter().rev().take_while(|e| e.rv > rv) {
            let k = &ev.key;
            if k.0 != resource || ns.is_some_and(|n| k.1 != n) {
                continue;
            }
            match (&ev.kind, &ev.old) {
                (EventType::Added, _) => {
                    snap.remove(k);
                }
                (_, Some(old)) => {
                    snap.insert(k.clone(), old.clone());
                }
                (_, None) => {}
            }
        }
        Ok(snap)
    }

    /// Events after `rv`, oldest first, or `TooOld` when some of them were dropped.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Arc<Event>>, TooOld> {
        if rv < self.complete_after {
            return Err(TooOld {
                requested: rv,
                oldest: self.complete_after,
            });
        }
        Ok(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    /// Forgets the history: a watch or exact list from any earlier resourceVersion gets 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.complete_after = self.rv;
    }

    fn record(
        &mut self,
        kind: EventType,
        key: Key,
        old: Option<Arc<Value>>,
        object: Arc<Value>,
    ) -> Arc<Event> {
        let ev = Arc::new(Event {
            rv: self.rv,
            kind,
            key,
            old,
            object,
        });
        if self.history.len() == self.cap {
            if let Some(dropped) = self.history.pop_front() {
                self.complete_after = dropped.rv;
            }
        }
        self.history.push_back(ev.clone());
        ev
    }

    /// Stores a new object under `key` with the next resourceVersion.
    pub(crate) fn insert(&mut self, key: Key, mut obj: Value) -> Arc<Event> {
        self.rv += 1;
        set_rv(&mut obj, self.rv);
        let obj = Arc::new(obj);
        let old = self.objects.insert(key.clone(), obj.clone());
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(kind, key, old, obj)
    }

    /// Removes `key`; the event carries its last state with a new resourceVersion.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Arc<Event>> {
        let old = self.objects.remove(key)?;
        self.rv += 1;
        let mut last = (*old).clone();
        set_rv(&mut last, self.rv);
        Some(self.record(EventType::Deleted, key.clone(), Some(old), Arc::new(last)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> Key {
        (Resource::Pods, "default".into(), name.into())
    }

    fn pod(name: &str, v: u32) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"}, "v": v})
    }

    #[test]
    fn history_expiry_and_snapshots() {
        let mut s = Store::new(3);
        s.insert(k("a"), pod("a", 1)); // rv 1
        s.insert(k("b"), pod("b", 1)); // rv 2
        s.insert(k("a"), pod("a", 2)); // rv 3
        assert_eq!(s.events_since(0).unwrap().len(), 3);
        s.remove(&k("b")); // rv 4, drops rv 1
        assert_eq!(s.rv(), 4);
        assert_eq!(
            s.events_since(0),
            Err(TooOld {
                requested: 0,
                oldest: 1
            })
        );
        let since = s.events_since(1).unwrap();
        assert_eq!(since.iter().map(|e| e.rv).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(since[2].kind, EventType::Deleted);
        assert_eq!(since[2].object["metadata"]["resourceVersion"], "4");
        // The state at rv 2: a at v1, b present.
        let snap = s.snapshot_at(Resource::Pods, None, 2).unwrap();
        assert_eq!(snap.len(), 2);
        assert_eq!(snap[&k("a")]["v"], 1);
        let now = s.snapshot_at(Resource::Pods, Some("default"), 4).unwrap();
        assert_eq!(now.len(), 1);
        s.compact();
        assert!(s.events_since(3).is_err());
        assert!(s.events_since(4).unwrap().is_empty());
        assert_eq!(
            ApiError::from(s.snapshot_at(Resource::Pods, None, 2).unwrap_err()).code,
            410
        );
    }

    #[test]
    fn lists_are_scoped_and_sorted() {
        let mut s = Store::new(10);
        s.insert(k("b"), pod("b", 1));
        s.insert(k("a"), pod("a", 1));
        s.insert((Resource::Pods, "other".into(), "c".into()), pod("c", 1));
        s.insert((Resource::Nodes, String::new(), "n".into()), pod("n", 1));
        let names: Vec<_> = s
            .list(Resource::Pods, None)
            .map(|(k, _)| k.2.clone())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(s.list(Resource::Pods, Some("other")).count(), 1);
        assert_eq!(s.list(Resource::Nodes, None).count(), 1);
    }
}
