//! The node proxy's check of the agent it connects to, against a listener really run by
//! another uid (root only).
//!
//! The listener is a child process forked from the test and switched to uid/gid 65534
//! (`nobody`). The test process has other threads, so the child makes only
//! async-signal-safe calls on memory prepared before the fork: it binds and listens, says so
//! on a pipe, and waits to be killed.

// The listener run as another uid is a forked child (fork and the calls after it are
// `unsafe`: only async-signal-safe calls are made between fork and _exit).
#![allow(unsafe_code)]

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ambit_zds::{PeerPolicy, ZdsSocket};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe, ForkResult, Pid};

const NOBODY: u32 = 65534;
/// What the child writes once it listens.
const READY: u8 = b'R';

/// The child listener; killed (and reaped) when the test ends, however it ends.
struct Listener(Pid);

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
        let _ = waitpid(self.0, None);
    }
}

/// Forks a child that listens at `path` as uid/gid 65534; returns once it listens, or
/// panics naming the step at which it failed.
fn listen_as_nobody(path: &Path) -> Listener {
    let addr = nix::sys::socket::UnixAddr::new(path).unwrap();
    let (ready_r, ready_w) = pipe().unwrap();
    // SAFETY: the child calls only async-signal-safe functions (setgroups, setgid, setuid,
    // socket, bind, listen, write, pause, _exit) on memory prepared before the fork.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let code = unsafe { child_listen(&addr, ready_w.as_raw_fd()) };
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(ready_w);
            let listener = Listener(child);
            let mut word = [0u8; 1];
            let said = std::fs::File::from(ready_r).read(&mut word).unwrap_or(0);
            if said == 1 && word[0] == READY {
                return listener;
            }
            let status = waitpid(child, None).unwrap();
            std::mem::forget(listener);
            let step = match status {
                WaitStatus::Exited(_, 10) => "setgroups",
                WaitStatus::Exited(_, 11) => "setgid 65534",
                WaitStatus::Exited(_, 12) => "setuid 65534",
                WaitStatus::Exited(_, 13) => "socket",
                WaitStatus::Exited(_, 14) => "bind (can uid 65534 create the socket file?)",
                WaitStatus::Exited(_, 15) => "listen",
                _ => "an unexpected end, before it said it listens",
            };
            panic!("the uid 65534 listener failed at {step} ({status:?})");
        }
    }
}

/// The forked child's work: listen at `addr` as `nobody`, write [`READY`] to `ready`, then
/// wait to be killed. Returns an exit code only on failure.
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn child_listen(addr: &nix::sys::socket::UnixAddr, ready: i32) -> i32 {
    use nix::sys::socket::SockaddrLike;
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
    if libc::bind(fd, addr.as_ptr().cast(), addr.len()) != 0 {
        return 14;
    }
    if libc::listen(fd, 16) != 0 {
        return 15;
    }
    let word = [READY];
    if libc::write(ready, word.as_ptr().cast(), 1) != 1 {
        return 16;
    }
    loop {
        libc::pause();
    }
}

#[tokio::test]
async fn an_agent_run_by_another_uid_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "test `an_agent_run_by_another_uid_is_refused` needs root (it starts a listener as \
         uid 65534); run the test suite as root"
    );
    let dir = tempfile::tempdir().unwrap();
    // nobody must reach its own directory inside ours.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let home = dir.path().join("nobody");
    std::fs::create_dir(&home).unwrap();
    nix::unistd::chown(
        &home,
        Some(nix::unistd::Uid::from_raw(NOBODY)),
        Some(nix::unistd::Gid::from_raw(NOBODY)),
    )
    .unwrap();
    let path = home.join("ztunnel.sock");
    let _child = listen_as_nobody(&path);

    let err = ZdsSocket::connect_to_agent(&path, &PeerPolicy::new(None))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("node agent") && msg.contains("uid 65534") && msg.contains("ztunnel.sock"),
        "{msg}"
    );

    // The same listener is fine once its uid is allowed.
    let sock = ZdsSocket::connect_to_agent(&path, &PeerPolicy::new(Some(NOBODY)))
        .await
        .unwrap();
    assert_eq!(sock.peer_credentials().unwrap().uid, NOBODY);
}
