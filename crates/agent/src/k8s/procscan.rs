//! Finding a pod's network namespace without CNI (reference §1.6): walk `<proc>/*/ns/net`,
//! skip the host's netns, read each process's pod UID from its `cgroup` file, keep only
//! netns that really hold one of the pod's IPs (a process merely passing through another
//! pod's netns must not win), and prefer the oldest process.
//!
//! The cgroup and stat parsing is sans IO; the scan takes the proc root and the "does this
//! netns hold one of these IPs" check as a closure, so it is tested with a fake proc tree.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Most bytes read from one `cgroup` or `stat` file (they are a few hundred bytes).
const MAX_PROC_FILE: u64 = 64 * 1024;

/// The pod UID in one `cgroup` file's text, if the process belongs to a pod. Handles the
/// cgroupfs form (`/kubepods/burstable/pod<uuid>/<container>`), the systemd form
/// (`kubepods-burstable-pod<uuid with _>.slice`), CRI-O's (`…-pod<uuid>.slice/crio-<id>.scope`)
/// and static pods, whose UID is a 32-digit hex hash.
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.split('/').find_map(uid_in_component)
    })
}

/// `pod<uid>` at the end of a path component (`pod<uid>`, `…-pod<uid>.slice`).
fn uid_in_component(component: &str) -> Option<String> {
    let c = component.strip_suffix(".slice").unwrap_or(component);
    let at = c.rfind("pod")?;
    if at > 0 && !c[..at].ends_with('-') {
        return None;
    }
    let candidate = &c[at + 3..];
    let uid = candidate.replace('_', "-");
    is_uuid(&uid).then_some(uid).or_else(|| {
        (candidate.len() == 32 && candidate.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| candidate.to_owned())
    })
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The start time (field 22, in clock ticks since boot) of a `/proc/<pid>/stat` text. The
/// command name (field 2) may hold spaces and parentheses, so fields count from the last `)`.
pub fn start_time_from_stat(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    // After `)`: field 3 (state) is the first; field 22 is the 20th.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// A pod's netns, found in `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub pid: u32,
    /// `<proc>/<pid>/ns/net`: valid while the process lives (the agent's record and the ZDS
    /// server open it when needed).
    pub netns: PathBuf,
    start: u64,
}

/// Scans `proc_root` for the netns of the `wanted` pods (UID → IPs). Pods without IPs are
/// not looked for. `holds_ip(netns, ips)` says whether the netns has one of `ips`.
/// Unreadable entries (processes that exit during the scan) are skipped.
pub fn scan(
    proc_root: &Path,
    wanted: &HashMap<String, Vec<IpAddr>>,
    holds_ip: impl Fn(&Path, &[IpAddr]) -> bool,
) -> std::io::Result<HashMap<String, Found>> {
    // The host's netns, skipped without a look. Where pid 1 cannot be inspected (a
    // sandboxed init), nothing is skipped: the IP check keeps the host's netns out anyway.
    let host = std::fs::metadata(proc_root.join("1/ns/net"))
        .ok()
        .map(|m| (m.dev(), m.ino()));
    // Netns already checked to hold a pod's IP, and for which pod.
    let mut verified: HashMap<(u64, u64), String> = HashMap::new();
    let mut found: HashMap<String, Found> = HashMap::new();
    for entry in std::fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let netns = dir.join("ns/net");
        let Ok(meta) = std::fs::metadata(&netns) else {
            continue;
        };
        let id = (meta.dev(), meta.ino());
        if Some(id) == host {
            continue;
        }
        let Some(uid) = read_small(&dir.join("cgroup")).and_then(|t| pod_uid_from_cgroup(&t))
        else {
            continue;
        };
        let Some(ips) = wanted.get(&uid).filter(|ips| !ips.is_empty()) else {
            continue;
        };
        let start = read_small(&dir.join("stat"))
            .and_then(|t| start_time_from_stat(&t))
            .unwrap_or(u64::MAX);
        let older = found.get(&uid).is_none_or(|f| start < f.start);
        // A netns already accepted for this pod needs no second look; a new one must hold
        // the pod's IP.
        if !older || (verified.get(&id) != Some(&uid) && !holds_ip(&netns, ips)) {
            continue;
        }
        verified.insert(id, uid.clone());
        found.insert(uid, Found { pid, netns, start });
    }
    Ok(found)
}

fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_PROC_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Whether the netns at `path` has one of `ips` on an interface (rtnetlink address dump).
pub fn netns_holds_ip(path: &Path, ips: &[IpAddr]) -> bool {
    match crate::netlink::RouteSocket::open(path).and_then(|mut s| s.addresses()) {
        Ok(addrs) => addrs.iter().any(|a| ips.contains(a)),
        Err(e) => {
            tracing::debug!(netns = %path.display(), error = %e, "cannot list the addresses");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60";

    #[test]
    fn cgroup_samples_from_real_nodes() {
        let cases: &[(&str, Option<&str>)] = &[
            // cgroup v2, systemd driver, containerd.
            ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod3b5c8e2d_1d1c_4b2e_9f0a_2b1c3d4e5f60.slice/cri-containerd-8a1f.scope\n", Some(UID)),
            // Guaranteed QoS has no QoS slice.
            ("0::/kubepods.slice/kubepods-pod3b5c8e2d_1d1c_4b2e_9f0a_2b1c3d4e5f60.slice/cri-containerd-8a1f.scope\n", Some(UID)),
            // cgroup v1, cgroupfs driver (kind, minikube).
            ("12:pids:/kubepods/besteffort/pod3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60/9f0e7d\n11:memory:/kubepods/besteffort/pod3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60/9f0e7d\n", Some(UID)),
            // CRI-O.
            ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3b5c8e2d_1d1c_4b2e_9f0a_2b1c3d4e5f60.slice/crio-conmon-5d1e.scope\n", Some(UID)),
            ("0::/kubepods/burstable/pod3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60/crio-5d1e\n", Some(UID)),
            // k3s (cgroupfs under a prefix).
            ("0::/kubepods/burstable/pod3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60/abc\n", Some(UID)),
            // Static pod: the UID is the manifest hash.
            ("0::/kubepods/burstable/pod5f4dcc3b5aa765d61d8327deb882cf99/abc\n", Some("5f4dcc3b5aa765d61d8327deb882cf99")),
            // Not pods.
            ("0::/system.slice/containerd.service\n", None),
            ("0::/user.slice/user-1000.slice/session-2.scope\n", None),
            ("0::/\n", None),
            ("0::/kubepods.slice/kubepods-besteffort.slice\n", None),
            ("0::/system.slice/ipod3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60.service\n", None),
            ("0::/kubepods/pod3b5c8e2d-1d1c-4b2e-9f0a\n", None),
            ("garbage", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(pod_uid_from_cgroup(text).as_deref(), *want, "{text}");
        }
    }

    #[test]
    fn stat_start_time_survives_odd_command_names() {
        let fields: Vec<String> = (3..=30).map(|i| i.to_string()).collect();
        let rest = fields.join(" ");
        assert_eq!(start_time_from_stat(&format!("1 (init) {rest}")), Some(22));
        assert_eq!(
            start_time_from_stat(&format!("77 (a) (b c) {rest}")),
            Some(22)
        );
        assert_eq!(start_time_from_stat("1 (x) S 0"), None);
        assert_eq!(start_time_from_stat("no paren"), None);
    }
}
