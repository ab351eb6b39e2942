//! The node proxy's ZDS state machine, sans IO: which pods have a running proxy, which failed
//! to start and wait for a retry, and how a (re)connection's snapshot is reconciled.
//!
//! The caller owns the sockets and the per-pod proxies. It feeds every decoded message to
//! [`WorkloadStates::on_message`], executes the returned [`Action`]s in order, reports each
//! start's outcome with [`WorkloadStates::on_start_result`], ACKs (or NACKs) the message, and
//! calls [`WorkloadStates::retry_pending`] every [`RETRY_INTERVAL`].
//!
//! Rules (Istio's ZDS semantics):
//! - A new connection ([`WorkloadStates::on_connect`]) starts a new snapshot: the set of uids
//!   seen so far and the pending set are cleared; running proxies survive.
//! - `Add` for a running uid with the same netns identity is a no-op; with a different one
//!   (sandbox recreated) the old proxy is stopped and a new one started.
//! - `Keep` is only valid before `SnapshotSent`; a second `SnapshotSent` is invalid. Both are
//!   fatal protocol errors ([`StateError::is_fatal`]).
//! - `SnapshotSent` stops every proxy whose uid was not named (Add or Keep) since the connect.
//! - `Del` after the snapshot stops the proxy; before it, it only forgets the uid (seen and
//!   pending), so the snapshot reconcile stops it.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::netns::{Netns, NetnsId};
use crate::proto::WorkloadInfo;
use crate::protocol::Incoming;

/// How often pods whose proxy failed to start are retried.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// What the caller must do, in order.
#[derive(Debug, Clone)]
pub enum Action {
    /// Start the pod's proxy in `netns`, then report with
    /// [`WorkloadStates::on_start_result`].
    Start {
        uid: String,
        info: WorkloadInfo,
        netns: Arc<Netns>,
    },
    /// Stop (drain immediately) the pod's proxy.
    Stop { uid: String },
}

/// A message the state machine refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// `KeepWorkload` after `SnapshotSent`.
    #[error("protocol error: KeepWorkload for {uid:?} after SnapshotSent")]
    KeepAfterSnapshot { uid: String },
    /// A second `SnapshotSent` on one connection.
    #[error("protocol error: SnapshotSent received twice")]
    DuplicateSnapshot,
    /// The netns fd of an `AddWorkload` could not be inspected.
    #[error("cannot read the netns of workload {uid:?}: {source}")]
    Netns {
        uid: String,
        #[source]
        source: io::Error,
    },
}

impl StateError {
    /// Fatal errors break the protocol: NACK, then stop the workload manager. Others: NACK
    /// and go on.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            StateError::KeepAfterSnapshot { .. } | StateError::DuplicateSnapshot
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// A `Start` was handed out; its result is not known yet.
    Starting,
    /// The proxy runs.
    Running,
    /// The start failed; retried by [`WorkloadStates::retry_pending`].
    Pending,
}

#[derive(Debug)]
struct Entry {
    info: WorkloadInfo,
    netns: Arc<Netns>,
    status: Status,
}

impl Entry {
    /// Whether the caller may have a proxy for it (and so must be told to stop it).
    fn may_run(&self) -> bool {
        self.status != Status::Pending
    }

    fn start(&mut self, uid: &str) -> Action {
        self.status = Status::Starting;
        Action::Start {
            uid: uid.to_owned(),
            info: self.info.clone(),
            netns: self.netns.clone(),
        }
    }
}

/// The node proxy's view of its pods across ZDS connections.
#[derive(Debug, Default)]
pub struct WorkloadStates {
    /// By uid; a BTreeMap so actions come out in a stable order.
    workloads: BTreeMap<String, Entry>,
    /// Uids named by Add or Keep since the connection began.
    seen: BTreeSet<String>,
    snapshot_received: bool,
}

impl WorkloadStates {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new ZDS connection: a new snapshot begins. Forgets the seen set and the pending pods
    /// (the agent replays them); running proxies are kept until the snapshot reconcile.
    pub fn on_connect(&mut self) {
        self.seen.clear();
        self.snapshot_received = false;
        self.workloads.retain(|_, e| e.status != Status::Pending);
    }

    /// Applies one message; returns what to do, in order.
    pub fn on_message(&mut self, msg: Incoming) -> Result<Vec<Action>, StateError> {
        match msg {
            Incoming::Add { uid, info, netns } => {
                let netns = Netns::from_fd(netns).map_err(|source| StateError::Netns {
                    uid: uid.clone(),
                    source,
                })?;
                Ok(self.add(uid, info, netns))
            }
            Incoming::Keep { uid } => {
                if self.snapshot_received {
                    return Err(StateError::KeepAfterSnapshot { uid });
                }
                self.seen.insert(uid);
                Ok(Vec::new())
            }
            Incoming::Del { uid } => Ok(self.del(&uid)),
            Incoming::SnapshotSent => self.snapshot_sent(),
        }
    }

    fn add(&mut self, uid: String, info: WorkloadInfo, netns: Netns) -> Vec<Action> {
        if !self.snapshot_received {
            self.seen.insert(uid.clone());
        }
        let mut actions = Vec::new();
        if let Some(existing) = self.workloads.get_mut(&uid) {
            match existing.status {
                Status::Running | Status::Starting if existing.netns.id() == netns.id() => {
                    // Replayed or retried Add for the same sandbox: nothing to do.
                    return actions;
                }
                Status::Running | Status::Starting => {
                    // The sandbox was recreated: replace the proxy.
                    actions.push(Action::Stop { uid: uid.clone() });
                }
                // A failed start: try again now, with whatever netns the agent sends.
                Status::Pending => {}
            }
        }
        let mut entry = Entry {
            info,
            netns: Arc::new(netns),
            status: Status::Starting,
        };
        actions.push(entry.start(&uid));
        self.workloads.insert(uid, entry);
        actions
    }

    fn del(&mut self, uid: &str) -> Vec<Action> {
        if !self.snapshot_received {
            // The snapshot reconcile will stop a running proxy it was not told about.
            self.seen.remove(uid);
            if self
                .workloads
                .get(uid)
                .is_some_and(|e| e.status == Status::Pending)
            {
                self.workloads.remove(uid);
            }
            return Vec::new();
        }
        match self.workloads.remove(uid) {
            Some(e) if e.may_run() => vec![Action::Stop {
                uid: uid.to_owned(),
            }],
            _ => Vec::new(),
        }
    }

    fn snapshot_sent(&mut self) -> Result<Vec<Action>, StateError> {
        if self.snapshot_received {
            return Err(StateError::DuplicateSnapshot);
        }
        let stale: Vec<String> = self
            .workloads
            .keys()
            .filter(|uid| !self.seen.contains(*uid))
            .cloned()
            .collect();
        let mut actions = Vec::new();
        for uid in stale {
            if let Some(e) = self.workloads.remove(&uid) {
                if e.may_run() {
                    actions.push(Action::Stop { uid });
                }
            }
        }
        self.seen.clear();
        self.snapshot_received = true;
        Ok(actions)
    }

    /// The outcome of an [`Action::Start`]. A failed start makes the pod pending (NACK it with
    /// the error; it is retried by [`WorkloadStates::retry_pending`]). Results for uids that
    /// are no longer starting (deleted or replaced meanwhile) are ignored.
    pub fn on_start_result(&mut self, uid: &str, ok: bool) {
        if let Some(e) = self.workloads.get_mut(uid) {
            if e.status == Status::Starting {
                e.status = if ok { Status::Running } else { Status::Pending };
            }
        }
    }

    /// Start actions for every pending pod (call every [`RETRY_INTERVAL`]).
    pub fn retry_pending(&mut self) -> Vec<Action> {
        self.workloads
            .iter_mut()
            .filter(|(_, e)| e.status == Status::Pending)
            .map(|(uid, e)| e.start(uid))
            .collect()
    }

    /// Whether this connection's `SnapshotSent` has arrived.
    pub fn snapshot_received(&self) -> bool {
        self.snapshot_received
    }

    /// Pods whose proxy failed to start and awaits a retry.
    pub fn pending_count(&self) -> usize {
        self.count(Status::Pending)
    }

    /// The pods awaiting a retry, with what the agent said about them.
    pub fn pending(&self) -> impl Iterator<Item = (&str, &WorkloadInfo)> {
        self.workloads
            .iter()
            .filter(|(_, e)| e.status == Status::Pending)
            .map(|(uid, e)| (uid.as_str(), &e.info))
    }

    /// Pods with a running proxy.
    pub fn active_count(&self) -> usize {
        self.count(Status::Running)
    }

    /// Ready: the snapshot has arrived and every known pod's proxy runs (none pending, none
    /// with a start still unreported).
    pub fn is_ready(&self) -> bool {
        self.snapshot_received && self.workloads.values().all(|e| e.status == Status::Running)
    }

    /// The netns identity of a known pod, and whether its proxy runs.
    pub fn netns_of(&self, uid: &str) -> Option<(NetnsId, bool)> {
        self.workloads
            .get(uid)
            .map(|e| (e.netns.id(), e.status == Status::Running))
    }

    fn count(&self, status: Status) -> usize {
        self.workloads
            .values()
            .filter(|e| e.status == status)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::OwnedFd;

    // /dev/null and /dev/zero stand in for two different netns: only (inode, dev) matters.
    fn fd(path: &str) -> OwnedFd {
        File::open(path).unwrap().into()
    }

    fn info(name: &str) -> WorkloadInfo {
        WorkloadInfo {
            name: name.into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        }
    }

    fn add(uid: &str, ns: &str) -> Incoming {
        Incoming::Add {
            uid: uid.into(),
            info: info(uid),
            netns: fd(ns),
        }
    }

    fn keep(uid: &str) -> Incoming {
        Incoming::Keep { uid: uid.into() }
    }

    fn del(uid: &str) -> Incoming {
        Incoming::Del { uid: uid.into() }
    }

    /// Compact form of actions: "start:uid" / "stop:uid".
    fn summary(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Start { uid, .. } => format!("start:{uid}"),
                Action::Stop { uid } => format!("stop:{uid}"),
            })
            .collect()
    }

    /// Applies a message and reports every start as `ok`.
    fn apply(s: &mut WorkloadStates, msg: Incoming, ok: bool) -> Vec<String> {
        let actions = s.on_message(msg).unwrap();
        for a in &actions {
            if let Action::Start { uid, .. } = a {
                s.on_start_result(uid, ok);
            }
        }
        summary(&actions)
    }

    fn connected_with_snapshot(uids: &[&str]) -> WorkloadStates {
        let mut s = WorkloadStates::new();
        s.on_connect();
        for uid in uids {
            assert_eq!(
                apply(&mut s, add(uid, "/dev/null"), true),
                [format!("start:{uid}")]
            );
        }
        assert!(apply(&mut s, Incoming::SnapshotSent, true).is_empty());
        s
    }

    #[test]
    fn start_carries_info_and_netns() {
        let mut s = WorkloadStates::new();
        s.on_connect();
        let actions = s.on_message(add("p1", "/dev/null")).unwrap();
        let [Action::Start {
            uid,
            info: i,
            netns,
        }] = &actions[..]
        else {
            panic!("{actions:?}");
        };
        assert_eq!(uid, "p1");
        assert_eq!(i, &info("p1"));
        assert_eq!(netns.id(), Netns::from_fd(fd("/dev/null")).unwrap().id());
        assert!(!s.is_ready(), "a start not yet reported is not ready");
        s.on_start_result("p1", true);
        assert!(!s.is_ready(), "no snapshot yet");
        apply(&mut s, Incoming::SnapshotSent, true);
        assert!(s.is_ready());
        assert_eq!(s.netns_of("p1").map(|(_, running)| running), Some(true));
    }

    #[test]
    fn idempotent_add() {
        let mut s = connected_with_snapshot(&["p1"]);
        // Same netns identity (another fd for it): nothing to do, after the snapshot too.
        assert!(apply(&mut s, add("p1", "/dev/null"), true).is_empty());
        // And in a replayed snapshot after a reconnect.
        s.on_connect();
        assert!(apply(&mut s, add("p1", "/dev/null"), true).is_empty());
        assert!(apply(&mut s, Incoming::SnapshotSent, true).is_empty());
        assert_eq!(s.active_count(), 1);
        assert!(s.is_ready());
    }

    #[test]
    fn replaced_netns() {
        let mut s = connected_with_snapshot(&["p1"]);
        let before = s.netns_of("p1").unwrap().0;
        assert_eq!(
            apply(&mut s, add("p1", "/dev/zero"), true),
            ["stop:p1", "start:p1"]
        );
        let after = s.netns_of("p1").unwrap().0;
        assert_ne!(before, after);
        assert_eq!(s.active_count(), 1);
    }

    #[test]
    fn keep_before_snapshot_protects_keep_after_is_fatal() {
        let mut s = connected_with_snapshot(&["p1", "p2"]);
        s.on_connect();
        assert!(!s.snapshot_received());
        assert!(apply(&mut s, keep("p1"), true).is_empty());
        // p2 was neither added nor kept.
        assert_eq!(apply(&mut s, Incoming::SnapshotSent, true), ["stop:p2"]);
        assert_eq!(s.active_count(), 1);
        let err = s.on_message(keep("p1")).unwrap_err();
        assert!(matches!(err, StateError::KeepAfterSnapshot { ref uid } if uid == "p1"));
        assert!(err.is_fatal());
    }

    #[test]
    fn second_snapshot_is_fatal() {
        let mut s = connected_with_snapshot(&[]);
        let err = s.on_message(Incoming::SnapshotSent).unwrap_err();
        assert!(matches!(err, StateError::DuplicateSnapshot));
        assert!(err.is_fatal());
        // A new connection gets a new snapshot.
        s.on_connect();
        assert!(s.on_message(Incoming::SnapshotSent).unwrap().is_empty());
    }

    #[test]
    fn delete_before_snapshot_is_reconciled() {
        let mut s = connected_with_snapshot(&["p1", "p2"]);
        s.on_connect();
        assert!(apply(&mut s, add("p1", "/dev/null"), true).is_empty());
        assert!(apply(&mut s, add("p2", "/dev/null"), true).is_empty());
        // Del before the snapshot: no immediate stop...
        assert!(apply(&mut s, del("p1"), true).is_empty());
        assert_eq!(s.active_count(), 2);
        // ...the reconcile stops it.
        assert_eq!(apply(&mut s, Incoming::SnapshotSent, true), ["stop:p1"]);
        assert_eq!(s.active_count(), 1);
        assert!(s.netns_of("p1").is_none());
    }

    #[test]
    fn delete_after_snapshot_stops() {
        let mut s = connected_with_snapshot(&["p1"]);
        assert_eq!(apply(&mut s, del("p1"), true), ["stop:p1"]);
        assert_eq!(s.active_count(), 0);
        // Unknown uid: nothing.
        assert!(apply(&mut s, del("p1"), true).is_empty());
        assert!(s.is_ready());
    }

    #[test]
    fn snapshot_reconcile() {
        let mut s = connected_with_snapshot(&["a", "b", "c", "d"]);
        s.on_connect();
        assert!(!s.is_ready(), "not ready until the new snapshot");
        assert!(apply(&mut s, add("b", "/dev/null"), true).is_empty());
        assert!(apply(&mut s, keep("d"), true).is_empty());
        assert_eq!(apply(&mut s, add("e", "/dev/null"), true), ["start:e"]);
        assert_eq!(
            apply(&mut s, Incoming::SnapshotSent, true),
            ["stop:a", "stop:c"]
        );
        assert_eq!(s.active_count(), 3);
        assert!(s.is_ready());
    }

    #[test]
    fn pending_retry() {
        let mut s = WorkloadStates::new();
        s.on_connect();
        assert_eq!(apply(&mut s, add("p1", "/dev/null"), false), ["start:p1"]);
        assert_eq!(s.pending_count(), 1);
        assert_eq!(s.active_count(), 0);
        apply(&mut s, Incoming::SnapshotSent, true);
        assert!(s.snapshot_received());
        assert!(!s.is_ready(), "pending pods block readiness");

        // First retry fails again, second succeeds.
        let retry = s.retry_pending();
        assert_eq!(summary(&retry), ["start:p1"]);
        assert_eq!(s.pending_count(), 0, "in flight, not pending");
        s.on_start_result("p1", false);
        assert_eq!(s.pending_count(), 1);
        let retry = s.retry_pending();
        assert_eq!(summary(&retry), ["start:p1"]);
        s.on_start_result("p1", true);
        assert_eq!(s.pending_count(), 0);
        assert_eq!(s.active_count(), 1);
        assert!(s.is_ready());
        assert!(s.retry_pending().is_empty());
    }

    #[test]
    fn pending_is_forgotten_on_delete_and_reconnect() {
        let mut s = connected_with_snapshot(&[]);
        apply(&mut s, add("p1", "/dev/null"), false);
        // Del after the snapshot of a pending pod: nothing runs, so no Stop.
        assert!(apply(&mut s, del("p1"), true).is_empty());
        assert_eq!(s.pending_count(), 0);

        apply(&mut s, add("p2", "/dev/null"), false);
        s.on_connect();
        assert_eq!(s.pending_count(), 0, "reconnect clears the pending set");
        assert!(s.retry_pending().is_empty());

        // Del before the snapshot drops a pending pod too.
        apply(&mut s, add("p3", "/dev/null"), false);
        assert!(apply(&mut s, del("p3"), true).is_empty());
        assert_eq!(s.pending_count(), 0);
        assert!(apply(&mut s, Incoming::SnapshotSent, true).is_empty());
        assert!(s.is_ready());
    }

    #[test]
    fn add_for_pending_pod_retries_now() {
        let mut s = connected_with_snapshot(&[]);
        apply(&mut s, add("p1", "/dev/null"), false);
        assert_eq!(apply(&mut s, add("p1", "/dev/zero"), true), ["start:p1"]);
        assert_eq!(s.active_count(), 1);
        assert_eq!(s.pending_count(), 0);
    }

    #[test]
    fn stale_start_results_are_ignored() {
        let mut s = connected_with_snapshot(&["p1"]);
        s.on_start_result("p1", false); // already running: ignored
        assert_eq!(s.active_count(), 1);
        s.on_start_result("nope", true);
        assert_eq!(s.active_count(), 1);
    }
}
