//! The rules and ipsets applied for real, in throwaway network namespaces (root only).

mod common;

use std::net::IpAddr;
use std::process::Command;

use ambit_agent::ipset::{Entry, ProbeSets, RemoveOutcome};
use ambit_agent::iptables::{
    apply_host, apply_inpod, remove_host, remove_inpod, ApplyOutcome, ProbeSetNames,
};
use ambit_agent::rules::{Family, PodRuleOptions};
use common::{require_root, unique, TestNetns};

fn opts(dns_capture: bool) -> PodRuleOptions {
    PodRuleOptions {
        dns_capture,
        ipv6: true,
        bypass_inbound: false,
    }
}

#[test]
fn tools_run_inside_the_pod_netns_and_the_agent_stays_outside() {
    require_root("tools_run_inside_the_pod_netns_and_the_agent_stays_outside");
    let ns = TestNetns::new();
    let pod_ns = ambit_zds::Netns::open(ns.path()).unwrap().id().inode;
    let seen =
        ambit_agent::exec::run(Some(&ns.path()), "readlink", &["/proc/self/ns/net"], None).unwrap();
    assert_eq!(seen.trim(), format!("net:[{pod_ns}]"));
    // The calling thread came back to its own namespace.
    let own = ambit_zds::Netns::current().unwrap().id().inode;
    assert_ne!(own, pod_ns);
    let seen = ambit_agent::exec::run(None, "readlink", &["/proc/self/ns/net"], None).unwrap();
    assert_eq!(seen.trim(), format!("net:[{own}]"));
    // A netns that does not exist is named in the error.
    let err = ambit_agent::exec::run(
        Some(std::path::Path::new("/var/run/netns/ambit-no-such-netns")),
        "true",
        &[],
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("ambit-no-such-netns"), "{err}");
}

#[test]
fn inpod_rules_are_idempotent_replaceable_and_removable() {
    require_root("inpod_rules_are_idempotent_replaceable_and_removable");
    let ns = TestNetns::new();
    let path = ns.path();

    let first = apply_inpod(&path, &opts(true)).unwrap();
    assert_eq!(first.v4, ApplyOutcome::Installed);
    assert_eq!(first.v6, Some(ApplyOutcome::Installed));
    let (v4, v6) = (ns.saved(false), ns.saved(true));

    let second = apply_inpod(&path, &opts(true)).unwrap();
    assert!(second.unchanged(), "{second:?}");
    assert_eq!(ns.saved(false), v4, "second apply changed the v4 rules");
    assert_eq!(ns.saved(true), v6, "second apply changed the v6 rules");

    for expected in [
        "-A PREROUTING -j ISTIO_PRERT",
        "-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
        "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
        "-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006",
        "-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT",
        "-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1",
        "-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053",
    ] {
        assert!(v4.contains(expected), "missing {expected:?} in\n{v4}");
    }
    assert_eq!(
        v4.matches("-j ISTIO_").count(),
        6,
        "one jump per hook:\n{v4}"
    );
    assert!(v6.contains("-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001"), "{v6}");
    assert!(
        v6.contains("-s fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128"),
        "{v6}"
    );

    let rules4 = ns.exec(&["ip", "-4", "rule"]);
    let rules6 = ns.exec(&["ip", "-6", "rule"]);
    assert_eq!(
        rules4.matches("fwmark 0x111/0xfff lookup 100").count(),
        1,
        "{rules4}"
    );
    assert_eq!(
        rules6.matches("fwmark 0x111/0xfff lookup 100").count(),
        1,
        "{rules6}"
    );
    assert!(ns
        .exec(&["ip", "-4", "route", "show", "table", "100"])
        .contains("local default dev lo"));
    assert!(ns
        .exec(&["ip", "-6", "route", "show", "table", "100"])
        .contains("local default dev lo"));

    // DNS capture turned off: swapped in one go, raw chains gone.
    let swapped = apply_inpod(&path, &opts(false)).unwrap();
    assert_eq!(swapped.v4, ApplyOutcome::Replaced);
    let v4_nodns = ns.saved(false);
    assert!(
        !v4_nodns.contains("15053") && !v4_nodns.contains("CT --zone"),
        "{v4_nodns}"
    );
    assert_eq!(v4_nodns.matches("-j ISTIO_").count(), 4, "{v4_nodns}");

    // Residue of another version (an unknown ISTIO_ chain and a duplicated jump) is replaced.
    ns.exec(&["iptables", "-t", "nat", "-N", "ISTIO_OLD"]);
    ns.exec(&["iptables", "-t", "nat", "-A", "OUTPUT", "-j", "ISTIO_OLD"]);
    ns.exec(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-j",
        "ISTIO_OUTPUT",
    ]);
    let repaired = apply_inpod(&path, &opts(false)).unwrap();
    assert_eq!(repaired.v4, ApplyOutcome::Replaced);
    assert_eq!(repaired.v6, Some(ApplyOutcome::Unchanged));
    assert_eq!(ns.saved(false), v4_nodns);

    remove_inpod(&path, &opts(true)).unwrap();
    for v6 in [false, true] {
        let saved = ns.saved(v6);
        assert!(!saved.contains("ISTIO_"), "left behind:\n{saved}");
    }
    assert!(!ns.exec(&["ip", "-4", "rule"]).contains("fwmark"));
    assert!(!ns.exec(&["ip", "-6", "rule"]).contains("fwmark"));
    assert!(ns
        .exec(&["ip", "-4", "route", "show", "table", "100"])
        .trim()
        .is_empty());
    // Removing again is fine.
    remove_inpod(&path, &opts(true)).unwrap();
}

#[test]
fn ipv6_disabled_on_lo_skips_only_the_v6_local_route() {
    require_root("ipv6_disabled_on_lo_skips_only_the_v6_local_route");
    let ns = TestNetns::new();
    ns.exec(&["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1"]);

    let outcome = apply_inpod(&ns.path(), &opts(true)).unwrap();
    assert_eq!(outcome.v6, Some(ApplyOutcome::Installed));
    let rules6 = ns.exec(&["ip", "-6", "rule"]);
    assert!(rules6.contains("fwmark 0x111/0xfff lookup 100"), "{rules6}");
    assert!(ns
        .exec(&["ip", "-6", "route", "show", "table", "100"])
        .trim()
        .is_empty());
    assert!(ns
        .exec(&["ip", "-4", "route", "show", "table", "100"])
        .contains("local default dev lo"));
    // Again: the existing rules are no error.
    assert!(apply_inpod(&ns.path(), &opts(true)).unwrap().unchanged());
}

#[test]
fn apply_errors_name_the_netns() {
    require_root("apply_errors_name_the_netns");
    let err = apply_inpod(
        std::path::Path::new("/var/run/netns/ambit-agent-test-absent"),
        &opts(true),
    )
    .unwrap_err();
    assert!(err.to_string().contains("ambit-agent-test-absent"), "{err}");
}

fn set_names() -> ProbeSetNames {
    // ipset names are limited to 31 characters.
    let u = unique();
    ProbeSetNames {
        v4: format!("ambt-{u}-4"),
        v6: format!("ambt-{u}-6"),
    }
}

/// Destroys the sets on drop (the host netns is shared with everything else).
struct SetGuard(ProbeSets);

impl Drop for SetGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.destroy() {
            eprintln!("cleanup: {e}");
        }
    }
}

#[test]
fn ipset_add_replace_and_uid_checked_remove() {
    require_root("ipset_add_replace_and_uid_checked_remove");
    // In the agent's own (host) netns, under unique names.
    let sets = SetGuard(ProbeSets::new(set_names(), None, true));
    let sets = &sets.0;
    sets.ensure().unwrap();
    sets.ensure().unwrap();

    let a: IpAddr = "10.77.0.5".parse().unwrap();
    let mapped: IpAddr = "::ffff:10.77.0.6".parse().unwrap();
    let b: IpAddr = "fd00:77::6".parse().unwrap();
    sets.add(a, "uid-a").unwrap();
    sets.add(a, "uid-a").unwrap();
    sets.add(mapped, "uid-m").unwrap();
    sets.add(b, "uid-b").unwrap();
    assert_eq!(
        sets.entries(Family::V4).unwrap().len(),
        2,
        "{:?}",
        sets.entries(Family::V4)
    );
    assert!(sets.entries(Family::V4).unwrap().contains(&Entry {
        ip: "10.77.0.6".parse().unwrap(),
        comment: Some("uid-m".into())
    }));
    assert_eq!(
        sets.entries(Family::V6).unwrap(),
        vec![Entry {
            ip: b,
            comment: Some("uid-b".into())
        }]
    );

    // The IP is reused by another pod: the add re-owns it...
    sets.add(a, "uid-new").unwrap();
    // ...so the old pod's late remove keeps it.
    assert_eq!(
        sets.remove(a, "uid-a").unwrap(),
        RemoveOutcome::OtherOwner("uid-new".into())
    );
    assert_eq!(sets.remove(a, "uid-new").unwrap(), RemoveOutcome::Removed);
    assert_eq!(
        sets.remove(a, "uid-new").unwrap(),
        RemoveOutcome::NotPresent
    );
    assert_eq!(sets.remove(b, "uid-b").unwrap(), RemoveOutcome::Removed);

    sets.refill([(a, "uid-1"), (b, "uid-2")]).unwrap();
    assert_eq!(
        sets.entries(Family::V4).unwrap(),
        vec![Entry {
            ip: a,
            comment: Some("uid-1".into())
        }]
    );
    assert_eq!(sets.entries(Family::V6).unwrap().len(), 1);
}

#[test]
fn host_probe_rules_in_a_netns() {
    require_root("host_probe_rules_in_a_netns");
    let ns = TestNetns::new();
    let names = ProbeSetNames::default();
    let sets = ProbeSets::new(names.clone(), Some(ns.path()), true);
    sets.ensure().unwrap();
    let path = ns.path();

    let first = apply_host(Some(&path), true, &names).unwrap();
    assert_eq!(first, vec![ApplyOutcome::Installed; 2]);
    let (v4, v6) = (ns.saved(false), ns.saved(true));
    assert!(v4.contains("-A POSTROUTING -j ISTIO_POSTRT"), "{v4}");
    assert!(
        v4.contains("-A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127")
            || v4.contains("-A ISTIO_POSTRT -m owner --socket-exists -p tcp -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127"),
        "{v4}"
    );
    assert!(v6.contains("--match-set istio-inpod-probes-v6 dst -j SNAT --to-source fd16:9254:7127:1337:ffff:ffff:ffff:ffff"), "{v6}");

    // Someone else's chain in POSTROUTING is left alone.
    ns.exec(&["iptables", "-t", "nat", "-N", "ISTIO_OTHER"]);
    ns.exec(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-j",
        "ISTIO_OTHER",
    ]);
    let second = apply_host(Some(&path), true, &names).unwrap();
    assert_eq!(second, vec![ApplyOutcome::Unchanged; 2]);

    remove_host(Some(&path), true, &names).unwrap();
    let after = ns.saved(false);
    assert!(!after.contains("ISTIO_POSTRT"), "{after}");
    assert!(after.contains("-A POSTROUTING -j ISTIO_OTHER"), "{after}");
    assert!(!ns.saved(true).contains("ISTIO_POSTRT"));
    sets.destroy().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, "ipset", "list", "-n"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).trim().is_empty());
}
