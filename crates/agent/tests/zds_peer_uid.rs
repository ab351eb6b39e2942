//! The agent's check of the node proxy that connects to its ZDS socket, against a proxy
//! really run by another uid (root only: the proxy is a child process run as `nobody`).
//!
//! The socket's 0600 mode already keeps `nobody` out; the test loosens it (0666, a
//! directory anyone may traverse), as a misconfiguration would, to reach the second fence:
//! `SO_PEERCRED`. The proxy is a child forked from the test and switched to uid/gid 65534.
//! The test process has other threads, so the child makes only async-signal-safe calls on
//! memory prepared before the fork: it connects, says hello, acks what it receives and
//! passes each message to the test on a pipe; the test decodes them.

// The node proxy run as another uid is a forked child (fork and the calls after it are
// `unsafe`: only async-signal-safe calls are made between fork and _exit).
#![allow(unsafe_code)]

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ambit_agent::zds::{ZdsOptions, ZdsServer};
use ambit_cni::api::PodInfo;
use ambit_zds::protocol::{decode_request, encode_ack, encode_hello};
use ambit_zds::wire::RECV_BUFFER_LEN;
use ambit_zds::PeerPolicy;
use common::require_root;
use nix::sys::socket::{SockaddrLike, UnixAddr};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe, ForkResult};

const NOBODY: u32 = 65534;
/// The child's silence guard: no message for this long ends its run (only a hang).
const SILENCE_MS: i32 = 10_000;

/// The child's records on its pipe: a tag, then for [`MESSAGE`] the number of fds that came
/// with it (one byte; the child closes them), the length (u32 LE) and the bytes; for the
/// others an errno (i32 LE). [`STOPPED`] answers the test's stop byte.
const MESSAGE: u8 = b'M';
const CONNECT_FAILED: u8 = b'F';
const HELLO_FAILED: u8 = b'H';
const CLOSED: u8 = b'C';
const SILENT: u8 = b'S';
const RECV_ERROR: u8 = b'E';
const STOPPED: u8 = b'X';

/// Everything the child uses, allocated before the fork.
struct ChildPlan {
    addr: UnixAddr,
    hello: Vec<u8>,
    ack: Vec<u8>,
    buf: Vec<u8>,
    /// Control-message space (u64 for cmsghdr's alignment).
    cmsg: Vec<u64>,
    record: Vec<u8>,
    out: i32,
    stop: i32,
}

/// Runs a node proxy as `nobody` against `path`; returns its outcome: `CONNECT-FAILED`,
/// `HELLO-FAILED`, `ERROR`, `CLOSED after [..]`, `SILENT after [..]`, or `SNAPSHOT [..]`
/// (the messages up to the snapshot's end, which the test stops it at).
async fn proxy_as_nobody(path: &Path) -> String {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || run_child_proxy(&path))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

fn run_child_proxy(path: &Path) -> String {
    let (out_r, out_w) = pipe().unwrap();
    let (stop_r, stop_w) = pipe().unwrap();
    let mut plan = ChildPlan {
        addr: UnixAddr::new(path).unwrap(),
        hello: encode_hello(),
        ack: encode_ack(None),
        buf: vec![0; RECV_BUFFER_LEN],
        cmsg: vec![0; 64],
        record: vec![0; RECV_BUFFER_LEN + 6],
        out: out_w.as_raw_fd(),
        stop: stop_r.as_raw_fd(),
    };
    // SAFETY: the child calls only async-signal-safe functions (setgroups, setgid, setuid,
    // socket, connect, send, poll, recvmsg, close, write, _exit) on `plan`, prepared before.
    let child = match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let code = unsafe { child_proxy(&mut plan) };
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    };
    drop(out_w);
    drop(stop_r);
    let mut stop = std::fs::File::from(stop_w);
    let mut out = std::fs::File::from(out_r);
    let mut kinds: Vec<&'static str> = Vec::new();
    let errno = |out: &mut std::fs::File| -> String {
        let mut b = [0u8; 4];
        out.read_exact(&mut b).unwrap();
        nix::errno::Errno::from_raw(i32::from_le_bytes(b))
            .desc()
            .to_owned()
    };
    // Only an explicit last record ends the reading: the pipe's end may come late (another
    // test's child forked meanwhile holds a copy of its write side).
    let outcome = loop {
        let mut tag = [0u8; 1];
        if out.read_exact(&mut tag).is_err() {
            break None;
        }
        match tag[0] {
            MESSAGE => {
                let mut head = [0u8; 5];
                out.read_exact(&mut head).unwrap();
                let len = u32::from_le_bytes(head[1..5].try_into().unwrap()) as usize;
                let mut bytes = vec![0; len];
                out.read_exact(&mut bytes).unwrap();
                // The child closed the fds it got; stand-ins keep the fd rules checked
                // (an Add must carry exactly one).
                let fds: Vec<OwnedFd> = (0..head[0])
                    .map(|_| std::fs::File::open("/dev/null").unwrap().into())
                    .collect();
                let kind = decode_request(&bytes, fds)
                    .map(|m| m.kind())
                    .unwrap_or("garbage");
                kinds.push(kind);
                if kind == "SnapshotSent" {
                    stop.write_all(b"x").unwrap();
                }
            }
            CONNECT_FAILED => break Some(format!("CONNECT-FAILED {}", errno(&mut out))),
            HELLO_FAILED => break Some(format!("HELLO-FAILED {}", errno(&mut out))),
            RECV_ERROR => break Some(format!("ERROR {}", errno(&mut out))),
            CLOSED => break Some(format!("CLOSED after {kinds:?}")),
            SILENT => break Some(format!("SILENT after {kinds:?}")),
            STOPPED => break Some(format!("SNAPSHOT {kinds:?}")),
            other => break Some(format!("a record the child never writes: {other}")),
        }
    };
    let status = waitpid(child, None).unwrap();
    let step = match status {
        WaitStatus::Exited(_, 0) => None,
        WaitStatus::Exited(_, 10) => Some("setgroups"),
        WaitStatus::Exited(_, 11) => Some("setgid 65534"),
        WaitStatus::Exited(_, 12) => Some("setuid 65534"),
        WaitStatus::Exited(_, 13) => Some("socket"),
        WaitStatus::Exited(_, 14) => Some("writing to the test"),
        _ => Some("an unexpected end"),
    };
    if let Some(step) = step {
        panic!("the uid 65534 proxy failed at {step} ({status:?})");
    }
    outcome.unwrap_or_else(|| panic!("the uid 65534 proxy reported nothing ({status:?})"))
}

/// Writes all of `bytes` to `fd`; false on failure.
///
/// # Safety
/// Async-signal-safe; `fd` is a pipe's write side.
unsafe fn write_all(fd: i32, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        let n = libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done);
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

/// Writes a record of `tag` and the current errno.
///
/// # Safety
/// As [`write_all`].
unsafe fn report_errno(fd: i32, tag: u8) -> bool {
    let e = (*libc::__errno_location()).to_le_bytes();
    write_all(fd, &[tag, e[0], e[1], e[2], e[3]])
}

/// The forked child's work; returns its exit code (0 once it has written its last record).
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn child_proxy(p: &mut ChildPlan) -> i32 {
    if libc::setgroups(0, std::ptr::null()) != 0 {
        return 10;
    }
    if libc::setgid(NOBODY) != 0 {
        return 11;
    }
    if libc::setuid(NOBODY) != 0 {
        return 12;
    }
    let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
    if fd < 0 {
        return 13;
    }
    let last = |written: bool| if written { 0 } else { 14 };
    if libc::connect(fd, p.addr.as_ptr().cast(), p.addr.len()) != 0 {
        return last(report_errno(p.out, CONNECT_FAILED));
    }
    if libc::send(
        fd,
        p.hello.as_ptr().cast(),
        p.hello.len(),
        libc::MSG_NOSIGNAL,
    ) < 0
    {
        return last(report_errno(p.out, HELLO_FAILED));
    }
    loop {
        let mut polled = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: p.stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ready = libc::poll(polled.as_mut_ptr(), 2, SILENCE_MS);
        if ready < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        if ready < 0 {
            return last(report_errno(p.out, RECV_ERROR));
        }
        if ready == 0 {
            return last(write_all(p.out, &[SILENT]));
        }
        if polled[1].revents != 0 {
            return last(write_all(p.out, &[STOPPED]));
        }
        let mut iov = libc::iovec {
            iov_base: p.buf.as_mut_ptr().cast(),
            iov_len: p.buf.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = p.cmsg.as_mut_ptr().cast();
        msg.msg_controllen = p.cmsg.len() * std::mem::size_of::<u64>();
        let n = libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        if n < 0 {
            return last(report_errno(p.out, RECV_ERROR));
        }
        if n == 0 {
            return last(write_all(p.out, &[CLOSED]));
        }
        let mut fds = 0u8;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const i32;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<i32>();
                for i in 0..count {
                    libc::close(*data.add(i));
                    fds = fds.saturating_add(1);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        let n = n as usize;
        p.record[0] = MESSAGE;
        p.record[1] = fds;
        p.record[2..6].copy_from_slice(&(n as u32).to_le_bytes());
        p.record[6..6 + n].copy_from_slice(&p.buf[..n]);
        if !write_all(p.out, &p.record[..6 + n]) {
            return 14;
        }
        // An ack that cannot go out shows as the close or error the next receive sees.
        libc::send(fd, p.ack.as_ptr().cast(), p.ack.len(), libc::MSG_NOSIGNAL);
    }
}

fn pod(uid: &str) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        name: uid.into(),
        namespace: "ns".into(),
        service_account: "sa".into(),
        netns: "/proc/self/ns/net".into(),
        ips: vec!["10.0.0.1".parse().unwrap()],
        container_id: String::new(),
    }
}

/// A server whose socket `nobody` can reach (the misconfiguration the peer check is for).
fn loosened_server(dir: &Path, peers: PeerPolicy) -> ZdsServer {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let path = dir.join("ztunnel/ztunnel.sock");
    let server = ZdsServer::bind_with(&path, [pod("p1")], ZdsOptions::default(), peers).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600, "as bound");
    assert_eq!(mode(&dir.join("ztunnel")), 0o700, "as created");
    std::fs::set_permissions(dir.join("ztunnel"), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    server
}

#[tokio::test]
async fn a_proxy_run_by_another_uid_is_refused() {
    require_root("a_proxy_run_by_another_uid_is_refused");
    let dir = tempfile::tempdir().unwrap();

    // The mode alone keeps nobody out.
    let path = dir.path().join("strict/ztunnel.sock");
    let _strict = ZdsServer::bind(&path, []).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let outcome = proxy_as_nobody(&path).await;
    assert_eq!(outcome, "CONNECT-FAILED Permission denied");

    // Past a loosened mode, the peer check refuses it before it hears of any pod.
    let server = loosened_server(dir.path(), PeerPolicy::new(None));
    let outcome = proxy_as_nobody(server.path()).await;
    // Closed at accept: the hello may not even get out, and a hello the agent never read
    // turns the close into a reset.
    assert!(
        outcome == "CLOSED after []"
            || outcome.starts_with("HELLO-FAILED")
            || (outcome.starts_with("ERROR") && outcome.contains("reset by peer")),
        "{outcome}"
    );
    assert_eq!(server.connected_proxies(), 0);
}

#[tokio::test]
async fn a_proxy_run_by_the_configured_uid_is_served() {
    require_root("a_proxy_run_by_the_configured_uid_is_served");
    let dir = tempfile::tempdir().unwrap();
    let server = loosened_server(dir.path(), PeerPolicy::new(Some(NOBODY)));
    let outcome = proxy_as_nobody(server.path()).await;
    assert_eq!(outcome, r#"SNAPSHOT ["AddWorkload", "SnapshotSent"]"#);
}
