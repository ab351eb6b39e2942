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

impl TestNetns {
    /// `iptables-save -c`/`ip6tables-save -c` without the comment lines: every rule with
    /// its packet and byte counters. A rule deleted and added again counts from zero.
    pub fn saved_counted(&self, v6: bool) -> String {
        let text = self.exec(&[
            if v6 {
                "ip6tables-save"
            } else {
                "iptables-save"
            },
            "-c",
        ]);
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// A TCP connection attempt from inside the netns to `dst` (nothing need listen): traffic
    /// through the netns's OUTPUT rules, so that their counters move.
    pub fn poke(&self, dst: std::net::SocketAddr) {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let _ = std::net::TcpStream::connect_timeout(&dst, std::time::Duration::from_secs(2));
        })
        .join()
        .unwrap();
    }
}

/// A line of `iptables-save -c` split into its counters (packets, bytes; none for table and
/// COMMIT lines) and the rest (a rule, or a chain with its policy).
fn counted_line(line: &str) -> (Option<(u64, u64)>, String) {
    let parse = |c: &str| {
        let (p, b) = c
            .trim_matches(|ch| ch == '[' || ch == ']')
            .split_once(':')?;
        Some((p.parse().ok()?, b.parse().ok()?))
    };
    if line.starts_with('[') {
        if let Some((c, rest)) = line.split_once(' ') {
            return (parse(c), rest.to_owned());
        }
    }
    if line.starts_with(':') {
        if let Some((rest, c)) = line.rsplit_once(' ') {
            return (parse(c), rest.to_owned());
        }
    }
    (None, line.to_owned())
}

/// The packets counted by the rules of `saved` (from [`TestNetns::saved_counted`]) that
/// contain `rule`.
pub fn packets(saved: &str, rule: &str) -> u64 {
    saved
        .lines()
        .map(counted_line)
        .filter(|(_, r)| r.contains(rule))
        .filter_map(|(c, _)| c.map(|(p, _)| p))
        .sum()
}

/// Asserts that the rules of `before` are still those of `after`, none deleted and added
/// again: the same rules in the same order, and no counter lower than it was.
pub fn assert_rules_kept(before: &str, after: &str, what: &str) {
    let (b, a): (Vec<_>, Vec<_>) = (
        before.lines().map(counted_line).collect(),
        after.lines().map(counted_line).collect(),
    );
    let rules =
        |v: &[(Option<(u64, u64)>, String)]| v.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>();
    assert_eq!(rules(&b), rules(&a), "{what}: the rules changed");
    let reset: Vec<String> = b
        .iter()
        .zip(&a)
        .filter_map(|((cb, rule), (ca, _))| match (cb, ca) {
            (Some((pb, bb)), Some((pa, ba))) if pa < pb || ba < bb => {
                Some(format!("[{pb}:{bb}] -> [{pa}:{ba}] {rule}"))
            }
            _ => None,
        })
        .collect();
    assert!(
        reset.is_empty(),
        "{what}: rules deleted and added again (their counters went back):\n{}",
        reset.join("\n")
    );
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}
