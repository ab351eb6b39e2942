//! The client's bookkeeping of on-demand names (`XDS_ON_DEMAND=true`), sans-IO: which
//! names were asked for (pending) or answered (held), what each resolved to, which
//! unasked resources of a response are kept as dependents and which are ignored, and
//! which names have gone unused long enough to be unsubscribed. The clock is passed in.
//!
//! A name is what a lookup missed: `<network>/<ip>` (an address), a workload uid, or
//! `<namespace>/<hostname>`. The server answers it with the resource under its real
//! name, the asked name in the resource's `aliases`, or with a removal of the name.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

/// Bounds on what on-demand lookups can make the client hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookLimits {
    /// Names asked for and not yet answered.
    pub max_pending: usize,
    /// Names asked for, pending and answered together.
    pub max_names: usize,
    /// Unasked resources kept (a subscribed service's endpoints, a waypoint) per name
    /// held; at most [`BookLimits::max_dependents`] in all.
    pub dependents_per_name: usize,
    /// Unasked resources kept in all.
    pub max_dependents: usize,
}

impl Default for BookLimits {
    fn default() -> Self {
        BookLimits {
            max_pending: 4096,
            max_names: 16_384,
            dependents_per_name: 1024,
            max_dependents: 65_536,
        }
    }
}

/// What asking for a name came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// New: the name is to be sent to the server (it is in the outbox).
    Send,
    /// Already asked, not yet answered: wait for the answer.
    Pending,
    /// Answered already (the store holds what the server had; the server keeps it
    /// current): look again, do not wait.
    Answered,
    /// Over a bound: refused, nothing asked.
    Full,
}

/// What the book does with one resource of a response it did not ask for by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// It answers these asked names (by its name or one of its aliases).
    Asked(Vec<String>),
    /// Kept as a dependent of what is subscribed, within the bound.
    Dependent,
    /// Not kept: neither asked for nor within the bound of dependents.
    Ignore,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Name {
    answered: bool,
    /// Never swept (the local workload of a proxy that serves it).
    pinned: bool,
    last_used: Instant,
    /// The resource names that answered it.
    resources: BTreeSet<String>,
}

/// The on-demand names of one client, kept across streams.
#[derive(Debug)]
pub struct Book {
    limits: BookLimits,
    names: BTreeMap<String, Name>,
    pending: usize,
    /// Names to subscribe to on the live stream.
    outbox_subscribe: Vec<String>,
    /// Unasked resource names kept.
    dependents: HashSet<String>,
    /// Unasked resources not kept, in all.
    ignored: u64,
    /// Names asked for, in all (each sent once while held).
    requested: u64,
    /// Asks refused over a bound, in all.
    refused: u64,
}

/// What the book holds, for `/config_dump`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BookStatus {
    pub pending: usize,
    pub answered: usize,
    pub dependents: usize,
    pub requested_total: u64,
    pub ignored_total: u64,
    pub refused_total: u64,
}

impl Book {
    pub fn new(limits: BookLimits) -> Self {
        Book {
            limits,
            names: BTreeMap::new(),
            pending: 0,
            outbox_subscribe: Vec::new(),
            dependents: HashSet::new(),
            ignored: 0,
            requested: 0,
            refused: 0,
        }
    }

    /// A lookup of `name` missed the store: ask for it, or wait for an earlier ask.
    pub fn ask(&mut self, name: &str, now: Instant) -> Ask {
        self.ask_pinned(name, now, false)
    }

    /// As [`Book::ask`]; a `pin`ned name is never unsubscribed for idleness.
    pub fn ask_pinned(&mut self, name: &str, now: Instant, pin: bool) -> Ask {
        if let Some(n) = self.names.get_mut(name) {
            n.last_used = now;
            n.pinned |= pin;
            return if n.answered {
                Ask::Answered
            } else {
                Ask::Pending
            };
        }
        if self.pending >= self.limits.max_pending || self.names.len() >= self.limits.max_names {
            self.refused += 1;
            return Ask::Full;
        }
        self.names.insert(
            name.to_string(),
            Name {
                answered: false,
                pinned: pin,
                last_used: now,
                resources: BTreeSet::new(),
            },
        );
        self.pending += 1;
        self.requested += 1;
        self.outbox_subscribe.push(name.to_string());
        Ask::Send
    }

    /// A lookup found `name` (a name held): it stays subscribed.
    pub fn touch(&mut self, name: &str, now: Instant) {
        if let Some(n) = self.names.get_mut(name) {
            n.last_used = now;
        }
    }

    /// True once a response answering `name` was applied ([`Book::answered`]).
    pub fn is_answered(&self, name: &str) -> bool {
        self.names.get(name).is_some_and(|n| n.answered)
    }

    /// Whether `name` is held (asked for, pending or answered).
    pub fn is_asked(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// The names to subscribe to now on the live stream (each once).
    pub fn take_outbox(&mut self) -> Vec<String> {
        std::mem::take(&mut self.outbox_subscribe)
    }

    /// The names a new stream reports in `initial_resource_versions` with an empty
    /// version: every name asked for (a new stream carries them; the outbox empties).
    pub fn initial_names(&mut self) -> Vec<String> {
        self.outbox_subscribe.clear();
        self.names.keys().cloned().collect()
    }

    /// Decides about a resource named `name` with `aliases` that the client does not
    /// track yet: the asked names it answers, else a dependent within the bound, else
    /// ignored (counted; the first is logged).
    pub fn admit(&mut self, name: &str, aliases: &[String]) -> Admit {
        let asked = self.asked_by(name, aliases);
        if !asked.is_empty() {
            return Admit::Asked(asked);
        }
        if self.dependents.contains(name) {
            return Admit::Dependent;
        }
        let bound = self
            .names
            .len()
            .saturating_mul(self.limits.dependents_per_name)
            .min(self.limits.max_dependents);
        if self.dependents.len() < bound {
            self.dependents.insert(name.to_string());
            return Admit::Dependent;
        }
        if self.ignored == 0 {
            tracing::warn!(
                resource = %name,
                held = self.names.len(),
                dependents = self.dependents.len(),
                "xDS on-demand: the server sent a resource not asked for, beyond the bound of dependents: ignored (counted in /config_dump; logged once)"
            );
        }
        self.ignored += 1;
        Admit::Ignore
    }

    /// The asked names a resource named `name` with `aliases` answers.
    pub fn asked_by(&self, name: &str, aliases: &[String]) -> Vec<String> {
        std::iter::once(name)
            .chain(aliases.iter().map(String::as_str))
            .filter(|n| self.names.contains_key(*n))
            .map(str::to_string)
            .collect()
    }

    /// The asked names that a removal of `name` answers (the name itself).
    pub fn removal_answers(&mut self, name: &str) -> Option<String> {
        self.dependents.remove(name);
        self.names.contains_key(name).then(|| name.to_string())
    }

    /// A response answering `asked` with `resource` (`None`: removed) was applied.
    pub fn answered(&mut self, asked: &str, resource: Option<&str>) {
        if let Some(n) = self.names.get_mut(asked) {
            if !n.answered {
                n.answered = true;
                self.pending -= 1;
            }
            if let Some(r) = resource {
                n.resources.insert(r.to_string());
            }
        }
    }

    /// Names unused for `idle` (answered or not): dropped here, to unsubscribe; with the
    /// resources they resolved to that no remaining name resolves to, to remove from the
    /// store.
    pub fn sweep(&mut self, now: Instant, idle: Duration) -> (Vec<String>, Vec<String>) {
        let stale: Vec<String> = self
            .names
            .iter()
            .filter(|(_, n)| !n.pinned && now.saturating_duration_since(n.last_used) >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        let mut freed = BTreeSet::new();
        for name in &stale {
            if let Some(n) = self.names.remove(name) {
                if !n.answered {
                    self.pending -= 1;
                }
                freed.extend(n.resources);
            }
        }
        let still: BTreeSet<&String> = self.names.values().flat_map(|n| &n.resources).collect();
        let freed: Vec<String> = freed.into_iter().filter(|r| !still.contains(r)).collect();
        self.outbox_subscribe.retain(|n| !stale.contains(n));
        (stale, freed)
    }

    pub fn status(&self) -> BookStatus {
        BookStatus {
            pending: self.pending,
            answered: self.names.len() - self.pending,
            dependents: self.dependents.len(),
            requested_total: self.requested,
            ignored_total: self.ignored,
            refused_total: self.refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(limits: BookLimits) -> Book {
        Book::new(limits)
    }

    #[test]
    fn asks_are_deduplicated_and_answered_once_applied() {
        let t = Instant::now();
        let mut b = book(BookLimits::default());
        // (what is asked, expected outcome)
        let table = [
            ("/10.0.0.5", Ask::Send),
            ("/10.0.0.5", Ask::Pending),
            ("ns/svc.ns.svc.cluster.local", Ask::Send),
        ];
        for (name, want) in table {
            assert_eq!(b.ask(name, t), want, "{name}");
        }
        assert_eq!(
            b.take_outbox(),
            ["/10.0.0.5", "ns/svc.ns.svc.cluster.local"]
        );
        assert!(b.take_outbox().is_empty(), "each name is sent once");
        assert!(!b.is_answered("/10.0.0.5"));
        // A response carrying the workload with the asked name as an alias.
        let admit = b.admit("c//v1/Pod/ns/a", &["/10.0.0.5".to_string()]);
        assert_eq!(admit, Admit::Asked(vec!["/10.0.0.5".into()]));
        assert!(!b.is_answered("/10.0.0.5"), "not before it is applied");
        b.answered("/10.0.0.5", Some("c//v1/Pod/ns/a"));
        assert!(b.is_answered("/10.0.0.5"));
        assert_eq!(b.ask("/10.0.0.5", t), Ask::Answered);
        // A removal answers too.
        assert_eq!(
            b.removal_answers("ns/svc.ns.svc.cluster.local").as_deref(),
            Some("ns/svc.ns.svc.cluster.local")
        );
        assert_eq!(b.removal_answers("other"), None);
        let s = b.status();
        assert_eq!((s.pending, s.answered, s.requested_total), (1, 1, 2));
    }

    #[test]
    fn pending_and_held_names_are_bounded() {
        let t = Instant::now();
        let limits = BookLimits {
            max_pending: 2,
            max_names: 3,
            ..BookLimits::default()
        };
        let mut b = book(limits);
        assert_eq!(b.ask("a", t), Ask::Send);
        assert_eq!(b.ask("b", t), Ask::Send);
        assert_eq!(b.ask("c", t), Ask::Full, "two pending at most");
        b.answered("a", None);
        assert_eq!(b.ask("c", t), Ask::Send);
        b.answered("b", None);
        b.answered("c", None);
        assert_eq!(b.ask("d", t), Ask::Full, "three names at most");
        assert_eq!(b.status().refused_total, 2);
        assert_eq!(b.take_outbox(), ["a", "b", "c"]);
    }

    #[test]
    fn unasked_resources_are_kept_within_the_bound_of_dependents_and_counted() {
        let t = Instant::now();
        let limits = BookLimits {
            dependents_per_name: 3,
            max_dependents: 5,
            ..BookLimits::default()
        };
        let mut b = book(limits);
        // Nothing asked: nothing unasked is kept.
        assert_eq!(b.admit("x", &[]), Admit::Ignore);
        b.ask("ns/svc", t);
        let kept: Vec<Admit> = (0..10).map(|i| b.admit(&format!("w{i}"), &[])).collect();
        assert_eq!(kept.iter().filter(|a| **a == Admit::Dependent).count(), 3);
        // A dependent already kept stays kept (its updates).
        assert_eq!(b.admit("w0", &[]), Admit::Dependent);
        b.ask("ns/svc2", t);
        let more = (10..20)
            .filter(|i| b.admit(&format!("w{i}"), &[]) == Admit::Dependent)
            .count();
        assert_eq!(more, 2, "5 dependents in all, whatever is asked");
        assert_eq!(b.status().ignored_total, 1 + 7 + 8);
        // A removal frees a dependent's place.
        b.removal_answers("w0");
        assert_eq!(b.admit("w99", &[]), Admit::Dependent);
    }

    #[test]
    fn idle_names_are_dropped_with_what_only_they_resolved_to() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(60);
        let mut b = book(BookLimits::default());
        b.ask("/10.0.0.5", t0);
        b.ask("c//v1/Pod/ns/a", t0);
        b.ask("/10.0.0.6", t0);
        b.ask("/10.0.0.7", t0);
        b.ask_pinned("c//v1/Pod/ns/local", t0, true);
        b.answered("/10.0.0.5", Some("c//v1/Pod/ns/a"));
        b.answered("c//v1/Pod/ns/a", Some("c//v1/Pod/ns/a"));
        b.answered("/10.0.0.6", Some("c//v1/Pod/ns/b"));
        // Used again later: kept.
        b.touch("c//v1/Pod/ns/a", t0 + Duration::from_secs(50));
        let (unsub, freed) = b.sweep(t0 + idle, idle);
        assert_eq!(unsub, ["/10.0.0.5", "/10.0.0.6", "/10.0.0.7"]);
        // ns/a is still what the uid resolves to; ns/b is freed.
        assert_eq!(freed, ["c//v1/Pod/ns/b"]);
        // /10.0.0.7 idled while pending: dropped too; the pinned name stays.
        assert_eq!(b.status().pending, 1);
        assert_eq!(b.initial_names(), ["c//v1/Pod/ns/a", "c//v1/Pod/ns/local"]);
        let (unsub, freed) = b.sweep(t0 + idle + Duration::from_secs(50), idle);
        assert_eq!(
            (unsub, freed),
            (
                vec!["c//v1/Pod/ns/a".to_string()],
                vec!["c//v1/Pod/ns/a".to_string()]
            )
        );
    }

    #[test]
    fn a_new_stream_carries_every_name_and_empties_the_outbox() {
        let t = Instant::now();
        let mut b = book(BookLimits::default());
        b.ask("a", t);
        b.ask("b", t);
        b.answered("a", Some("ra"));
        assert_eq!(b.initial_names(), ["a", "b"]);
        assert!(b.take_outbox().is_empty());
    }
}
