//! The agent side of one ZDS connection, sans IO: the node proxy's hello, the snapshot
//! (an `AddWorkload` or `KeepWorkload` per pod, then `SnapshotSent`), then adds and deletes,
//! each waiting for its ack, with timeouts on an injected clock. The mirror of the node
//! proxy's [`ambit_zds::WorkloadStates`].
//!
//! The driver ([`crate::zds`]) owns the socket and the clock. It feeds what arrives
//! ([`Session::on_datagram`], [`Session::on_peer_closed`]) and what time it is
//! ([`Session::on_timeout`] once [`Session::poll_timeout`] has passed), answers
//! [`Event::Hello`] with [`Session::begin_snapshot`] (or closes the session), hands requests
//! in with [`Session::submit`], sends whatever [`Session::poll_transmit`] gives it, and acts
//! on [`Session::poll_event`]. The netns fd travels as an opaque `F` (a `Netns` in the
//! driver, a number in tests), so nothing here touches a file descriptor.
//!
//! Rules:
//! - The proxy speaks first: a `ZdsHello` within the hello timeout, or the session closes.
//! - One message in flight at a time: acks are matched to requests only by order.
//! - The snapshot goes before any request; a NACK or an ack timeout during it is reported
//!   ([`Event::SnapshotEntryFailed`]) and the snapshot goes on, as Istio's agent does.
//! - A request whose ack times out fails ([`RequestError::AckTimeout`]) but its ack is still
//!   owed: the next acks that arrive pay the debt first ([`Event::LateAck`]), so a late ack
//!   is never taken for the answer to a later request. More than `max_owed_acks` owed
//!   closes the session (the proxy reconnects and resyncs from a new snapshot).
//! - Anything from the proxy that is not the answer to a message in flight (or a debt) is a
//!   protocol error and closes the session, as is a message that is not a
//!   `WorkloadResponse`.
//! - Closing fails every request still queued or in flight with
//!   [`RequestError::Disconnected`], exactly once each.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use ambit_zds::proto::WorkloadInfo;
use ambit_zds::protocol::{
    decode_hello, decode_response, encode_add, encode_del, encode_keep, encode_snapshot_sent,
};
use ambit_zds::ProtocolError;

/// How long a proxy has to send its hello, and to ack each message (Istio's agent: 5 s).
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection owing more acks than this (timed-out messages) is closed.
pub const MAX_OWED_ACKS: usize = 3;

/// The session's timeouts and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Time for the proxy's hello after it connected.
    pub hello_timeout: Duration,
    /// Time for each ack, counted from the moment the message is handed out to be sent.
    pub ack_timeout: Duration,
    /// Acks that may be overdue before the session is closed.
    pub max_owed_acks: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            hello_timeout: ACK_TIMEOUT,
            ack_timeout: ACK_TIMEOUT,
            max_owed_acks: MAX_OWED_ACKS,
        }
    }
}

/// The ZDS message kinds the agent sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    Add,
    Keep,
    Del,
    SnapshotSent,
}

impl MessageKind {
    /// The protocol's name for it, for logs.
    pub fn name(self) -> &'static str {
        match self {
            MessageKind::Add => "AddWorkload",
            MessageKind::Keep => "KeepWorkload",
            MessageKind::Del => "DelWorkload",
            MessageKind::SnapshotSent => "SnapshotSent",
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One pod in the snapshot.
#[derive(Debug)]
pub enum SnapshotEntry<F> {
    /// A pod whose netns could be opened: `AddWorkload` with the fd.
    Add {
        uid: String,
        info: WorkloadInfo,
        netns: F,
    },
    /// A pod whose netns could not be opened: `KeepWorkload` ("don't delete it").
    Keep { uid: String },
}

/// What the agent asks of the proxy after the snapshot.
#[derive(Debug)]
pub enum Request<F> {
    /// Start proxying for a new pod (`AddWorkload` with the netns fd).
    Add {
        uid: String,
        info: WorkloadInfo,
        netns: F,
    },
    /// The pod is gone (`DelWorkload`).
    Del { uid: String },
}

/// Names a submitted request in its [`Event::Done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(u64);

/// One datagram to send, with the netns fd to attach (only for `AddWorkload`).
#[derive(Debug)]
pub struct Transmit<F> {
    pub bytes: Vec<u8>,
    pub fd: Option<F>,
    pub kind: MessageKind,
    pub uid: Option<String>,
}

/// Why a message was not carried out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The proxy answered with an error (its fault or the pod's; the caller may retry).
    #[error("the node proxy rejected the request: {0}")]
    Nack(String),
    /// The proxy did not ack in time (it may still be working on it; retrying is safe, an
    /// Add is idempotent on the proxy side).
    #[error("the node proxy did not acknowledge within {0:?}")]
    AckTimeout(Duration),
    /// The connection closed before the proxy answered.
    #[error("the node proxy disconnected before answering")]
    Disconnected,
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// The proxy never said hello.
    #[error(
        "the node proxy sent no ZDS hello within {0:?}; is the peer a ZDS client \
         (ztunnel or ambit) and healthy?"
    )]
    NoHello(Duration),
    /// The proxy's first message is not a hello.
    #[error(
        "the node proxy's first message is not a ZDS hello ({0}); the peer does not speak ZDS"
    )]
    BadHello(#[source] ProtocolError),
    /// The proxy sent something that is not a `WorkloadResponse`.
    #[error("the node proxy broke the ZDS protocol ({0}); it must reconnect and resync")]
    BadResponse(#[source] ProtocolError),
    /// The proxy sent a message nobody asked for.
    #[error(
        "the node proxy sent an unsolicited message (ZDS protocol error: a client only \
         answers); it must reconnect and resync"
    )]
    Unsolicited,
    /// Too many acks overdue.
    #[error(
        "the node proxy stopped acknowledging ({owed} acks overdue); closing so it \
         reconnects and resyncs from a new snapshot"
    )]
    StoppedAcking { owed: usize },
    /// The proxy hung up.
    #[error("the node proxy closed the connection")]
    PeerClosed,
    /// The socket failed (reported by the driver).
    #[error("ZDS connection error: {0}")]
    Transport(String),
    /// Another proxy is served (the driver's one-proxy-at-a-time rule).
    #[error(
        "another node proxy ({served}) is connected and served; the agent serves one at a \
         time, so this one is refused until that one disconnects"
    )]
    AnotherProxyServed { served: String },
    /// The agent stops.
    #[error("the node agent is shutting down")]
    Shutdown,
}

/// What happened, for the driver to act on.
#[derive(Debug)]
pub enum Event {
    /// The proxy said hello: answer with [`Session::begin_snapshot`] or close the session.
    Hello { version: i32 },
    /// A snapshot message was NACKed or not acked in time; the snapshot goes on.
    SnapshotEntryFailed {
        kind: MessageKind,
        uid: Option<String>,
        error: RequestError,
    },
    /// `SnapshotSent` was answered (or timed out): requests flow from now on.
    SnapshotDone { entries: usize, failed: usize },
    /// A request's outcome.
    Done {
        id: RequestId,
        result: Result<(), RequestError>,
    },
    /// An overdue ack arrived and paid a debt (`error` is its NACK text, if any).
    LateAck { error: Option<String> },
    /// The session is over; nothing more will happen.
    Closed(CloseReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitingHello {
        deadline: Instant,
    },
    /// Hello received, waiting for the driver's snapshot.
    Greeted,
    Snapshot,
    Steady,
    Closed,
}

#[derive(Debug)]
struct Queued<F> {
    kind: MessageKind,
    uid: Option<String>,
    bytes: Vec<u8>,
    fd: Option<F>,
    id: Option<RequestId>,
}

#[derive(Debug)]
struct InFlight {
    kind: MessageKind,
    uid: Option<String>,
    /// `None` for snapshot messages.
    id: Option<RequestId>,
    deadline: Instant,
}

/// One ZDS connection, agent side. See the module docs.
#[derive(Debug)]
pub struct Session<F> {
    opts: SessionOptions,
    phase: Phase,
    snapshot: VecDeque<Queued<F>>,
    requests: VecDeque<Queued<F>>,
    in_flight: Option<InFlight>,
    owed: usize,
    next_id: u64,
    snapshot_entries: usize,
    snapshot_failed: usize,
    events: VecDeque<Event>,
}

impl<F> Session<F> {
    /// A connection accepted at `now`: waiting for the hello.
    pub fn new(opts: SessionOptions, now: Instant) -> Session<F> {
        Session {
            opts,
            phase: Phase::AwaitingHello {
                deadline: now + opts.hello_timeout,
            },
            snapshot: VecDeque::new(),
            requests: VecDeque::new(),
            in_flight: None,
            owed: 0,
            next_id: 0,
            snapshot_entries: 0,
            snapshot_failed: 0,
            events: VecDeque::new(),
        }
    }

    /// A datagram from the proxy (any fds with it are the driver's to close: a ZDS client
    /// never sends any, and they carry no meaning here).
    pub fn on_datagram(&mut self, bytes: &[u8]) {
        match self.phase {
            Phase::Closed => {}
            Phase::AwaitingHello { .. } => match decode_hello(bytes) {
                Ok(hello) => {
                    self.phase = Phase::Greeted;
                    self.events.push_back(Event::Hello {
                        version: hello.version,
                    });
                }
                Err(e) => self.close(CloseReason::BadHello(e)),
            },
            // Nothing sent yet, so nothing to answer.
            Phase::Greeted => self.close(CloseReason::Unsolicited),
            Phase::Snapshot | Phase::Steady => match decode_response(bytes) {
                Err(e) => self.close(CloseReason::BadResponse(e)),
                Ok(answer) if self.owed > 0 => {
                    self.owed -= 1;
                    self.events.push_back(Event::LateAck {
                        error: answer.err(),
                    });
                }
                Ok(answer) if self.in_flight.is_some() => {
                    self.complete(answer.map_err(RequestError::Nack));
                }
                Ok(_) => self.close(CloseReason::Unsolicited),
            },
        }
    }

    /// The snapshot for the proxy that said hello; `SnapshotSent` follows the entries.
    /// Returns `false` (and drops the entries) unless the session has just said hello.
    pub fn begin_snapshot(&mut self, entries: impl IntoIterator<Item = SnapshotEntry<F>>) -> bool {
        if self.phase != Phase::Greeted {
            return false;
        }
        for entry in entries {
            self.snapshot.push_back(match entry {
                SnapshotEntry::Add { uid, info, netns } => Queued {
                    kind: MessageKind::Add,
                    bytes: encode_add(&uid, &info),
                    uid: Some(uid),
                    fd: Some(netns),
                    id: None,
                },
                SnapshotEntry::Keep { uid } => Queued {
                    kind: MessageKind::Keep,
                    bytes: encode_keep(&uid),
                    uid: Some(uid),
                    fd: None,
                    id: None,
                },
            });
        }
        self.snapshot_entries = self.snapshot.len();
        self.snapshot.push_back(Queued {
            kind: MessageKind::SnapshotSent,
            bytes: encode_snapshot_sent(),
            uid: None,
            fd: None,
            id: None,
        });
        self.phase = Phase::Snapshot;
        true
    }

    /// Queues a request (sent after the snapshot, in order). On a closed session it fails at
    /// once with [`RequestError::Disconnected`].
    pub fn submit(&mut self, request: Request<F>) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        if self.phase == Phase::Closed {
            self.events.push_back(Event::Done {
                id,
                result: Err(RequestError::Disconnected),
            });
            return id;
        }
        self.requests.push_back(match request {
            Request::Add { uid, info, netns } => Queued {
                kind: MessageKind::Add,
                bytes: encode_add(&uid, &info),
                uid: Some(uid),
                fd: Some(netns),
                id: Some(id),
            },
            Request::Del { uid } => Queued {
                kind: MessageKind::Del,
                bytes: encode_del(&uid),
                uid: Some(uid),
                fd: None,
                id: Some(id),
            },
        });
        id
    }

    /// The next datagram to send, if one may go now; its ack is due `ack_timeout` after
    /// `now`.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit<F>> {
        if self.in_flight.is_some() {
            return None;
        }
        let next = match self.phase {
            Phase::Snapshot => self.snapshot.pop_front(),
            Phase::Steady => self.requests.pop_front(),
            Phase::AwaitingHello { .. } | Phase::Greeted | Phase::Closed => None,
        }?;
        self.in_flight = Some(InFlight {
            kind: next.kind,
            uid: next.uid.clone(),
            id: next.id,
            deadline: now + self.opts.ack_timeout,
        });
        Some(Transmit {
            bytes: next.bytes,
            fd: next.fd,
            kind: next.kind,
            uid: next.uid,
        })
    }

    /// When [`Session::on_timeout`] must be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::AwaitingHello { deadline } => Some(deadline),
            Phase::Closed => None,
            _ => self.in_flight.as_ref().map(|f| f.deadline),
        }
    }

    /// Time has moved to `now`: expires the hello or the ack in flight if they are due.
    pub fn on_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::AwaitingHello { deadline } if now >= deadline => {
                self.close(CloseReason::NoHello(self.opts.hello_timeout));
                return;
            }
            Phase::Closed => return,
            _ => {}
        }
        if self.in_flight.as_ref().is_some_and(|f| now >= f.deadline) {
            self.owed += 1;
            self.complete(Err(RequestError::AckTimeout(self.opts.ack_timeout)));
            if self.owed > self.opts.max_owed_acks {
                self.close(CloseReason::StoppedAcking { owed: self.owed });
            }
        }
    }

    /// The proxy closed the connection.
    pub fn on_peer_closed(&mut self) {
        self.close(CloseReason::PeerClosed);
    }

    /// Ends the session (no-op when already closed): queued and in-flight requests fail with
    /// [`RequestError::Disconnected`], then [`Event::Closed`].
    pub fn close(&mut self, reason: CloseReason) {
        if self.phase == Phase::Closed {
            return;
        }
        self.phase = Phase::Closed;
        self.snapshot.clear();
        let in_flight = self.in_flight.take().and_then(|f| f.id);
        let queued: Vec<RequestId> = self.requests.drain(..).filter_map(|q| q.id).collect();
        for id in in_flight.into_iter().chain(queued) {
            self.events.push_back(Event::Done {
                id,
                result: Err(RequestError::Disconnected),
            });
        }
        self.events.push_back(Event::Closed(reason));
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether the session is over.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Whether the proxy said hello and the session is not over.
    pub fn said_hello(&self) -> bool {
        !matches!(self.phase, Phase::AwaitingHello { .. } | Phase::Closed)
    }

    /// Whether the snapshot is done (requests flow).
    pub fn snapshot_done(&self) -> bool {
        self.phase == Phase::Steady
    }

    /// Acks overdue.
    pub fn owed_acks(&self) -> usize {
        self.owed
    }

    fn complete(&mut self, result: Result<(), RequestError>) {
        let Some(done) = self.in_flight.take() else {
            return;
        };
        if let Some(id) = done.id {
            self.events.push_back(Event::Done { id, result });
            return;
        }
        if let Err(error) = result {
            self.snapshot_failed += 1;
            self.events.push_back(Event::SnapshotEntryFailed {
                kind: done.kind,
                uid: done.uid,
                error,
            });
        }
        if done.kind == MessageKind::SnapshotSent {
            self.phase = Phase::Steady;
            self.events.push_back(Event::SnapshotDone {
                entries: self.snapshot_entries,
                failed: self.snapshot_failed,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_zds::protocol::{decode_request, encode_ack, encode_hello};
    use ambit_zds::Incoming;

    const OPTS: SessionOptions = SessionOptions {
        hello_timeout: Duration::from_secs(5),
        ack_timeout: Duration::from_secs(2),
        max_owed_acks: 2,
    };

    fn info(name: &str) -> WorkloadInfo {
        WorkloadInfo {
            name: name.into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        }
    }

    fn add(uid: &str, fd: u32) -> SnapshotEntry<u32> {
        SnapshotEntry::Add {
            uid: uid.into(),
            info: info(uid),
            netns: fd,
        }
    }

    fn keep(uid: &str) -> SnapshotEntry<u32> {
        SnapshotEntry::Keep { uid: uid.into() }
    }

    fn ack() -> Vec<u8> {
        encode_ack(None)
    }

    fn nack(msg: &str) -> Vec<u8> {
        encode_ack(Some(msg))
    }

    fn events(s: &mut Session<u32>) -> Vec<Event> {
        std::iter::from_fn(|| s.poll_event()).collect()
    }

    /// The message the proxy would decode, as "Kind:uid" (fds stand for themselves).
    fn sent(t: &Transmit<u32>) -> String {
        let fds =
            t.fd.map(|_| vec![std::fs::File::open("/dev/null").unwrap().into()])
                .unwrap_or_default();
        let msg = decode_request(&t.bytes, fds).expect("the agent sends valid requests");
        assert_eq!(msg.kind(), t.kind.name());
        assert_eq!(msg.uid().map(str::to_owned), t.uid);
        match msg.uid() {
            Some(uid) => format!("{}:{uid}", msg.kind()),
            None => msg.kind().to_owned(),
        }
    }

    /// A session that said hello and finished an empty snapshot.
    fn steady(t0: Instant) -> Session<u32> {
        let mut s = Session::new(OPTS, t0);
        s.on_datagram(&encode_hello());
        assert!(matches!(events(&mut s)[..], [Event::Hello { version: 1 }]));
        assert!(s.begin_snapshot([]));
        let t = s.poll_transmit(t0).unwrap();
        assert_eq!(sent(&t), "SnapshotSent");
        s.on_datagram(&ack());
        assert!(matches!(
            events(&mut s)[..],
            [Event::SnapshotDone {
                entries: 0,
                failed: 0
            }]
        ));
        assert!(s.snapshot_done());
        s
    }

    #[test]
    fn hello_then_nothing_until_the_snapshot() {
        let t0 = Instant::now();
        let mut s: Session<u32> = Session::new(OPTS, t0);
        assert!(!s.said_hello());
        assert_eq!(s.poll_timeout(), Some(t0 + OPTS.hello_timeout));
        assert!(s.poll_transmit(t0).is_none(), "the proxy speaks first");
        s.on_datagram(&encode_hello());
        assert!(s.said_hello());
        assert!(matches!(events(&mut s)[..], [Event::Hello { version: 1 }]));
        assert_eq!(
            s.poll_timeout(),
            None,
            "no deadline while the driver decides"
        );
        assert!(s.poll_transmit(t0).is_none(), "no snapshot yet");
        // A second snapshot, or one out of turn, is refused.
        assert!(s.begin_snapshot([]));
        assert!(!s.begin_snapshot([keep("x")]));
    }

    #[test]
    fn no_hello_in_time_closes() {
        let t0 = Instant::now();
        let mut s: Session<u32> = Session::new(OPTS, t0);
        s.on_timeout(t0 + OPTS.hello_timeout - Duration::from_millis(1));
        assert!(!s.is_closed(), "not yet");
        s.on_timeout(t0 + OPTS.hello_timeout);
        let ev = events(&mut s);
        assert!(
            matches!(&ev[..], [Event::Closed(CloseReason::NoHello(d))] if *d == OPTS.hello_timeout),
            "{ev:?}"
        );
        assert_eq!(s.poll_timeout(), None);
        // Nothing happens to a closed session.
        s.on_datagram(&encode_hello());
        s.on_timeout(t0 + Duration::from_secs(100));
        assert!(events(&mut s).is_empty());
    }

    #[test]
    fn bad_hello_and_messages_before_the_snapshot_close() {
        let t0 = Instant::now();
        let mut s: Session<u32> = Session::new(OPTS, t0);
        s.on_datagram(&[0xff, 0xff]);
        let ev = events(&mut s);
        assert!(
            matches!(&ev[..], [Event::Closed(CloseReason::BadHello(_))]),
            "{ev:?}"
        );
        assert!(ev[0].to_string_for_test().contains("not a ZDS hello"));

        let mut s: Session<u32> = Session::new(OPTS, t0);
        s.on_datagram(&encode_hello());
        s.on_datagram(&ack());
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [Event::Hello { .. }, Event::Closed(CloseReason::Unsolicited)]
            ),
            "{ev:?}"
        );
    }

    #[test]
    fn snapshot_adds_with_fds_keeps_then_snapshot_sent_in_order() {
        let t0 = Instant::now();
        let mut s = Session::new(OPTS, t0);
        s.on_datagram(&encode_hello());
        events(&mut s);
        s.begin_snapshot([add("a", 10), keep("b"), add("c", 11)]);
        // A request submitted during the snapshot waits for it.
        let id = s.submit(Request::Del { uid: "z".into() });
        let mut order = Vec::new();
        while let Some(t) = s.poll_transmit(t0) {
            assert!(s.poll_transmit(t0).is_none(), "one message in flight");
            assert_eq!(t.fd.is_some(), t.kind == MessageKind::Add);
            order.push(sent(&t));
            s.on_datagram(&ack());
        }
        assert_eq!(
            order,
            [
                "AddWorkload:a",
                "KeepWorkload:b",
                "AddWorkload:c",
                "SnapshotSent",
                "DelWorkload:z"
            ]
        );
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [
                    Event::SnapshotDone {
                        entries: 3,
                        failed: 0
                    },
                    Event::Done { id: done, result: Ok(()) }
                ] if *done == id
            ),
            "{ev:?}"
        );
        assert_eq!(s.poll_timeout(), None, "idle: no deadline");
    }

    #[test]
    fn snapshot_nacks_and_timeouts_are_reported_and_the_snapshot_goes_on() {
        let t0 = Instant::now();
        let mut s = Session::new(OPTS, t0);
        s.on_datagram(&encode_hello());
        events(&mut s);
        s.begin_snapshot([add("a", 1), add("b", 2)]);
        assert_eq!(sent(&s.poll_transmit(t0).unwrap()), "AddWorkload:a");
        s.on_datagram(&nack("failure to start proxy : a"));
        assert_eq!(sent(&s.poll_transmit(t0).unwrap()), "AddWorkload:b");
        assert_eq!(s.poll_timeout(), Some(t0 + OPTS.ack_timeout));
        let t1 = t0 + OPTS.ack_timeout;
        s.on_timeout(t1);
        assert_eq!(s.owed_acks(), 1);
        assert_eq!(sent(&s.poll_transmit(t1).unwrap()), "SnapshotSent");
        // The late ack for b pays the debt; SnapshotSent is still waiting.
        s.on_datagram(&ack());
        assert!(!s.snapshot_done());
        s.on_datagram(&ack());
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [
                    Event::SnapshotEntryFailed { kind: MessageKind::Add, uid: Some(a), error: RequestError::Nack(m) },
                    Event::SnapshotEntryFailed { kind: MessageKind::Add, uid: Some(b), error: RequestError::AckTimeout(_) },
                    Event::LateAck { error: None },
                    Event::SnapshotDone { entries: 2, failed: 2 },
                ] if a == "a" && b == "b" && m == "failure to start proxy : a"
            ),
            "{ev:?}"
        );
        assert_eq!(s.owed_acks(), 0);
    }

    #[test]
    fn snapshot_sent_unanswered_still_lets_requests_flow() {
        let t0 = Instant::now();
        let mut s = Session::new(OPTS, t0);
        s.on_datagram(&encode_hello());
        events(&mut s);
        s.begin_snapshot([]);
        s.poll_transmit(t0).unwrap();
        let t1 = t0 + OPTS.ack_timeout;
        s.on_timeout(t1);
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [
                    Event::SnapshotEntryFailed {
                        kind: MessageKind::SnapshotSent,
                        uid: None,
                        error: RequestError::AckTimeout(_)
                    },
                    Event::SnapshotDone {
                        entries: 0,
                        failed: 1
                    }
                ]
            ),
            "{ev:?}"
        );
        assert!(s.snapshot_done());
        s.submit(Request::Del { uid: "x".into() });
        assert_eq!(sent(&s.poll_transmit(t1).unwrap()), "DelWorkload:x");
    }

    #[test]
    fn requests_ack_and_nack_in_order() {
        let t0 = Instant::now();
        let mut s = steady(t0);
        let a = s.submit(Request::Add {
            uid: "p1".into(),
            info: info("p1"),
            netns: 7,
        });
        let d = s.submit(Request::Del { uid: "p0".into() });
        assert_ne!(a, d);
        let t = s.poll_transmit(t0).unwrap();
        assert_eq!(t.fd, Some(7));
        assert_eq!(sent(&t), "AddWorkload:p1");
        s.on_datagram(&nack("no room"));
        assert_eq!(sent(&s.poll_transmit(t0).unwrap()), "DelWorkload:p0");
        s.on_datagram(&ack());
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [
                    Event::Done { id: x, result: Err(RequestError::Nack(m)) },
                    Event::Done { id: y, result: Ok(()) },
                ] if *x == a && *y == d && m == "no room"
            ),
            "{ev:?}"
        );
    }

    #[test]
    fn a_late_ack_is_never_taken_for_the_next_answer() {
        let t0 = Instant::now();
        let mut s = steady(t0);
        let slow = s.submit(Request::Del { uid: "slow".into() });
        s.poll_transmit(t0).unwrap();
        let t1 = t0 + OPTS.ack_timeout;
        s.on_timeout(t1 - Duration::from_millis(1));
        assert!(events(&mut s).is_empty(), "not due yet");
        s.on_timeout(t1);
        let next = s.submit(Request::Del { uid: "next".into() });
        assert_eq!(sent(&s.poll_transmit(t1).unwrap()), "DelWorkload:next");
        // The proxy's late NACK for `slow`, then its ACK for `next`.
        s.on_datagram(&nack("late answer to slow"));
        s.on_datagram(&ack());
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [
                    Event::Done { id: x, result: Err(RequestError::AckTimeout(_)) },
                    Event::LateAck { error: Some(m) },
                    Event::Done { id: y, result: Ok(()) },
                ] if *x == slow && *y == next && m == "late answer to slow"
            ),
            "{ev:?}"
        );
        // A late ack while idle pays the debt too, without closing.
        s.submit(Request::Del {
            uid: "again".into(),
        });
        s.poll_transmit(t1).unwrap();
        s.on_timeout(t1 + OPTS.ack_timeout);
        events(&mut s);
        s.on_datagram(&ack());
        assert!(matches!(
            events(&mut s)[..],
            [Event::LateAck { error: None }]
        ));
        assert!(!s.is_closed());
    }

    #[test]
    fn too_many_overdue_acks_close_and_fail_the_rest() {
        let t0 = Instant::now();
        let mut s = steady(t0);
        let ids: Vec<RequestId> = (0..4)
            .map(|i| {
                s.submit(Request::Del {
                    uid: format!("p{i}"),
                })
            })
            .collect();
        let mut now = t0;
        for _ in 0..OPTS.max_owed_acks + 1 {
            s.poll_transmit(now).unwrap();
            now += OPTS.ack_timeout;
            s.on_timeout(now);
        }
        assert!(s.is_closed());
        let ev = events(&mut s);
        let timed_out = ev
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Event::Done {
                        result: Err(RequestError::AckTimeout(_)),
                        ..
                    }
                )
            })
            .count();
        assert_eq!(timed_out, 3);
        assert!(
            matches!(
                &ev[3..],
                [
                    Event::Done { id, result: Err(RequestError::Disconnected) },
                    Event::Closed(CloseReason::StoppedAcking { owed: 3 }),
                ] if *id == ids[3]
            ),
            "{ev:?}"
        );
        // Submitting to a closed session fails at once.
        let late = s.submit(Request::Del { uid: "late".into() });
        assert!(matches!(
            events(&mut s)[..],
            [Event::Done { id, result: Err(RequestError::Disconnected) }] if id == late
        ));
        assert!(s.poll_transmit(now).is_none());
    }

    #[test]
    fn unsolicited_and_malformed_answers_close() {
        let t0 = Instant::now();
        let mut s = steady(t0);
        s.on_datagram(&ack());
        assert!(matches!(
            events(&mut s)[..],
            [Event::Closed(CloseReason::Unsolicited)]
        ));

        let mut s = steady(t0);
        let id = s.submit(Request::Del { uid: "p".into() });
        s.poll_transmit(t0).unwrap();
        s.on_datagram(&[0x0a, 0x05]); // truncated WorkloadResponse
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [
                    Event::Done { id: x, result: Err(RequestError::Disconnected) },
                    Event::Closed(CloseReason::BadResponse(_)),
                ] if *x == id
            ),
            "{ev:?}"
        );
        // An empty datagram decodes as a WorkloadResponse without payload: also refused.
        let mut s = steady(t0);
        s.submit(Request::Del { uid: "p".into() });
        s.poll_transmit(t0).unwrap();
        s.on_datagram(&[]);
        assert!(events(&mut s)
            .iter()
            .any(|e| matches!(e, Event::Closed(CloseReason::BadResponse(_)))));
    }

    #[test]
    fn peer_close_and_driver_close_fail_everything_once() {
        let t0 = Instant::now();
        let mut s = steady(t0);
        let a = s.submit(Request::Del { uid: "a".into() });
        let b = s.submit(Request::Del { uid: "b".into() });
        s.poll_transmit(t0).unwrap();
        s.on_peer_closed();
        s.close(CloseReason::Shutdown);
        let ev = events(&mut s);
        assert!(
            matches!(
                &ev[..],
                [
                    Event::Done { id: x, result: Err(RequestError::Disconnected) },
                    Event::Done { id: y, result: Err(RequestError::Disconnected) },
                    Event::Closed(CloseReason::PeerClosed),
                ] if *x == a && *y == b
            ),
            "{ev:?}"
        );

        // The driver refuses a second proxy right after its hello.
        let mut s: Session<u32> = Session::new(OPTS, t0);
        s.on_datagram(&encode_hello());
        s.close(CloseReason::AnotherProxyServed {
            served: "pid 42".into(),
        });
        let ev = events(&mut s);
        let [Event::Hello { .. }, Event::Closed(reason)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert!(reason.to_string().contains("pid 42"), "{reason}");
    }

    #[test]
    fn the_netns_fd_travels_with_adds_only() {
        let t0 = Instant::now();
        let mut s = Session::new(OPTS, t0);
        s.on_datagram(&encode_hello());
        s.begin_snapshot([add("a", 3), keep("b")]);
        let fds: Vec<Option<u32>> = std::iter::from_fn(|| {
            let t = s.poll_transmit(t0)?;
            s.on_datagram(&ack());
            Some(t.fd)
        })
        .collect();
        assert_eq!(fds, [Some(3), None, None]);
        // Decoded by the proxy's side: the Add names its workload.
        let mut s = steady(t0);
        s.submit(Request::Add {
            uid: "p".into(),
            info: info("p"),
            netns: 9,
        });
        let t = s.poll_transmit(t0).unwrap();
        let fd = std::fs::File::open("/dev/null").unwrap().into();
        match decode_request(&t.bytes, vec![fd]).unwrap() {
            Incoming::Add { uid, info: i, .. } => {
                assert_eq!(uid, "p");
                assert_eq!(i, info("p"));
            }
            other => panic!("{other:?}"),
        }
    }

    impl Event {
        fn to_string_for_test(&self) -> String {
            match self {
                Event::Closed(r) => r.to_string(),
                other => format!("{other:?}"),
            }
        }
    }
}
