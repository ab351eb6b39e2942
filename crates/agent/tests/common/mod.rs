//! Helpers for the tests that need root: named network namespaces that are deleted even when
//! the test fails, and unique names.
#![allow(dead_code)]

pub mod k8s;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Fails (never skips) a test that needs root.
pub fn require_root(what: &str) {
    if !nix::unistd::Uid::effective().is_root() {
        panic!(
            "test `{what}` needs root (network namespaces, iptables, ipset); \
             run the test suite as root"
        );
    }
}

/// A short unique token: pid, a per-process counter and clock noise.
pub fn unique() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}{:03x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos & 0xfff
    )
}

/// Runs `ip args...`, panicking with its stderr on failure.
pub fn ip(args: &[&str]) -> String {
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
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip netns add ambit-agent-test-<unique>` with `lo` up; deleted on drop.
pub struct TestNetns {
    pub name: String,
}

impl TestNetns {
    pub fn new() -> TestNetns {
        let name = format!("ambit-agent-test-{}", unique());
        ip(&["netns", "add", &name]);
        let ns = TestNetns { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    /// Runs a command inside the netns (`ip netns exec`), returning stdout; panics on failure.
    pub fn exec(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{}` in {} failed: {}",
            args.join(" "),
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `iptables-save`/`ip6tables-save` output without the timestamped comment lines.
    pub fn saved(&self, v6: bool) -> String {
        let text = self.exec(&[if v6 {
            "ip6tables-save"
        } else {
            "iptables-save"
        }]);
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}
