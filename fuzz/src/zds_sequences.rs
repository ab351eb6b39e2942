//! Sequences of ZDS events into both sides' state machines: the node proxy's
//! `ambit_zds::WorkloadStates` and the node agent's `ambit_agent::zds_session::Session`.
//! Shared by the `zds_proxy_states` and `zds_agent_session` targets and by the seed replay
//! test (`tests/seeds.rs`), so a seed is replayed exactly as the fuzzer runs it.
//!
//! Each input is a list of operations, one opcode byte each, some followed by argument
//! bytes; a missing argument reads as 0, so every input is a valid sequence. The model kept
//! beside each machine is what a correct caller would believe; every step is checked
//! against it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use ambit_agent::zds_session::{
    Event, MessageKind, Request, RequestId, Session, SessionOptions, SnapshotEntry,
};
use ambit_zds::proto::WorkloadInfo;
use ambit_zds::protocol::{decode_request, encode_ack, encode_hello};
use ambit_zds::{Action, Incoming, StateError, WorkloadStates};

/// Reads opcodes and arguments; past the end everything is 0.
struct Input<'a> {
    bytes: &'a [u8],
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.bytes.len());
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        head
    }

    fn done(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Few uids, so operations collide.
fn uid(b: u8) -> String {
    format!("pod-{}", b % 4)
}

fn info(uid: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: uid.to_owned(),
        namespace: "ns".into(),
        service_account: "sa".into(),
    }
}

/// Three files with distinct (inode, dev) stand in for three network namespaces.
fn netns_fd(b: u8) -> OwnedFd {
    let path = ["/dev/null", "/dev/zero", "/dev/full"][usize::from(b % 3)];
    File::open(path).expect("open a stand-in netns").into()
}

/// What a replay of a proxy-side sequence reached (seeds assert they get somewhere).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProxyStats {
    pub starts: usize,
    pub stops: usize,
    pub failed_starts: usize,
    pub snapshots: usize,
    pub fatal_errors: usize,
    pub ready: bool,
}

/// The node proxy's state machine under a sequence of messages, connects, retries and
/// start outcomes.
///
/// Opcodes (`% 8`): 0 Add(uid, netns, start ok?), 1 Keep(uid), 2 Del(uid), 3 SnapshotSent,
/// 4 reconnect, 5 retry pending (start ok?), 6 a raw datagram (fd count, length, bytes)
/// through `decode_request`, 7 a no-op.
pub fn proxy(data: &[u8]) -> ProxyStats {
    let mut input = Input { bytes: data };
    let mut s = WorkloadStates::new();
    let mut stats = ProxyStats::default();
    // The caller's view: pods with a running proxy, and uids named since the connect.
    let mut live: BTreeSet<String> = BTreeSet::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    s.on_connect();
    while !input.done() {
        let op = input.byte() % 8;
        let (msg, ok) = match op {
            0 => {
                let u = uid(input.byte());
                let fd = netns_fd(input.byte());
                let ok = !input.byte().is_multiple_of(4);
                (
                    Some(Incoming::Add {
                        info: info(&u),
                        uid: u,
                        netns: fd,
                    }),
                    ok,
                )
            }
            1 => (
                Some(Incoming::Keep {
                    uid: uid(input.byte()),
                }),
                true,
            ),
            2 => (
                Some(Incoming::Del {
                    uid: uid(input.byte()),
                }),
                true,
            ),
            3 => (Some(Incoming::SnapshotSent), true),
            4 => {
                s.on_connect();
                seen.clear();
                assert!(!s.snapshot_received() && !s.is_ready());
                assert_eq!(s.pending_count(), 0, "a reconnect forgets pending pods");
                (None, true)
            }
            5 => {
                let ok = input.byte().is_multiple_of(2);
                let actions = s.retry_pending();
                assert!(actions.iter().all(|a| matches!(a, Action::Start { .. })));
                apply(&mut s, actions, ok, &mut live, &mut stats);
                (None, true)
            }
            6 => {
                let fds = usize::from(input.byte() % 3);
                let len = usize::from(input.byte());
                let bytes = input.take(len).to_vec();
                let fds = (0..fds).map(|i| netns_fd(i as u8)).collect();
                (decode_request(&bytes, fds).ok(), true)
            }
            _ => (None, true),
        };
        if let Some(msg) = msg {
            let before = s.snapshot_received();
            let named = match &msg {
                Incoming::Add { uid, .. } | Incoming::Keep { uid } => Some((uid.clone(), true)),
                Incoming::Del { uid } => Some((uid.clone(), false)),
                Incoming::SnapshotSent => None,
            };
            let kind = msg.kind();
            match s.on_message(msg) {
                Ok(actions) => {
                    if !before {
                        match named {
                            Some((u, true)) => {
                                seen.insert(u);
                            }
                            Some((u, false)) => {
                                seen.remove(&u);
                            }
                            None => {}
                        }
                    }
                    apply(&mut s, actions, ok, &mut live, &mut stats);
                    if kind == "SnapshotSent" {
                        stats.snapshots += 1;
                        assert!(s.snapshot_received());
                        // The reconcile keeps only what the snapshot named.
                        assert!(live.is_subset(&seen), "live {live:?} not named {seen:?}");
                        seen.clear();
                    }
                }
                Err(e) => {
                    let fatal = e.is_fatal();
                    match e {
                        StateError::KeepAfterSnapshot { .. } => {
                            assert!(before && kind == "KeepWorkload")
                        }
                        StateError::DuplicateSnapshot => assert!(before && kind == "SnapshotSent"),
                        StateError::Netns { .. } => assert!(!fatal),
                        _ => {}
                    }
                    if fatal {
                        stats.fatal_errors += 1;
                    }
                }
            }
        }
        assert_eq!(s.active_count(), live.len(), "running proxies");
        for u in &live {
            assert!(matches!(s.netns_of(u), Some((_, true))), "{u} should run");
        }
        if s.is_ready() {
            assert!(s.snapshot_received() && s.pending_count() == 0);
            stats.ready = true;
        }
    }
    stats
}

/// Carries out actions as a caller would, starts succeeding iff `ok`.
fn apply(
    s: &mut WorkloadStates,
    actions: Vec<Action>,
    ok: bool,
    live: &mut BTreeSet<String>,
    stats: &mut ProxyStats,
) {
    for action in actions {
        match action {
            Action::Start { uid, .. } => {
                assert!(!live.contains(&uid), "start of {uid} while its proxy runs");
                stats.starts += 1;
                s.on_start_result(&uid, ok);
                if ok {
                    live.insert(uid);
                } else {
                    stats.failed_starts += 1;
                }
            }
            Action::Stop { uid } => {
                assert!(live.remove(&uid), "stop of {uid}, which does not run");
                stats.stops += 1;
            }
        }
    }
}

/// What a replay of an agent-side sequence reached.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AgentStats {
    pub sent: usize,
    pub acked: usize,
    pub nacked: usize,
    pub timed_out: usize,
    pub late_acks: usize,
    pub snapshots: usize,
    pub closed_early: bool,
}

const OPTS: SessionOptions = SessionOptions {
    hello_timeout: Duration::from_secs(5),
    ack_timeout: Duration::from_secs(5),
    max_owed_acks: 3,
};

/// The node agent's session under a sequence of datagrams, requests, sends and clock
/// ticks. The "fd" is a number, so nothing is opened.
///
/// Opcodes (`% 10`): 0 hello, 1 ACK, 2 NACK, 3 a raw datagram (length, bytes), 4 begin a
/// snapshot (n entries, each Add or Keep), 5 submit Add(uid), 6 submit Del(uid), 7 send
/// (poll_transmit), 8 the clock moves (by byte × 100 ms) and timeouts fire, 9 the peer
/// hangs up. At the end the driver closes the session.
pub fn agent(data: &[u8]) -> AgentStats {
    let mut input = Input { bytes: data };
    let mut now = Instant::now();
    let mut s: Session<u32> = Session::new(OPTS, now);
    let mut stats = AgentStats::default();
    // Every submitted request, and whether its outcome came.
    let mut outcomes: BTreeMap<RequestId, bool> = BTreeMap::new();
    let mut closed = false;
    let mut in_flight = false;
    let mut next_fd = 0u32;
    while !input.done() {
        match input.byte() % 10 {
            0 => s.on_datagram(&encode_hello()),
            1 => s.on_datagram(&encode_ack(None)),
            2 => s.on_datagram(&encode_ack(Some("failure to start proxy : fuzz"))),
            3 => {
                let len = usize::from(input.byte());
                let bytes = input.take(len).to_vec();
                s.on_datagram(&bytes);
            }
            4 => {
                let n = input.byte() % 4;
                let entries: Vec<SnapshotEntry<u32>> = (0..n)
                    .map(|_| {
                        let b = input.byte();
                        if b.is_multiple_of(2) {
                            next_fd += 1;
                            SnapshotEntry::Add {
                                uid: uid(b / 2),
                                info: info(&uid(b / 2)),
                                netns: next_fd,
                            }
                        } else {
                            SnapshotEntry::Keep { uid: uid(b / 2) }
                        }
                    })
                    .collect();
                let allowed = s.said_hello() && !s.snapshot_done();
                let began = s.begin_snapshot(entries);
                assert!(!began || allowed, "a snapshot out of turn");
            }
            5 | 6 => {
                let add = input.byte();
                let u = uid(input.byte());
                let request = if add.is_multiple_of(2) {
                    next_fd += 1;
                    Request::Add {
                        info: info(&u),
                        uid: u,
                        netns: next_fd,
                    }
                } else {
                    Request::Del { uid: u }
                };
                let id = s.submit(request);
                assert!(outcomes.insert(id, false).is_none(), "request id reused");
            }
            7 => {
                if let Some(t) = s.poll_transmit(now) {
                    assert!(!closed, "sent after close");
                    assert!(!in_flight, "two messages in flight");
                    in_flight = true;
                    stats.sent += 1;
                    assert_eq!(t.fd.is_some(), t.kind == MessageKind::Add);
                    let fds = t.fd.map(|_| vec![netns_fd(0)]).unwrap_or_default();
                    let msg = decode_request(&t.bytes, fds).expect("the agent sends valid ZDS");
                    assert_eq!(msg.kind(), t.kind.name());
                    assert_eq!(msg.uid().map(str::to_owned), t.uid);
                    assert!(bytes_fit(&t.bytes));
                    assert!(s.poll_timeout().is_some(), "an ack is due");
                }
            }
            8 => {
                now += Duration::from_millis(100) * u32::from(input.byte());
                s.on_timeout(now);
            }
            _ => s.on_peer_closed(),
        }
        drain(
            &mut s,
            &mut outcomes,
            &mut closed,
            &mut in_flight,
            &mut stats,
        );
        if closed {
            assert!(s.is_closed() && s.poll_timeout().is_none());
        }
    }
    stats.closed_early = closed;
    s.close(ambit_agent::zds_session::CloseReason::Shutdown);
    drain(
        &mut s,
        &mut outcomes,
        &mut closed,
        &mut in_flight,
        &mut stats,
    );
    assert!(closed, "close emits Closed");
    let missing: Vec<_> = outcomes.iter().filter(|(_, done)| !**done).collect();
    assert!(
        missing.is_empty(),
        "requests without an outcome: {missing:?}"
    );
    stats
}

fn bytes_fit(bytes: &[u8]) -> bool {
    // Short uids always fit Istio's 1024-byte read buffer.
    bytes.len() <= ambit_zds::wire::MAX_MESSAGE_LEN
}

fn drain(
    s: &mut Session<u32>,
    outcomes: &mut BTreeMap<RequestId, bool>,
    closed: &mut bool,
    in_flight: &mut bool,
    stats: &mut AgentStats,
) {
    while let Some(event) = s.poll_event() {
        match event {
            // Any version is taken (raw datagrams may say hello with another one).
            Event::Hello { .. } => {}
            Event::Done { id, result } => {
                let done = outcomes
                    .get_mut(&id)
                    .expect("outcome for an unknown request");
                assert!(!*done, "two outcomes for {id:?}");
                *done = true;
                match result {
                    Ok(()) => stats.acked += 1,
                    Err(ambit_agent::zds_session::RequestError::Nack(_)) => stats.nacked += 1,
                    Err(ambit_agent::zds_session::RequestError::AckTimeout(_)) => {
                        stats.timed_out += 1
                    }
                    Err(_) => {}
                }
                *in_flight = false;
            }
            Event::SnapshotEntryFailed { .. } => *in_flight = false,
            Event::SnapshotDone { .. } => {
                stats.snapshots += 1;
                *in_flight = false;
            }
            Event::LateAck { .. } => stats.late_acks += 1,
            Event::Closed(reason) => {
                assert!(!*closed, "closed twice");
                let _ = reason.to_string();
                *closed = true;
                *in_flight = false;
            }
        }
    }
    // A snapshot message acked without a failure leaves no event: the next send decides.
    if !s.is_closed() && s.poll_timeout().is_none() {
        *in_flight = false;
    }
}
