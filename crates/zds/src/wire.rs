//! The ZDS transport: a Unix `SOCK_SEQPACKET` socket carrying one protobuf message per
//! datagram (no length prefix), with the pod's netns fd passed as `SCM_RIGHTS` ancillary data.
//!
//! The node agent listens ([`ZdsListener`]), the node proxy connects ([`ZdsSocket::connect`]).
//! Both sockets are non-blocking and driven by tokio through [`AsyncFd`].
//!
//! Sizes: Istio's node proxy and node agent both read into a 1024-byte buffer and fail on
//! `MSG_TRUNC`, so [`ZdsSocket::send`] refuses anything over [`MAX_MESSAGE_LEN`] (a real peer
//! could not read it). We read with a larger [`RECV_BUFFER_LEN`] buffer so that anything a
//! compatible peer sends fits.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    self, sockopt, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};
use tokio::io::unix::AsyncFd;

use crate::peer::{PeerCredentials, PeerPolicy, PeerRefused, PeerRole};
use crate::sockfile::bind_private;

/// The largest datagram we send: Istio's peers read ZDS messages into a 1024-byte buffer.
pub const MAX_MESSAGE_LEN: usize = 1024;

/// Our receive buffer: at least [`MAX_MESSAGE_LEN`] (what Istio's node agent may send us), with
/// headroom. A larger datagram is an error ([`WireError::Truncated`]).
pub const RECV_BUFFER_LEN: usize = 4096;

/// Room for the control data of one datagram: enough for a handful of fds, so that a message
/// carrying "more than one fd" is received whole and rejected by the protocol layer (which
/// closes them). Beyond that the kernel sets `MSG_CTRUNC` and [`ZdsSocket::recv`] closes what
/// it got. `u64` elements give the buffer the alignment of `cmsghdr`.
const CMSG_BUFFER_WORDS: usize = 8;

/// How long [`ZdsSocket::connect`] keeps retrying while the listener's backlog is full.
const BACKLOG_FULL_RETRIES: u32 = 50;
const BACKLOG_FULL_DELAY: Duration = Duration::from_millis(10);

/// Errors reading a datagram.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The peer closed the connection (a zero-length read without fds).
    #[error("ZDS peer closed the connection")]
    PeerClosed,
    /// The datagram did not fit in [`RECV_BUFFER_LEN`] bytes (`MSG_TRUNC`).
    #[error("ZDS message truncated (MSG_TRUNC): larger than {RECV_BUFFER_LEN} bytes")]
    Truncated,
    /// Too much ancillary data (`MSG_CTRUNC`); every fd that arrived has been closed.
    #[error("ZDS control message truncated (MSG_CTRUNC): too many fds; all received fds closed")]
    ControlTruncated,
    /// A socket error.
    #[error("ZDS socket error: {0}")]
    Io(#[from] io::Error),
}

/// One end of a ZDS connection.
#[derive(Debug)]
pub struct ZdsSocket {
    fd: AsyncFd<OwnedFd>,
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// Registers a non-blocking fd with the current tokio reactor.
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(io::Error::other(
            "ZDS sockets must be created inside a tokio runtime",
        ));
    }
    // SAFETY: an `OwnedFd` is a valid open fd that only its owner (now the `AsyncFd`) closes,
    // and its `as_raw_fd()` always returns that same fd.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

fn unix_addr(path: &Path) -> io::Result<UnixAddr> {
    UnixAddr::new(path).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("invalid ZDS socket path {}: {e}", path.display()),
        )
    })
}

impl ZdsSocket {
    /// Wraps a connected, non-blocking SEQPACKET socket.
    fn new(fd: OwnedFd) -> io::Result<ZdsSocket> {
        Ok(ZdsSocket { fd: register(fd)? })
    }

    /// Connects to the node agent's socket (node proxy side).
    ///
    /// A non-blocking connect that reports `EINPROGRESS` is completed by waiting for
    /// writability and reading `SO_ERROR`. A Unix socket reports `EAGAIN` when the listener's
    /// backlog is full; it is then not connecting at all, so the connect is retried for a
    /// short while before giving up with `WouldBlock` (the caller's backoff takes over).
    pub async fn connect(path: impl AsRef<Path>) -> io::Result<ZdsSocket> {
        let path = path.as_ref();
        let addr = unix_addr(path)?;
        let fd = seqpacket_socket()?;
        let context = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("connect to ZDS socket {}: {e}", path.display()),
            )
        };
        let mut backlog_full = 0;
        loop {
            match socket::connect(fd.as_raw_fd(), &addr) {
                Ok(()) => return ZdsSocket::new(fd),
                Err(Errno::EINTR) => continue,
                Err(Errno::EINPROGRESS) => {
                    let sock = ZdsSocket::new(fd)?;
                    let guard = sock.fd.writable().await?;
                    drop(guard);
                    let err = socket::getsockopt(sock.fd.get_ref(), sockopt::SocketError)?;
                    if err != 0 {
                        return Err(context(io::Error::from_raw_os_error(err)));
                    }
                    return Ok(sock);
                }
                Err(Errno::EAGAIN) if backlog_full < BACKLOG_FULL_RETRIES => {
                    backlog_full += 1;
                    tokio::time::sleep(BACKLOG_FULL_DELAY).await;
                }
                Err(Errno::EAGAIN) => {
                    return Err(context(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "the listener's backlog stays full",
                    )))
                }
                Err(errno) => return Err(context(errno.into())),
            }
        }
    }

    /// Connects to the node agent's socket and checks who listens there ([`PeerPolicy`]):
    /// a listener run by another uid is refused (`PermissionDenied`, naming it) before a
    /// byte is sent.
    pub async fn connect_to_agent(
        path: impl AsRef<Path>,
        policy: &PeerPolicy,
    ) -> io::Result<ZdsSocket> {
        let path = path.as_ref();
        let sock = ZdsSocket::connect(path).await?;
        let peer = sock.peer_credentials()?;
        policy
            .check(PeerRole::NodeAgent, peer)
            .map_err(|e: PeerRefused| {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("ZDS socket {}: {e}", path.display()),
                )
            })?;
        Ok(sock)
    }

    /// The peer's credentials (`SO_PEERCRED`): for a connecting socket, those of the process
    /// that listened; for an accepted one, those of the process that connected.
    pub fn peer_credentials(&self) -> io::Result<PeerCredentials> {
        let cred = socket::getsockopt(self.fd.get_ref(), sockopt::PeerCredentials)?;
        Ok(PeerCredentials {
            pid: cred.pid(),
            uid: cred.uid(),
            gid: cred.gid(),
        })
    }

    /// A connected pair (for tests and in-process wiring).
    pub fn pair() -> io::Result<(ZdsSocket, ZdsSocket)> {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        )?;
        Ok((ZdsSocket::new(a)?, ZdsSocket::new(b)?))
    }

    /// Sends one datagram, with `fd` attached as `SCM_RIGHTS` if given.
    ///
    /// Refuses an empty message (the peer would read it as end-of-stream) and one longer than
    /// [`MAX_MESSAGE_LEN`] (an Istio peer could not read it).
    pub async fn send(&self, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        if bytes.is_empty() || bytes.len() > MAX_MESSAGE_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "ZDS message of {} bytes: must be 1..={MAX_MESSAGE_LEN} bytes",
                    bytes.len()
                ),
            ));
        }
        let fds = fd.map(|fd| [fd.as_raw_fd()]);
        let cmsgs: &[ControlMessage<'_>] = match &fds {
            Some(fds) => &[ControlMessage::ScmRights(fds)],
            None => &[],
        };
        let iov = [io::IoSlice::new(bytes)];
        loop {
            let mut guard = self.fd.writable().await?;
            let sent = guard.try_io(|inner| {
                socket::sendmsg::<()>(
                    inner.as_raw_fd(),
                    &iov,
                    cmsgs,
                    MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                    None,
                )
                .map_err(io::Error::from)
            });
            match sent {
                Ok(Ok(n)) if n == bytes.len() => return Ok(()),
                Ok(Ok(n)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("ZDS datagram cut short: sent {n} of {} bytes", bytes.len()),
                    ))
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Receives one datagram and the fds that came with it (close-on-exec).
    pub async fn recv(&self) -> Result<(Vec<u8>, Vec<OwnedFd>), WireError> {
        let mut buf = vec![0u8; RECV_BUFFER_LEN];
        let received = loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|inner| recv_with_fds(inner.get_ref().as_fd(), &mut buf)) {
                Ok(Ok(r)) => break r,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => continue,
            }
        };
        // Any early return below drops (closes) the received fds.
        if received.truncated {
            return Err(WireError::Truncated);
        }
        if received.control_truncated {
            return Err(WireError::ControlTruncated);
        }
        if received.len == 0 && received.fds.is_empty() {
            return Err(WireError::PeerClosed);
        }
        buf.truncate(received.len);
        Ok((buf, received.fds))
    }
}

impl AsFd for ZdsSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

struct Received {
    len: usize,
    truncated: bool,
    control_truncated: bool,
    fds: Vec<OwnedFd>,
}

/// One non-blocking `recvmsg(MSG_CMSG_CLOEXEC)`, taking ownership of every fd that arrived,
/// including on `MSG_CTRUNC` (which `nix`'s safe API would not let us reach, leaking them).
fn recv_with_fds(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut cmsg_buf = [0u64; CMSG_BUFFER_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `msghdr` is a plain C struct for which all-zero bytes (null pointers, zero
    // lengths) are a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg_buf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg_buf) as _;

    // SAFETY: `msg` points at `iov` (describing `buf`) and `cmsg_buf`, all live and exclusively
    // borrowed for the duration of the call; the lengths match the buffers.
    let n = unsafe {
        libc::recvmsg(
            fd.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }

    let mut fds = Vec::new();
    // SAFETY: `msg` was filled in by a successful recvmsg: `msg_control`/`msg_controllen`
    // describe the initialized part of `cmsg_buf` (8-byte aligned, as `cmsghdr` needs), and the
    // CMSG_* helpers never step outside it. The payload of an SCM_RIGHTS message is an array of
    // `c_int` fds that the kernel has just installed in our fd table for us alone, so each may
    // be owned exactly once by an `OwnedFd`. The payload may be unaligned, hence read_unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let hdr = &*cmsg;
            if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
                let header_len = libc::CMSG_LEN(0) as usize;
                let payload = (hdr.cmsg_len as usize).saturating_sub(header_len);
                let count = payload / std::mem::size_of::<libc::c_int>();
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    if raw >= 0 {
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }

    Ok(Received {
        len: n as usize,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        control_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
        fds,
    })
}

/// The node agent's listening socket.
#[derive(Debug)]
pub struct ZdsListener {
    fd: AsyncFd<OwnedFd>,
    path: PathBuf,
}

impl ZdsListener {
    /// Binds and listens at `path` with mode 0600 from the start (see [`bind_private`]),
    /// first removing a stale socket file left there; a missing directory is created with
    /// mode 0700. Anything else at `path` (a regular file, a directory) is an error, never
    /// removed. Must be called inside a tokio runtime.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<ZdsListener> {
        let path = path.as_ref();
        let context = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("listen on ZDS socket {}: {e}", path.display()),
            )
        };
        let fd = bind_private(path, |tmp| {
            let addr = unix_addr(tmp)?;
            let fd = seqpacket_socket()?;
            socket::bind(fd.as_raw_fd(), &addr)?;
            socket::listen(&fd, Backlog::MAXCONN)?;
            Ok(fd)
        })
        .map_err(context)?;
        Ok(ZdsListener {
            fd: register(fd)?,
            path: path.to_owned(),
        })
    }

    /// The path this listener is bound to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one node proxy connection.
    pub async fn accept(&self) -> io::Result<ZdsSocket> {
        loop {
            let mut guard = self.fd.readable().await?;
            let accepted = guard.try_io(|inner| {
                socket::accept4(
                    inner.as_raw_fd(),
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                )
                .map_err(io::Error::from)
            });
            match accepted {
                Ok(Ok(raw)) => {
                    // SAFETY: accept4 succeeded, so `raw` is a new fd that nothing else owns.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    return ZdsSocket::new(fd);
                }
                Ok(Err(e))
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::ECONNABORTED | libc::EPROTO)
                    ) =>
                {
                    continue
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsFd for ZdsListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{decode_hello, decode_response, encode_ack, encode_hello};

    #[tokio::test]
    async fn listener_connect_hello_ack() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let listener = ZdsListener::bind(&path).unwrap();
        assert_eq!(listener.path(), path);
        let (proxy, agent) = tokio::join!(ZdsSocket::connect(&path), listener.accept());
        let (proxy, agent) = (proxy.unwrap(), agent.unwrap());

        proxy.send(&encode_hello(), None).await.unwrap();
        let (bytes, fds) = agent.recv().await.unwrap();
        assert!(fds.is_empty());
        assert_eq!(
            decode_hello(&bytes).unwrap().version(),
            crate::proto::Version::V1
        );

        proxy.send(&encode_ack(Some("nope")), None).await.unwrap();
        let (bytes, _) = agent.recv().await.unwrap();
        assert_eq!(decode_response(&bytes).unwrap(), Err("nope".into()));

        drop(proxy);
        assert!(matches!(agent.recv().await, Err(WireError::PeerClosed)));
    }

    #[tokio::test]
    async fn bind_replaces_stale_socket_but_not_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        drop(ZdsListener::bind(&path).unwrap());
        assert!(path.exists(), "the socket file outlives its listener");
        let listener = ZdsListener::bind(&path).unwrap();
        let (c, a) = tokio::join!(ZdsSocket::connect(&path), listener.accept());
        c.unwrap();
        a.unwrap();

        let file = dir.path().join("plain");
        std::fs::write(&file, b"keep me").unwrap();
        let err = ZdsListener::bind(&file).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    }

    #[tokio::test]
    async fn listener_is_0600_in_a_0700_directory_and_peers_are_recorded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel/ztunnel.sock");
        let listener = ZdsListener::bind(&path).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("ztunnel")), 0o700);

        let policy = PeerPolicy::default();
        let (proxy, agent) = tokio::join!(
            ZdsSocket::connect_to_agent(&path, &policy),
            listener.accept()
        );
        let (proxy, agent) = (proxy.unwrap(), agent.unwrap());
        let me = PeerCredentials {
            pid: std::process::id() as i32,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        };
        assert_eq!(proxy.peer_credentials().unwrap(), me);
        assert_eq!(agent.peer_credentials().unwrap(), me);
    }

    #[tokio::test]
    async fn connect_without_listener_fails() {
        let dir = tempfile::tempdir().unwrap();
        let err = ZdsSocket::connect(dir.path().join("absent.sock"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(err.to_string().contains("absent.sock"), "{err}");
    }

    #[tokio::test]
    async fn message_boundaries_are_kept() {
        let (a, b) = ZdsSocket::pair().unwrap();
        a.send(b"one", None).await.unwrap();
        a.send(b"two!", None).await.unwrap();
        assert_eq!(b.recv().await.unwrap().0, b"one");
        assert_eq!(b.recv().await.unwrap().0, b"two!");
    }

    #[tokio::test]
    async fn send_limits() {
        let (a, _b) = ZdsSocket::pair().unwrap();
        let err = a.send(&[], None).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = a.send(&[0; MAX_MESSAGE_LEN + 1], None).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        a.send(&[0; MAX_MESSAGE_LEN], None).await.unwrap();
    }

    #[tokio::test]
    async fn oversized_datagram_is_truncation_error_then_stream_continues() {
        let (a, b) = ZdsSocket::pair().unwrap();
        // Bypass our own send limit, as a misbehaving peer would.
        let big = vec![7u8; RECV_BUFFER_LEN + 1];
        socket::send(a.as_fd().as_raw_fd(), &big, MsgFlags::empty()).unwrap();
        a.send(b"next", None).await.unwrap();
        assert!(matches!(b.recv().await, Err(WireError::Truncated)));
        assert_eq!(b.recv().await.unwrap().0, b"next");
    }

    #[tokio::test]
    async fn recv_waits_for_data() {
        let (a, b) = ZdsSocket::pair().unwrap();
        let reader = tokio::spawn(async move { b.recv().await.map(|(d, _)| d) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.send(b"late", None).await.unwrap();
        assert_eq!(reader.await.unwrap().unwrap(), b"late");
    }

    #[test]
    fn outside_a_runtime_is_an_error_not_a_panic() {
        let err = ZdsSocket::pair().unwrap_err();
        assert!(err.to_string().contains("tokio runtime"), "{err}");
    }
}
