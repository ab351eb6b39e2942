//! The agent side of ZDS, written from the protocol description alone (the reference's
//! istio-cni §3 and ztunnel §2.2) and sharing no code with `ambit-zds`, so that a bug both
//! of ambit's ends agree on cannot hide: protobuf encoded and decoded by hand, one message
//! per `SOCK_SEQPACKET` datagram, the pod's netns as the one `SCM_RIGHTS` fd of an Add.
//!
//! Blocking and single-threaded on purpose: a test drives it step by step and reads each
//! answer before the next request, as the reference's agent does.

// File descriptors received with SCM_RIGHTS are taken over as `OwnedFd`, which is
// `unsafe`: each is ours alone once received.
#![allow(unsafe_code)]

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::socket::{
    accept, bind, listen, recvmsg, sendmsg, setsockopt, socket, sockopt, AddressFamily, Backlog,
    ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::time::TimeVal;

/// ztunnel reads into a buffer this large; a longer message would be cut.
pub const MAX_MESSAGE: usize = 1024;

/// A pod as an AddWorkload names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadInfo {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

/// What the agent sends (`istio.workload.zds.WorkloadRequest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Add {
        uid: String,
        info: Option<WorkloadInfo>,
    },
    Keep {
        uid: String,
    },
    Del {
        uid: String,
    },
    SnapshotSent,
}

/// The proxy's answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Ack,
    Nack(String),
}

/// Hand-written protobuf for the few messages of ZDS (proto3: field key = number << 3 |
/// wire type; 0 = varint, 2 = length-delimited).
pub mod proto {
    use super::{Answer, Request, WorkloadInfo};

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn bytes_field(number: u32, value: &[u8], out: &mut Vec<u8>) {
        varint(u64::from(number) << 3 | 2, out);
        varint(value.len() as u64, out);
        out.extend_from_slice(value);
    }

    /// A string field; proto3 leaves an empty string off the wire.
    fn string_field(number: u32, value: &str, out: &mut Vec<u8>) {
        if !value.is_empty() {
            bytes_field(number, value.as_bytes(), out);
        }
    }

    fn workload_info(info: &WorkloadInfo) -> Vec<u8> {
        let mut out = Vec::new();
        string_field(1, &info.name, &mut out);
        string_field(2, &info.namespace, &mut out);
        string_field(3, &info.service_account, &mut out);
        out
    }

    /// `WorkloadRequest { oneof payload { add = 1; del = 2; snapshot_sent = 3; keep = 5 } }`.
    pub fn encode(request: &Request) -> Vec<u8> {
        let mut inner = Vec::new();
        let number = match request {
            Request::Add { uid, info } => {
                string_field(1, uid, &mut inner);
                if let Some(info) = info {
                    bytes_field(2, &workload_info(info), &mut inner);
                }
                1
            }
            // DelWorkload's uid is field 2.
            Request::Del { uid } => {
                string_field(2, uid, &mut inner);
                2
            }
            Request::SnapshotSent => 3,
            Request::Keep { uid } => {
                string_field(1, uid, &mut inner);
                5
            }
        };
        let mut out = Vec::new();
        bytes_field(number, &inner, &mut out);
        out
    }

    #[derive(Debug, PartialEq, Eq)]
    pub enum Value<'a> {
        Varint(u64),
        Bytes(&'a [u8]),
    }

    /// The fields of one message, in wire order; fails on truncation or a wire type ZDS
    /// does not use.
    pub fn fields(mut buf: &[u8]) -> Result<Vec<(u32, Value<'_>)>, String> {
        fn read_varint(buf: &mut &[u8]) -> Result<u64, String> {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let (&b, rest) = buf.split_first().ok_or("truncated varint")?;
                *buf = rest;
                v |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    return Ok(v);
                }
            }
            Err("varint longer than 10 bytes".into())
        }
        let mut out = Vec::new();
        while !buf.is_empty() {
            let key = read_varint(&mut buf)?;
            let number = u32::try_from(key >> 3).map_err(|_| "field number too large")?;
            match key & 7 {
                0 => out.push((number, Value::Varint(read_varint(&mut buf)?))),
                2 => {
                    let len =
                        usize::try_from(read_varint(&mut buf)?).map_err(|_| "length too large")?;
                    if len > buf.len() {
                        return Err(format!(
                            "field {number} claims {len} bytes, {} left",
                            buf.len()
                        ));
                    }
                    let (value, rest) = buf.split_at(len);
                    out.push((number, Value::Bytes(value)));
                    buf = rest;
                }
                other => {
                    return Err(format!(
                        "field {number}: wire type {other} is not used in ZDS"
                    ))
                }
            }
        }
        Ok(out)
    }

    /// `ZdsHello { version = 1 }`: the version number (V1 = 1; absent means 0).
    pub fn decode_hello(buf: &[u8]) -> Result<u64, String> {
        let mut version = 0;
        for (number, value) in fields(buf)? {
            match (number, value) {
                (1, Value::Varint(v)) => version = v,
                (n, v) => return Err(format!("unexpected field {n} in ZdsHello: {v:?}")),
            }
        }
        Ok(version)
    }

    /// `WorkloadResponse { oneof payload { Ack ack = 1 } }`, `Ack { string error = 1 }`.
    pub fn decode_answer(buf: &[u8]) -> Result<Answer, String> {
        let mut ack = None;
        for (number, value) in fields(buf)? {
            match (number, value) {
                (1, Value::Bytes(inner)) => {
                    let mut error = String::new();
                    for (n, v) in fields(inner)? {
                        match (n, v) {
                            (1, Value::Bytes(e)) => {
                                error = String::from_utf8(e.to_vec())
                                    .map_err(|_| "Ack.error is not UTF-8")?
                            }
                            (n, v) => return Err(format!("unexpected field {n} in Ack: {v:?}")),
                        }
                    }
                    ack = Some(error);
                }
                (n, v) => return Err(format!("unexpected field {n} in WorkloadResponse: {v:?}")),
            }
        }
        match ack {
            Some(e) if e.is_empty() => Ok(Answer::Ack),
            Some(e) => Ok(Answer::Nack(e)),
            None => Err("WorkloadResponse without an ack".into()),
        }
    }
}

/// The listening end, at `path`; the socket file is removed on drop.
pub struct ZdsListener {
    fd: OwnedFd,
    path: PathBuf,
}

/// One accepted node proxy.
pub struct ZdsConn {
    fd: OwnedFd,
}

fn io_err(e: nix::Error) -> std::io::Error {
    std::io::Error::from(e)
}

impl ZdsListener {
    pub fn bind(path: &Path) -> anyhow::Result<ZdsListener> {
        let _ = std::fs::remove_file(path);
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .context("creating a SOCK_SEQPACKET socket")?;
        let addr = UnixAddr::new(path)?;
        bind(fd.as_raw_fd(), &addr).with_context(|| format!("binding {}", path.display()))?;
        listen(&fd, Backlog::new(8)?)?;
        Ok(ZdsListener {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Waits up to `timeout` for a node proxy to connect.
    pub fn accept(&self, timeout: Duration) -> anyhow::Result<ZdsConn> {
        let mut poll = [nix::poll::PollFd::new(
            self.fd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let ready = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(ms))?;
        if ready == 0 {
            bail!(
                "no node proxy connected to {} within {timeout:?}",
                self.path.display()
            );
        }
        let raw = accept(self.fd.as_raw_fd())?;
        // SAFETY: accept returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(ZdsConn { fd })
    }
}

impl Drop for ZdsListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl ZdsConn {
    /// Sends one message, with `fd` as its only `SCM_RIGHTS` descriptor when given.
    pub fn send_raw(&self, msg: &[u8], fd: Option<RawFd>) -> std::io::Result<()> {
        let iov = [IoSlice::new(msg)];
        let fds;
        let cmsgs: &[ControlMessage] = match fd {
            Some(f) => {
                fds = [f];
                &[ControlMessage::ScmRights(&fds)]
            }
            None => &[],
        };
        let sent = sendmsg::<()>(self.fd.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None)
            .map_err(io_err)?;
        if sent != msg.len() {
            return Err(std::io::Error::other(format!(
                "sent {sent} of {} bytes",
                msg.len()
            )));
        }
        Ok(())
    }

    /// Receives one message; fails on a timeout, on end of stream, on truncation, and on a
    /// descriptor passed the proxy's way (it never sends one).
    pub fn recv(&self, timeout: Duration) -> anyhow::Result<Vec<u8>> {
        setsockopt(
            &self.fd,
            sockopt::ReceiveTimeout,
            &TimeVal::new(timeout.as_secs() as i64, timeout.subsec_micros().into()),
        )?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let (len, flags, got_fds) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = recvmsg::<()>(
                self.fd.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| match e {
                nix::Error::EAGAIN => {
                    anyhow::anyhow!("no message from the node proxy within {timeout:?}")
                }
                e => anyhow::anyhow!("receiving from the node proxy: {e}"),
            })?;
            let mut got = Vec::new();
            for c in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    got.extend(fds);
                }
            }
            (msg.bytes, msg.flags, got)
        };
        for fd in &got_fds {
            // SAFETY: the kernel installed these descriptors for us; close them.
            drop(unsafe { OwnedFd::from_raw_fd(*fd) });
        }
        if !got_fds.is_empty() {
            bail!("the node proxy passed {} descriptor(s)", got_fds.len());
        }
        if flags.contains(MsgFlags::MSG_TRUNC) || flags.contains(MsgFlags::MSG_CTRUNC) {
            bail!("a message from the node proxy was truncated");
        }
        if len == 0 {
            bail!("the node proxy closed the ZDS connection");
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// Reads the proxy's hello; returns its version.
    pub fn hello(&self, timeout: Duration) -> anyhow::Result<u64> {
        let msg = self.recv(timeout)?;
        proto::decode_hello(&msg).map_err(|e| anyhow::anyhow!("bad ZdsHello {msg:02x?}: {e}"))
    }

    /// Sends `request` (with `netns` as the fd, for an Add) and reads the answer.
    pub fn request(
        &self,
        request: &Request,
        netns: Option<RawFd>,
        timeout: Duration,
    ) -> anyhow::Result<Answer> {
        self.send_raw(&proto::encode(request), netns)
            .with_context(|| format!("sending {request:?}"))?;
        let msg = self
            .recv(timeout)
            .with_context(|| format!("waiting for the answer to {request:?}"))?;
        proto::decode_answer(&msg).map_err(|e| anyhow::anyhow!("bad answer {msg:02x?}: {e}"))
    }

    /// Whether the proxy closed its end (a read returns end of stream within `timeout`).
    pub fn closed_within(&self, timeout: Duration) -> bool {
        match self.recv(timeout) {
            Err(e) => e.to_string().contains("closed the ZDS connection"),
            Ok(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::proto::{decode_answer, decode_hello, encode, fields, Value};
    use super::*;

    #[test]
    fn requests_encode_as_the_reference_numbers_them() {
        let add = encode(&Request::Add {
            uid: "u1".into(),
            info: Some(WorkloadInfo {
                name: "n".into(),
                namespace: "ns".into(),
                service_account: "sa".into(),
            }),
        });
        // add = 1 { uid = 1 "u1", workload_info = 2 { name = 1 "n", namespace = 2 "ns", service_account = 3 "sa" } }
        assert_eq!(
            add,
            [
                0x0a, 0x11, 0x0a, 0x02, b'u', b'1', 0x12, 0x0b, 0x0a, 0x01, b'n', 0x12, 0x02, b'n',
                b's', 0x1a, 0x02, b's', b'a'
            ]
        );
        // del = 2 { uid = 2 }, snapshot_sent = 3 {}, keep = 5 { uid = 1 }
        assert_eq!(
            encode(&Request::Del { uid: "u".into() }),
            [0x12, 0x03, 0x12, 0x01, b'u']
        );
        assert_eq!(encode(&Request::SnapshotSent), [0x1a, 0x00]);
        assert_eq!(
            encode(&Request::Keep { uid: "u".into() }),
            [0x2a, 0x03, 0x0a, 0x01, b'u']
        );
    }

    #[test]
    fn answers_and_hello_decode() {
        assert_eq!(decode_hello(&[0x08, 0x01]), Ok(1));
        assert_eq!(decode_hello(&[]), Ok(0));
        assert_eq!(decode_answer(&[0x0a, 0x00]), Ok(Answer::Ack));
        assert_eq!(
            decode_answer(&[0x0a, 0x04, 0x0a, 0x02, b'n', b'o']),
            Ok(Answer::Nack("no".into()))
        );
        assert!(decode_answer(&[]).is_err(), "a response without an ack");
        assert!(decode_answer(&[0x0a, 0x05, 0x0a]).is_err(), "truncated");
        assert!(fields(&[0x0d, 0, 0, 0, 0]).is_err(), "fixed32 is not used");
        assert_eq!(
            fields(&[0x08, 0x96, 0x01]).unwrap(),
            vec![(1, Value::Varint(150))]
        );
    }

    #[test]
    fn a_proxy_side_pair_exchanges_messages_with_an_fd() {
        let dir = std::env::temp_dir().join(format!("zds-peer-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("z.sock");
        let listener = ZdsListener::bind(&path).unwrap();
        // The node proxy's side, with plain libc calls.
        let client = std::thread::spawn({
            let path = path.clone();
            move || {
                let fd = socket(
                    AddressFamily::Unix,
                    SockType::SeqPacket,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .unwrap();
                nix::sys::socket::connect(fd.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
                let conn = ZdsConn { fd };
                conn.send_raw(&[0x08, 0x01], None).unwrap();
                let mut cmsg = nix::cmsg_space!([RawFd; 2]);
                let mut buf = [0u8; 64];
                let mut iov = [IoSliceMut::new(&mut buf)];
                let msg = recvmsg::<()>(
                    conn.fd.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::empty(),
                )
                .unwrap();
                let fds: Vec<RawFd> = msg
                    .cmsgs()
                    .unwrap()
                    .filter_map(|c| match c {
                        ControlMessageOwned::ScmRights(f) => Some(f),
                        _ => None,
                    })
                    .flatten()
                    .collect();
                let len = msg.bytes;
                assert_eq!(fds.len(), 1);
                drop(unsafe { OwnedFd::from_raw_fd(fds[0]) });
                assert_eq!(buf[..len][0], 0x0a, "an add");
                conn.send_raw(&[0x0a, 0x00], None).unwrap();
            }
        });
        let conn = listener.accept(Duration::from_secs(5)).unwrap();
        assert_eq!(conn.hello(Duration::from_secs(5)).unwrap(), 1);
        let netns = std::fs::File::open("/proc/self/ns/net").unwrap();
        let answer = conn
            .request(
                &Request::Add {
                    uid: "u".into(),
                    info: None,
                },
                Some(netns.as_raw_fd()),
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(answer, Answer::Ack);
        client.join().unwrap();
        assert!(conn.closed_within(Duration::from_secs(5)));
        drop(listener);
        assert!(!path.exists(), "the socket file is removed on drop");
        let _ = std::fs::remove_dir_all(dir);
    }
}
