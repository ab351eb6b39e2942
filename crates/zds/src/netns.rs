//! Network namespace handles.
//!
//! A [`Netns`] owns an fd referring to a network namespace (received over ZDS, or opened from
//! a path such as `/var/run/netns/<name>` or `/proc/<pid>/ns/net`) together with its identity
//! `(inode, dev)` from `fstat`: two fds refer to the same namespace exactly when their
//! [`NetnsId`]s are equal.
//!
//! A netns belongs to a *thread*. [`Netns::run_in`] runs a closure on a short-lived dedicated OS
//! thread that first switches into the namespace, so a socket created by the closure lives in
//! the namespace for good while the caller's thread (e.g. a tokio worker) never moves.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::sched::{setns, CloneFlags};

/// The identity of a network namespace: the nsfs inode and device of its fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetnsId {
    pub inode: u64,
    pub dev: u64,
}

impl fmt::Display for NetnsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "net:[{}] (dev {})", self.inode, self.dev)
    }
}

/// An owned handle to a network namespace.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    id: NetnsId,
}

impl Netns {
    /// Wraps an fd (for instance one received in an `AddWorkload`), reading its identity with
    /// `fstat`. The fd is not checked to be a network namespace (see
    /// [`Netns::is_net_namespace`]); [`Netns::run_in`] fails on anything else.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Netns> {
        let st = nix::sys::stat::fstat(fd.as_raw_fd())?;
        let id = NetnsId {
            inode: st.st_ino,
            dev: st.st_dev,
        };
        Ok(Netns { fd, id })
    }

    /// Opens a namespace file, e.g. `/var/run/netns/<name>` or `/proc/<pid>/ns/net`.
    /// The fd is close-on-exec.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Netns> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("open network namespace {}: {e}", path.display()),
            )
        })?;
        Netns::from_fd(file.into())
    }

    /// The network namespace of the calling thread (`/proc/thread-self/ns/net`).
    pub fn current() -> io::Result<Netns> {
        Netns::open("/proc/thread-self/ns/net")
    }

    /// The namespace identity `(inode, dev)`.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// Duplicates the fd (close-on-exec); the copy has the same [`NetnsId`].
    pub fn try_clone(&self) -> io::Result<Netns> {
        Ok(Netns {
            fd: self.fd.try_clone()?,
            id: self.id,
        })
    }

    /// Whether the fd really refers to a network namespace (ioctl `NS_GET_NSTYPE` returns
    /// `CLONE_NEWNET`). A sanity check for logs; [`Netns::run_in`] is the authority.
    pub fn is_net_namespace(&self) -> bool {
        // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd's namespace type;
        // the fd is valid for the call because `self` owns it. On a non-nsfs fd it fails.
        let nstype = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::NS_GET_NSTYPE) };
        nstype == libc::CLONE_NEWNET
    }

    /// Runs `f` on a dedicated, short-lived OS thread that has switched into this network
    /// namespace (`setns(CLONE_NEWNET)`), and returns its result. Sockets created by `f` stay
    /// in this namespace for their whole life. The calling thread is never switched.
    ///
    /// A panic inside `f` is propagated to the caller.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        let fd = self.fd.as_fd();
        std::thread::scope(|scope| {
            let handle = std::thread::Builder::new()
                .name("netns".into())
                .spawn_scoped(scope, move || {
                    setns(fd, CloneFlags::CLONE_NEWNET).map_err(|errno| {
                        io::Error::new(
                            io::Error::from(errno).kind(),
                            format!(
                                "setns(CLONE_NEWNET) into {}: {errno} \
                                 (needs CAP_SYS_ADMIN and a network namespace fd)",
                                self.id
                            ),
                        )
                    })?;
                    // The thread ends right after `f`, so it never runs anything else in
                    // this namespace.
                    f()
                })?;
            match handle.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }
}

impl Netns {
    /// Runs `f` on the *calling* thread switched into this namespace, then switches the
    /// thread back to where it was. Two `setns` calls instead of a thread: this is what the
    /// data path uses to create a socket in a pod. `f` must be short and synchronous (it
    /// cannot yield, so an async worker never runs other work inside the pod namespace).
    /// If switching back fails the process aborts: a worker stuck in a pod namespace would
    /// create every later socket in the wrong place.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        // Remember where this thread lives, once per thread (no per-call open/dup).
        HOME.with(|home| -> io::Result<()> {
            if home.get().is_none() {
                let fd: OwnedFd = File::open("/proc/thread-self/ns/net")?.into();
                let _ = home.set(fd);
            }
            Ok(())
        })?;
        setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|errno| {
            io::Error::new(
                io::Error::from(errno).kind(),
                format!("setns(CLONE_NEWNET) into {}: {errno}", self.id),
            )
        })?;
        struct Return;
        impl Drop for Return {
            fn drop(&mut self) {
                let back = HOME.with(|home| match home.get() {
                    Some(fd) => setns(fd.as_fd(), CloneFlags::CLONE_NEWNET),
                    None => Err(nix::errno::Errno::EBADF),
                });
                if let Err(errno) = back {
                    eprintln!("fatal: cannot return a thread to its network namespace: {errno}");
                    std::process::abort();
                }
            }
        }
        let _back = Return;
        Ok(f())
    }
}

thread_local! {
    /// The namespace each thread started in, opened on its first [`Netns::enter`].
    static HOME: std::cell::OnceCell<OwnedFd> = const { std::cell::OnceCell::new() };
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl PartialEq for Netns {
    /// Same namespace (same [`NetnsId`]), whatever the fd numbers.
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Netns {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::process::Command;

    fn require_root(what: &str) {
        if !nix::unistd::Uid::effective().is_root() {
            panic!(
                "test `{what}` needs root (setns(CLONE_NEWNET), `ip netns add`); \
                 run the test suite as root"
            );
        }
    }

    /// A named netns made with `ip netns add`, deleted on drop (also when the test panics).
    struct TestNetns {
        name: String,
    }

    impl TestNetns {
        fn new() -> TestNetns {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let name = format!("ambit-test-{}-{nanos:x}", std::process::id());
            let guard = TestNetns { name };
            guard.ip(&["netns", "add", &guard.name]);
            guard.ip(&["-n", &guard.name, "link", "set", "lo", "up"]);
            guard
        }

        fn ip(&self, args: &[&str]) {
            let out = Command::new("ip")
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("cannot run `ip` (install iproute2): {e}"));
            assert!(
                out.status.success(),
                "`ip {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }

        fn path(&self) -> String {
            format!("/var/run/netns/{}", self.name)
        }
    }

    impl Drop for TestNetns {
        fn drop(&mut self) {
            let _ = Command::new("ip")
                .args(["netns", "delete", &self.name])
                .status();
        }
    }

    #[test]
    fn current_is_stable_and_a_netns() {
        let a = Netns::current().unwrap();
        let b = Netns::current().unwrap();
        assert_eq!(a.id(), b.id());
        assert_eq!(a, b);
        assert!(a.is_net_namespace());
        let c = a.try_clone().unwrap();
        assert_eq!(c.id(), a.id());
        assert_ne!(c.as_fd().as_raw_fd(), a.as_fd().as_raw_fd());
    }

    #[test]
    fn non_netns_fd_is_detected_and_run_in_fails() {
        let devnull: OwnedFd = File::open("/dev/null").unwrap().into();
        let ns = Netns::from_fd(devnull).unwrap();
        assert!(!ns.is_net_namespace());
        let err = ns.run_in(|| Ok(())).unwrap_err();
        assert!(err.to_string().contains("setns"), "{err}");
    }

    #[test]
    fn enter_switches_the_calling_thread_and_always_returns() {
        require_root("enter_switches_the_calling_thread_and_always_returns");
        let test_ns = TestNetns::new();
        let ns = Netns::open(test_ns.path()).unwrap();
        let host = Netns::current().unwrap();
        for _ in 0..3 {
            let (inside, listener) = ns
                .enter(|| {
                    (
                        Netns::current().map(|n| n.id()),
                        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)),
                    )
                })
                .unwrap();
            assert_eq!(inside.unwrap(), ns.id(), "inside the pod's namespace");
            assert_eq!(
                Netns::current().unwrap().id(),
                host.id(),
                "and back home after"
            );
            // The socket made inside lives there: the pod reaches it on its loopback.
            let listener = listener.unwrap();
            let port = listener.local_addr().unwrap().port();
            ns.run_in(|| TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map(drop))
                .unwrap();
        }
        // A panic inside still brings the thread home.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = ns.enter(|| panic!("boom"));
        }));
        assert!(caught.is_err());
        assert_eq!(Netns::current().unwrap().id(), host.id());
    }

    #[test]
    fn run_in_switches_only_the_helper_thread() {
        require_root("run_in_switches_only_the_helper_thread");
        let test_ns = TestNetns::new();
        let ns = Netns::open(test_ns.path()).unwrap();
        assert!(ns.is_net_namespace());
        let host = Netns::current().unwrap();
        assert_ne!(ns.id(), host.id(), "a new netns must have a new identity");

        // Inside: the thread's netns is the pod's, and only `lo` exists.
        let (inside_id, ifaces) = ns
            .run_in(|| {
                let id = Netns::current()?.id();
                let names: Vec<String> = nix::net::if_::if_nameindex()?
                    .iter()
                    .map(|i| i.name().to_string_lossy().into_owned())
                    .collect();
                Ok((id, names))
            })
            .unwrap();
        assert_eq!(inside_id, ns.id());
        assert_eq!(ifaces, vec!["lo".to_string()]);

        // The caller never moved.
        assert_eq!(Netns::current().unwrap().id(), host.id());

        // A listener made inside stays inside: reachable from the netns, and the same port
        // on the host's loopback is a different socket space.
        let listener = ns
            .run_in(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        ns.run_in(|| TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map(drop))
            .unwrap();
        let (_accepted, _) = listener.accept().unwrap();
        // The kernel lists the socket (by inode) in the netns' /proc/net/tcp, not the host's.
        let sock_inode = nix::sys::stat::fstat(listener.as_raw_fd()).unwrap().st_ino;
        let listed = |table: String| {
            table
                .lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(9) == Some(&sock_inode.to_string()))
        };
        let inside = ns
            .run_in(|| std::fs::read_to_string("/proc/thread-self/net/tcp"))
            .unwrap();
        let outside = std::fs::read_to_string("/proc/thread-self/net/tcp").unwrap();
        assert!(
            listed(inside),
            "socket {sock_inode} not in the netns tcp table"
        );
        assert!(
            !listed(outside),
            "socket {sock_inode} leaked into the host netns"
        );
    }

    #[test]
    fn run_in_propagates_errors() {
        require_root("run_in_propagates_errors");
        let ns = Netns::current().unwrap();
        let err = ns
            .run_in(|| -> io::Result<()> { Err(io::Error::other("boom")) })
            .unwrap_err();
        assert_eq!(err.to_string(), "boom");
    }
}
