//! ZDS message handling, sans IO: decode a received datagram (bytes + fds) into a typed
//! request while enforcing the fd rules, and encode the messages each side sends.
//!
//! fd rules (node proxy side): an `AddWorkload` must carry exactly one fd (the pod's netns);
//! any other message must carry none; when more than one fd arrives, all are closed.

use std::os::fd::OwnedFd;

use prost::Message;

use crate::proto::{
    workload_request, workload_response, Ack, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent,
    Version, WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello,
};

/// A decoded, validated request from the node agent.
#[derive(Debug)]
pub enum Incoming {
    /// Start proxying for the pod `uid` whose netns is `netns`.
    Add {
        uid: String,
        info: WorkloadInfo,
        netns: OwnedFd,
    },
    /// Snapshot only: keep `uid` even though no netns is given.
    Keep { uid: String },
    /// The pod is gone.
    Del { uid: String },
    /// The snapshot is complete.
    SnapshotSent,
}

impl Incoming {
    /// The message name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Incoming::Add { .. } => "AddWorkload",
            Incoming::Keep { .. } => "KeepWorkload",
            Incoming::Del { .. } => "DelWorkload",
            Incoming::SnapshotSent => "SnapshotSent",
        }
    }

    /// The pod uid, if the message names one.
    pub fn uid(&self) -> Option<&str> {
        match self {
            Incoming::Add { uid, .. } | Incoming::Keep { uid } | Incoming::Del { uid } => Some(uid),
            Incoming::SnapshotSent => None,
        }
    }
}

/// A message that breaks the ZDS protocol. Any received fds have been closed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Not a valid protobuf message of the expected type.
    #[error("failed to decode ZDS {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    /// An `AddWorkload` arrived without its netns fd.
    #[error("no control message: AddWorkload must carry the pod's netns fd")]
    NoControlMessage,
    /// An fd arrived with a message other than `AddWorkload`.
    #[error("unexpected control message: {kind} must not carry an fd (closed)")]
    UnexpectedControlMessage { kind: &'static str },
    /// More than one fd arrived with one message.
    #[error("expected at most one fd per ZDS message, got {0} (all closed)")]
    TooManyFds(usize),
    /// The oneof payload is absent (or an unknown field number).
    #[error("ZDS {0} has no payload")]
    MissingPayload(&'static str),
    /// `AddWorkload` without `workload_info`.
    #[error("AddWorkload for uid {uid:?} has no workload_info")]
    MissingWorkloadInfo { uid: String },
    /// A message naming a pod with an empty uid.
    #[error("{kind} has an empty uid")]
    EmptyUid { kind: &'static str },
}

fn decode<M: Message + Default>(what: &'static str, bytes: &[u8]) -> Result<M, ProtocolError> {
    M::decode(bytes).map_err(|source| ProtocolError::Decode { what, source })
}

fn non_empty(kind: &'static str, uid: String) -> Result<String, ProtocolError> {
    if uid.is_empty() {
        Err(ProtocolError::EmptyUid { kind })
    } else {
        Ok(uid)
    }
}

/// Decodes a `WorkloadRequest` datagram (node proxy side) and applies the fd rules. On error
/// every fd in `fds` is closed.
pub fn decode_request(bytes: &[u8], mut fds: Vec<OwnedFd>) -> Result<Incoming, ProtocolError> {
    if fds.len() > 1 {
        return Err(ProtocolError::TooManyFds(fds.len()));
    }
    let fd = fds.pop();
    let request: WorkloadRequest = decode("WorkloadRequest", bytes)?;
    let payload = request
        .payload
        .ok_or(ProtocolError::MissingPayload("WorkloadRequest"))?;
    let incoming = match payload {
        workload_request::Payload::Add(add) => {
            let uid = non_empty("AddWorkload", add.uid)?;
            let info = add
                .workload_info
                .ok_or_else(|| ProtocolError::MissingWorkloadInfo { uid: uid.clone() })?;
            let netns = fd.ok_or(ProtocolError::NoControlMessage)?;
            return Ok(Incoming::Add { uid, info, netns });
        }
        workload_request::Payload::Keep(keep) => Incoming::Keep {
            uid: non_empty("KeepWorkload", keep.uid)?,
        },
        workload_request::Payload::Del(del) => Incoming::Del {
            uid: non_empty("DelWorkload", del.uid)?,
        },
        workload_request::Payload::SnapshotSent(SnapshotSent {}) => Incoming::SnapshotSent,
    };
    if fd.is_some() {
        return Err(ProtocolError::UnexpectedControlMessage {
            kind: incoming.kind(),
        });
    }
    Ok(incoming)
}

/// `ZdsHello{version: V1}`, the node proxy's first message.
pub fn encode_hello() -> Vec<u8> {
    ZdsHello {
        version: Version::V1 as i32,
    }
    .encode_to_vec()
}

/// `WorkloadResponse{ack{error}}`: `None` (or an empty string) is an ACK, otherwise a NACK.
pub fn encode_ack(error: Option<&str>) -> Vec<u8> {
    WorkloadResponse {
        payload: Some(workload_response::Payload::Ack(Ack {
            error: error.unwrap_or_default().to_owned(),
        })),
    }
    .encode_to_vec()
}

fn encode_request(payload: workload_request::Payload) -> Vec<u8> {
    WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec()
}

/// `WorkloadRequest{add}` (node agent side); send it with the pod's netns fd attached.
pub fn encode_add(uid: &str, info: &WorkloadInfo) -> Vec<u8> {
    encode_request(workload_request::Payload::Add(AddWorkload {
        uid: uid.to_owned(),
        workload_info: Some(info.clone()),
    }))
}

/// `WorkloadRequest{keep}` (node agent side, snapshot only).
pub fn encode_keep(uid: &str) -> Vec<u8> {
    encode_request(workload_request::Payload::Keep(KeepWorkload {
        uid: uid.to_owned(),
    }))
}

/// `WorkloadRequest{del}` (node agent side).
pub fn encode_del(uid: &str) -> Vec<u8> {
    encode_request(workload_request::Payload::Del(DelWorkload {
        uid: uid.to_owned(),
    }))
}

/// `WorkloadRequest{snapshot_sent}` (node agent side).
pub fn encode_snapshot_sent() -> Vec<u8> {
    encode_request(workload_request::Payload::SnapshotSent(SnapshotSent {}))
}

/// Decodes a `WorkloadResponse` (node agent side): `Ok(Ok(()))` = ACK, `Ok(Err(msg))` = NACK.
pub fn decode_response(bytes: &[u8]) -> Result<Result<(), String>, ProtocolError> {
    let response: WorkloadResponse = decode("WorkloadResponse", bytes)?;
    match response.payload {
        Some(workload_response::Payload::Ack(Ack { error })) if error.is_empty() => Ok(Ok(())),
        Some(workload_response::Payload::Ack(Ack { error })) => Ok(Err(error)),
        None => Err(ProtocolError::MissingPayload("WorkloadResponse")),
    }
}

/// Decodes the node proxy's `ZdsHello` (node agent side). The version is not checked (Istio's
/// agent only logs it); use [`ZdsHello::version`] to read it.
pub fn decode_hello(bytes: &[u8]) -> Result<ZdsHello, ProtocolError> {
    decode("ZdsHello", bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ZdsSocket;
    use std::fs::File;
    use std::os::fd::{AsFd, AsRawFd};

    fn info() -> WorkloadInfo {
        WorkloadInfo {
            name: "n".into(),
            namespace: "s".into(),
            service_account: "a".into(),
        }
    }

    /// WorkloadInfo{name "n", namespace "s", service_account "a"}
    const INFO_BYTES: [u8; 9] = [0x0a, 0x01, b'n', 0x12, 0x01, b's', 0x1a, 0x01, b'a'];

    fn devnull() -> OwnedFd {
        File::open("/dev/null").unwrap().into()
    }

    fn add_bytes() -> Vec<u8> {
        // AddWorkload{uid(1) "u", workload_info(2) INFO} inside WorkloadRequest.add (1).
        let mut add = vec![0x0a, 0x01, b'u', 0x12, INFO_BYTES.len() as u8];
        add.extend_from_slice(&INFO_BYTES);
        let mut req = vec![0x0a, add.len() as u8];
        req.extend_from_slice(&add);
        req
    }

    // ---- hand-built bytes: every message, both directions -----------------------------

    #[test]
    fn hello_bytes() {
        // ZdsHello.version (1, varint) = V1 (1)
        assert_eq!(encode_hello(), vec![0x08, 0x01]);
        let hello = decode_hello(&[0x08, 0x01]).unwrap();
        assert_eq!(hello.version(), Version::V1);
        // NOT_USED is the empty message.
        assert_eq!(decode_hello(&[]).unwrap().version(), Version::NotUsed);
        // An unknown version decodes (the agent only logs it).
        assert_eq!(decode_hello(&[0x08, 0x07]).unwrap().version, 7);
    }

    #[test]
    fn workload_info_bytes() {
        assert_eq!(info().encode_to_vec(), INFO_BYTES.to_vec());
        // Reserved field 4 (trust_domain) is skipped as unknown.
        let mut with_td = INFO_BYTES.to_vec();
        with_td.extend_from_slice(&[0x22, 0x02, b't', b'd']);
        assert_eq!(WorkloadInfo::decode(&with_td[..]).unwrap(), info());
    }

    #[test]
    fn add_bytes_roundtrip() {
        let bytes = add_bytes();
        assert_eq!(
            bytes,
            vec![
                0x0a, 0x0e, 0x0a, 0x01, b'u', 0x12, 0x09, 0x0a, 0x01, b'n', 0x12, 0x01, b's', 0x1a,
                0x01, b'a'
            ]
        );
        assert_eq!(encode_add("u", &info()), bytes);
        match decode_request(&bytes, vec![devnull()]).unwrap() {
            Incoming::Add { uid, info: i, .. } => {
                assert_eq!(uid, "u");
                assert_eq!(i, info());
            }
            other => panic!("expected Add, got {other:?}"),
        }
    }

    #[test]
    fn keep_bytes_field_5() {
        // WorkloadRequest.keep = field 5, LEN: tag 0x2a; KeepWorkload.uid = field 1.
        let bytes = vec![0x2a, 0x03, 0x0a, 0x01, b'k'];
        assert_eq!(encode_keep("k"), bytes);
        assert!(matches!(
            decode_request(&bytes, vec![]).unwrap(),
            Incoming::Keep { uid } if uid == "k"
        ));
    }

    #[test]
    fn del_bytes_uid_field_2() {
        // WorkloadRequest.del = field 2 (0x12); DelWorkload.uid = field 2 (0x12).
        let bytes = vec![0x12, 0x03, 0x12, 0x01, b'a'];
        assert_eq!(encode_del("a"), bytes);
        assert!(matches!(
            decode_request(&bytes, vec![]).unwrap(),
            Incoming::Del { uid } if uid == "a"
        ));
        // uid in field 1 would be an unknown field: the uid reads as empty.
        let wrong = [0x12, 0x03, 0x0a, 0x01, b'a'];
        assert!(matches!(
            decode_request(&wrong, vec![]),
            Err(ProtocolError::EmptyUid {
                kind: "DelWorkload"
            })
        ));
    }

    #[test]
    fn snapshot_sent_bytes() {
        // WorkloadRequest.snapshot_sent = field 3, empty message.
        let bytes = vec![0x1a, 0x00];
        assert_eq!(encode_snapshot_sent(), bytes);
        assert!(matches!(
            decode_request(&bytes, vec![]).unwrap(),
            Incoming::SnapshotSent
        ));
    }

    #[test]
    fn ack_and_nack_bytes() {
        // WorkloadResponse.ack = field 1; Ack.error = field 1 (absent when empty).
        assert_eq!(encode_ack(None), vec![0x0a, 0x00]);
        assert_eq!(encode_ack(Some("")), vec![0x0a, 0x00]);
        let nack = vec![0x0a, 0x06, 0x0a, 0x04, b'b', b'o', b'o', b'm'];
        assert_eq!(encode_ack(Some("boom")), nack);
        assert_eq!(decode_response(&[0x0a, 0x00]).unwrap(), Ok(()));
        assert_eq!(decode_response(&nack).unwrap(), Err("boom".to_string()));
        assert!(matches!(
            decode_response(&[]),
            Err(ProtocolError::MissingPayload("WorkloadResponse"))
        ));
        assert!(matches!(
            decode_response(&[0x0a, 0x05, 0x0a]),
            Err(ProtocolError::Decode { .. })
        ));
    }

    // ---- validation ----------------------------------------------------------------------

    #[test]
    fn add_without_workload_info_is_rejected() {
        let bytes = [0x0a, 0x03, 0x0a, 0x01, b'u'];
        let err = decode_request(&bytes, vec![devnull()]).unwrap_err();
        assert!(matches!(err, ProtocolError::MissingWorkloadInfo { ref uid } if uid == "u"));
    }

    #[test]
    fn empty_uid_and_missing_payload_are_rejected() {
        assert!(matches!(
            decode_request(&encode_add("", &info()), vec![devnull()]),
            Err(ProtocolError::EmptyUid {
                kind: "AddWorkload"
            })
        ));
        assert!(matches!(
            decode_request(&encode_keep(""), vec![]),
            Err(ProtocolError::EmptyUid {
                kind: "KeepWorkload"
            })
        ));
        // Empty message, and an unknown oneof member (field 4), have no payload.
        for bytes in [&[][..], &[0x22, 0x00][..]] {
            assert!(matches!(
                decode_request(bytes, vec![]),
                Err(ProtocolError::MissingPayload("WorkloadRequest"))
            ));
        }
    }

    #[test]
    fn garbage_and_truncated_datagrams_are_errors() {
        let add = add_bytes();
        for cut in 1..add.len() {
            let r = decode_request(&add[..cut], vec![devnull()]);
            assert!(r.is_err(), "prefix of {cut} bytes decoded: {r:?}");
        }
        let err = decode_request(&[0xff, 0xff, 0xff], vec![]).unwrap_err();
        assert!(
            err.to_string()
                .contains("failed to decode ZDS WorkloadRequest"),
            "{err}"
        );
        // A wire type mismatch on a known field (add as varint).
        assert!(matches!(
            decode_request(&[0x08, 0x01], vec![]),
            Err(ProtocolError::Decode { .. })
        ));
    }

    /// Deterministic xorshift64* PRNG.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn fuzz_decode_never_panics() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let seeds = [
            add_bytes(),
            encode_keep("k"),
            encode_del("a"),
            encode_snapshot_sent(),
            encode_ack(Some("boom")),
        ];
        let mut ok = 0;
        for i in 0..20_000 {
            let bytes: Vec<u8> = if i % 2 == 0 {
                // Random bytes.
                let len = rng.below(64);
                (0..len).map(|_| rng.next() as u8).collect()
            } else {
                // Mutations of valid messages: flip, insert, delete, truncate.
                let mut b = seeds[rng.below(seeds.len())].clone();
                for _ in 0..=rng.below(4) {
                    match rng.below(4) {
                        0 if !b.is_empty() => {
                            let at = rng.below(b.len());
                            b[at] ^= 1 << rng.below(8);
                        }
                        1 => {
                            let at = rng.below(b.len() + 1);
                            b.insert(at, rng.next() as u8);
                        }
                        2 if !b.is_empty() => {
                            b.remove(rng.below(b.len()));
                        }
                        _ => b.truncate(rng.below(b.len() + 1)),
                    }
                }
                b
            };
            let fds = (0..rng.below(3)).map(|_| devnull()).collect();
            if decode_request(&bytes, fds).is_ok() {
                ok += 1;
            }
            let _ = decode_response(&bytes);
            let _ = decode_hello(&bytes);
        }
        // Sanity: the mutations do reach the success paths sometimes.
        assert!(ok > 0);
    }

    // ---- fd rules over a real SEQPACKET socket pair --------------------------------------

    async fn roundtrip(
        bytes: &[u8],
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Incoming, ProtocolError> {
        let (agent, proxy) = ZdsSocket::pair().unwrap();
        agent.send(bytes, fd).await.unwrap();
        let (data, fds) = proxy.recv().await.unwrap();
        decode_request(&data, fds)
    }

    #[tokio::test]
    async fn add_with_netns_fd_over_socket() {
        let ns = crate::netns::Netns::current().unwrap();
        let got = roundtrip(&encode_add("u", &info()), Some(ns.as_fd()))
            .await
            .unwrap();
        let Incoming::Add { uid, netns, .. } = got else {
            panic!("expected Add");
        };
        assert_eq!(uid, "u");
        // A new fd (close-on-exec) for the same namespace.
        assert_ne!(netns.as_raw_fd(), ns.as_fd().as_raw_fd());
        let flags = nix::fcntl::fcntl(netns.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(
            nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC)
        );
        let received = crate::netns::Netns::from_fd(netns).unwrap();
        assert_eq!(received.id(), ns.id());
        assert!(received.is_net_namespace());
    }

    #[tokio::test]
    async fn add_without_fd_over_socket() {
        let err = roundtrip(&encode_add("u", &info()), None)
            .await
            .unwrap_err();
        assert!(matches!(err, ProtocolError::NoControlMessage));
        assert!(err.to_string().starts_with("no control message"));
    }

    #[tokio::test]
    async fn fd_on_other_messages_over_socket() {
        let null = devnull();
        for (bytes, kind) in [
            (encode_del("a"), "DelWorkload"),
            (encode_keep("k"), "KeepWorkload"),
            (encode_snapshot_sent(), "SnapshotSent"),
        ] {
            let err = roundtrip(&bytes, Some(null.as_fd())).await.unwrap_err();
            assert!(
                matches!(err, ProtocolError::UnexpectedControlMessage { kind: k } if k == kind),
                "{err}"
            );
            assert!(err.to_string().starts_with("unexpected control message"));
        }
    }

    #[tokio::test]
    async fn garbage_datagrams_over_socket_are_errors() {
        let (agent, proxy) = ZdsSocket::pair().unwrap();
        let add = add_bytes();
        for bytes in [
            &[0xffu8, 0xff, 0xff][..],
            &add[..add.len() - 3],
            &[0x00][..],
        ] {
            agent.send(bytes, None).await.unwrap();
            let (data, fds) = proxy.recv().await.unwrap();
            assert!(decode_request(&data, fds).is_err());
        }
    }

    /// Sends `n` copies of a pipe's write end; once the receiver has rejected the message,
    /// the read end must see EOF, proving every received copy was closed.
    async fn many_fds_are_all_closed(n: usize) -> Result<(), String> {
        let (agent, proxy) = ZdsSocket::pair().unwrap();
        let (read_end, write_end) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC)
                .unwrap();
        let raws = vec![write_end.as_raw_fd(); n];
        let bytes = encode_add("u", &info());
        let iov = [std::io::IoSlice::new(&bytes)];
        nix::sys::socket::sendmsg::<()>(
            agent.as_fd().as_raw_fd(),
            &iov,
            &[nix::sys::socket::ControlMessage::ScmRights(&raws)],
            nix::sys::socket::MsgFlags::empty(),
            None,
        )
        .unwrap();
        drop(write_end);
        let outcome = match proxy.recv().await {
            Ok((data, fds)) => {
                assert_eq!(fds.len(), n);
                match decode_request(&data, fds) {
                    Err(e) => e.to_string(),
                    Ok(m) => return Err(format!("accepted {m:?}")),
                }
            }
            Err(e) => e.to_string(),
        };
        let mut buf = [0u8; 1];
        match nix::unistd::read(read_end.as_raw_fd(), &mut buf) {
            Ok(0) => Err(outcome),
            other => panic!("a received fd is still open ({other:?}) after: {outcome}"),
        }
    }

    #[tokio::test]
    async fn two_fds_are_rejected_and_closed() {
        let msg = many_fds_are_all_closed(2).await.unwrap_err();
        assert!(msg.contains("got 2 (all closed)"), "{msg}");
    }

    #[tokio::test]
    async fn too_many_fds_for_the_control_buffer_are_closed() {
        let msg = many_fds_are_all_closed(64).await.unwrap_err();
        assert!(msg.contains("MSG_CTRUNC"), "{msg}");
    }
}
