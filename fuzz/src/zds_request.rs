//! The `zds_request` target: ZDS (istio.workload.zds) messages as the node proxy and the
//! node agent receive them, with the fd rules.

use std::fs::File;
use std::os::fd::OwnedFd;

use ambit_zds::protocol::{
    decode_hello, decode_request, decode_response, encode_ack, encode_add, encode_del, encode_keep,
    encode_snapshot_sent,
};
use ambit_zds::{Incoming, ProtocolError};
use prost::Message;

/// What the datagram came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// As a `WorkloadRequest` with its fds: the kind, or the error's variant.
    pub request: Result<&'static str, String>,
    /// As a `WorkloadResponse`: `None` if it does not decode as one, else ACK or the NACK's
    /// message.
    pub response: Option<Result<(), String>>,
    /// As a `ZdsHello`: its version.
    pub hello: Option<i32>,
}

fn devnull() -> OwnedFd {
    // A leak of received fds would show up here as EMFILE.
    File::open("/dev/null").expect("open /dev/null").into()
}

fn fds(n: usize) -> Vec<OwnedFd> {
    (0..n).map(|_| devnull()).collect()
}

/// Byte 0 chooses how many fds arrive with the datagram (`% 3`: 0, 1 or 2, each a fresh
/// `/dev/null`); the rest is the datagram, decoded as a `WorkloadRequest` (with the fd
/// rules), a `WorkloadResponse` and a `ZdsHello`.
///
/// Checks: more than one fd is `TooManyFds(n)`; an `Add` iff exactly one fd; uids are not
/// empty; what decodes re-encodes (`encode_add/keep/del/snapshot_sent`, `encode_ack`,
/// `ZdsHello`) to the same values. A leak of received fds would surface as `EMFILE` on the
/// next `open`.
pub fn run(data: &[u8]) -> Option<Outcome> {
    let (&first, bytes) = data.split_first()?;
    let n = usize::from(first % 3);
    Some(Outcome {
        request: request(bytes, n),
        response: response(bytes),
        hello: hello(bytes),
    })
}

fn request(bytes: &[u8], n: usize) -> Result<&'static str, String> {
    let result = decode_request(bytes, fds(n));
    if n > 1 {
        assert!(
            matches!(result, Err(ProtocolError::TooManyFds(k)) if k == n),
            "{n} fds: {result:?}"
        );
    }
    let incoming = match result {
        Ok(i) => i,
        Err(e) => {
            let _ = e.to_string();
            return Err(crate::variant(&e));
        }
    };
    let kind = incoming.kind();
    // Fd rules: an Add carries exactly one fd, anything else none.
    assert_eq!(
        matches!(incoming, Incoming::Add { .. }),
        n == 1,
        "{} with {n} fds",
        incoming.kind()
    );
    if let Some(uid) = incoming.uid() {
        assert!(!uid.is_empty());
    }
    // Round trip: what the agent side encodes for the same request decodes the same.
    match incoming {
        Incoming::Add { uid, info, netns } => {
            drop(netns);
            match decode_request(&encode_add(&uid, &info), fds(1)) {
                Ok(Incoming::Add {
                    uid: uid2,
                    info: info2,
                    ..
                }) => {
                    assert_eq!(uid2, uid);
                    assert_eq!(info2, info);
                }
                other => panic!("re-encoded AddWorkload {uid:?}: {other:?}"),
            }
        }
        Incoming::Keep { uid } => match decode_request(&encode_keep(&uid), Vec::new()) {
            Ok(Incoming::Keep { uid: uid2 }) => assert_eq!(uid2, uid),
            other => panic!("re-encoded KeepWorkload {uid:?}: {other:?}"),
        },
        Incoming::Del { uid } => match decode_request(&encode_del(&uid), Vec::new()) {
            Ok(Incoming::Del { uid: uid2 }) => assert_eq!(uid2, uid),
            other => panic!("re-encoded DelWorkload {uid:?}: {other:?}"),
        },
        Incoming::SnapshotSent => assert!(matches!(
            decode_request(&encode_snapshot_sent(), Vec::new()),
            Ok(Incoming::SnapshotSent)
        )),
    }
    Ok(kind)
}

fn response(bytes: &[u8]) -> Option<Result<(), String>> {
    match decode_response(bytes) {
        Ok(Ok(())) => {
            assert!(matches!(decode_response(&encode_ack(None)), Ok(Ok(()))));
            Some(Ok(()))
        }
        Ok(Err(msg)) => {
            assert!(!msg.is_empty());
            match decode_response(&encode_ack(Some(&msg))) {
                Ok(Err(m)) => assert_eq!(m, msg),
                other => panic!("re-encoded NACK {msg:?}: {other:?}"),
            }
            Some(Err(msg))
        }
        Err(e) => {
            let _ = e.to_string();
            None
        }
    }
}

fn hello(bytes: &[u8]) -> Option<i32> {
    let h = decode_hello(bytes).ok()?;
    let _ = h.version();
    let again = decode_hello(&h.encode_to_vec()).expect("re-encoded ZdsHello");
    assert_eq!(again, h);
    Some(h.version)
}
