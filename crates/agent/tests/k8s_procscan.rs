//! The `/proc` netns scan against a fake proc tree whose `ns/net` entries point at real
//! network namespaces, with the real "netns holds the IP" check (rtnetlink). Needs root.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::symlink;
use std::path::Path;

use ambit_agent::k8s::procscan::{netns_holds_ip, scan};
use common::{ip, require_root, TestNetns};

fn proc_entry(root: &Path, pid: u32, netns: &Path, cgroup: &str, start: u64) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    symlink(netns, dir.join("ns/net")).unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    let fields: Vec<String> = (4..=30)
        .map(|i| {
            if i == 22 {
                start.to_string()
            } else {
                "0".into()
            }
        })
        .collect();
    std::fs::write(
        dir.join("stat"),
        format!("{pid} (pause) S {}\n", fields.join(" ")),
    )
    .unwrap();
}

#[test]
fn the_scan_finds_each_pods_netns_by_cgroup_and_ip_and_prefers_the_oldest_process() {
    require_root("the_scan_finds_each_pods_netns_by_cgroup_and_ip_and_prefers_the_oldest_process");
    let (a, b, foreign) = (TestNetns::new(), TestNetns::new(), TestNetns::new());
    ip(&["-n", &a.name, "addr", "add", "10.77.0.1/32", "dev", "lo"]);
    ip(&["-n", &b.name, "addr", "add", "fd77::2/128", "dev", "lo"]);
    ip(&[
        "-n",
        &foreign.name,
        "addr",
        "add",
        "10.77.0.9/32",
        "dev",
        "lo",
    ]);
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let uid_a = "11111111-2222-3333-4444-555555555555";
    let uid_b = "66666666-7777-8888-9999-000000000000";
    let uid_c = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
    let systemd = |uid: &str| {
        format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-1.scope\n", uid.replace('-', "_"))
    };
    let cgroupfs = |uid: &str| format!("0::/kubepods/burstable/pod{uid}/abc\n");
    // pid 1 is the host: its netns is never a pod's, whatever its cgroup says.
    proc_entry(r, 1, Path::new("/proc/self/ns/net"), &systemd(uid_a), 1);
    proc_entry(r, 40, &a.path(), &systemd(uid_a), 500);
    proc_entry(r, 30, &a.path(), &cgroupfs(uid_a), 300);
    // A process of pod A that sits in a foreign netns (no pod-A IP there): refused.
    proc_entry(r, 20, &foreign.path(), &systemd(uid_a), 100);
    proc_entry(r, 50, &b.path(), &cgroupfs(uid_b), 700);
    // Pod C has no IP yet: deferred.
    proc_entry(r, 60, &foreign.path(), &cgroupfs(uid_c), 50);
    // Not a pod, and not a pid.
    proc_entry(r, 70, &a.path(), "0::/system.slice/containerd.service\n", 1);
    std::fs::create_dir_all(r.join("self")).unwrap();

    let v4: IpAddr = "10.77.0.1".parse().unwrap();
    let v6: IpAddr = "fd77::2".parse().unwrap();
    let wanted = HashMap::from([
        (uid_a.to_owned(), vec![v4]),
        (uid_b.to_owned(), vec!["10.77.0.200".parse().unwrap(), v6]),
        (uid_c.to_owned(), vec![]),
    ]);
    let found = scan(r, &wanted, netns_holds_ip).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        found[uid_a].pid, 30,
        "the oldest process in the right netns"
    );
    assert_eq!(found[uid_a].netns, r.join("30/ns/net"));
    assert_eq!(found[uid_b].pid, 50);
    assert!(netns_holds_ip(&found[uid_b].netns, &[v6]));
    assert!(!netns_holds_ip(&foreign.path(), &[v4]));
}
