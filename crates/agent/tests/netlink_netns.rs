//! The return-path routing over rtnetlink, in throwaway network namespaces (root only): read
//! back over netlink and through `ip`, removed, idempotent, and interchangeable with what
//! `ip` (and so Istio's agent) installs.

mod common;

use ambit_agent::iptables::{apply_inpod, remove_inpod};
use ambit_agent::netlink::{Added, Deleted, RouteSocket};
use ambit_agent::rules::{Family, PodRuleOptions, ReturnRouting};
use common::{require_root, TestNetns};
use nix::errno::Errno;

fn opts() -> PodRuleOptions {
    PodRuleOptions::default()
}

/// Our rule and route for `family`, as the kernel lists them: (rules, routes).
fn ours(sock: &mut RouteSocket, family: Family) -> (usize, usize) {
    let plan = ReturnRouting::new(family);
    let lo = sock.loopback_index();
    let rules = sock.rules(family).unwrap();
    let routes = sock.routes(family, plan.table).unwrap();
    (
        rules.iter().filter(|r| r.is(&plan)).count(),
        routes.iter().filter(|r| r.is(&plan, lo)).count(),
    )
}

#[test]
fn inpod_routing_round_trip_over_netlink() {
    require_root("inpod_routing_round_trip_over_netlink");
    let ns = TestNetns::new();
    let path = ns.path();
    let mut sock = RouteSocket::open(&path).unwrap();
    for family in Family::ALL {
        assert_eq!(ours(&mut sock, family), (0, 0), "{family}: fresh netns");
    }

    apply_inpod(&path, &opts()).unwrap();
    for family in Family::ALL {
        assert_eq!(ours(&mut sock, family), (1, 1), "{family}: after install");
    }
    // `ip` shows exactly what it shows for the same rule and route made with `ip` (as
    // Istio's agent makes them).
    let reference = TestNetns::new();
    for (flag, any) in [("-4", "0.0.0.0/0"), ("-6", "::/0")] {
        reference.exec(&[
            "ip",
            flag,
            "rule",
            "add",
            "fwmark",
            "0x111/0xfff",
            "pref",
            "32764",
            "lookup",
            "100",
        ]);
        reference.exec(&[
            "ip", flag, "route", "replace", "local", any, "dev", "lo", "table", "100",
        ]);
    }
    for flag in ["-4", "-6"] {
        let rules = ns.exec(&["ip", flag, "rule", "show"]);
        assert!(
            rules.contains("32764:\tfrom all fwmark 0x111/0xfff lookup 100"),
            "{flag}: {rules}"
        );
        assert_eq!(
            rules,
            reference.exec(&["ip", flag, "rule", "show"]),
            "{flag}"
        );
        let show = ["ip", flag, "route", "show", "table", "100"];
        let routes = ns.exec(&show);
        assert!(
            routes.starts_with("local default dev lo "),
            "{flag}: {routes}"
        );
        assert_eq!(routes, reference.exec(&show), "{flag}");
    }

    // A second install changes nothing, and duplicates nothing.
    assert!(apply_inpod(&path, &opts()).unwrap().unchanged());
    for family in Family::ALL {
        assert_eq!(ours(&mut sock, family), (1, 1), "{family}: after reinstall");
        let all = sock.rules(family).unwrap();
        assert_eq!(all.iter().filter(|r| r.priority == 32764).count(), 1);
    }

    remove_inpod(&path, &opts()).unwrap();
    for family in Family::ALL {
        assert_eq!(ours(&mut sock, family), (0, 0), "{family}: after removal");
    }
    for flag in ["-4", "-6"] {
        assert!(!ns.exec(&["ip", flag, "rule", "show"]).contains("fwmark"));
        assert!(ns
            .exec(&["ip", flag, "route", "show", "table", "100"])
            .trim()
            .is_empty());
    }
    // Already gone is no error.
    remove_inpod(&path, &opts()).unwrap();
}

#[test]
fn netlink_answers_are_told_apart_by_errno() {
    require_root("netlink_answers_are_told_apart_by_errno");
    let ns = TestNetns::new();
    let mut sock = RouteSocket::open(&ns.path()).unwrap();
    let plan = ReturnRouting::new(Family::V4);

    assert_eq!(sock.del_rule(&plan).unwrap(), Deleted::Absent);
    assert_eq!(sock.del_route(&plan).unwrap(), Deleted::Absent);
    assert_eq!(sock.add_rule(&plan).unwrap(), Added::Created);
    assert_eq!(sock.add_rule(&plan).unwrap(), Added::Existed);
    sock.replace_route(&plan).unwrap();
    sock.replace_route(&plan).unwrap();
    assert_eq!(ours(&mut sock, Family::V4), (1, 1));

    // What `ip` installs (Istio's agent does the same) is the same rule and route to the
    // kernel: a pod enrolled by either agent can be taken over by the other.
    let ip_rule = [
        "ip",
        "-4",
        "rule",
        "add",
        "fwmark",
        "0x111/0xfff",
        "pref",
        "32764",
        "lookup",
        "100",
    ];
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(ip_rule)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("File exists"),
        "ip added a second rule: {out:?}"
    );
    assert_eq!(sock.del_rule(&plan).unwrap(), Deleted::Removed);
    assert_eq!(sock.del_route(&plan).unwrap(), Deleted::Removed);
    ns.exec(&ip_rule);
    ns.exec(&[
        "ip",
        "-4",
        "route",
        "add",
        "local",
        "0.0.0.0/0",
        "dev",
        "lo",
        "table",
        "100",
    ]);
    assert_eq!(sock.add_rule(&plan).unwrap(), Added::Existed);
    assert_eq!(ours(&mut sock, Family::V4), (1, 1));
    assert_eq!(sock.del_rule(&plan).unwrap(), Deleted::Removed);
    assert_eq!(sock.del_route(&plan).unwrap(), Deleted::Removed);
    assert_eq!(ours(&mut sock, Family::V4), (0, 0));

    // Any other refusal is an error carrying the errno, the kernel's reason and the netns.
    ns.exec(&["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1"]);
    let err = sock
        .replace_route(&ReturnRouting::new(Family::V6))
        .unwrap_err();
    assert_eq!(err.errno(), Some(Errno::EACCES), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&ns.name) && msg.contains("local ::/0 dev lo table 100"),
        "{msg}"
    );
    assert!(
        msg.contains("IPv6 is disabled"),
        "the kernel's own reason: {msg}"
    );
    ns.exec(&["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=0"]);

    // The socket stays in the pod's netns whichever thread uses it.
    let plan6 = ReturnRouting::new(Family::V6);
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(sock.add_rule(&plan6).unwrap(), Added::Created));
    });
    assert!(ns
        .exec(&["ip", "-6", "rule"])
        .contains("fwmark 0x111/0xfff lookup 100"));
    let host_rules = std::process::Command::new("ip")
        .args(["-6", "rule"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&host_rules.stdout).contains("fwmark 0x111/0xfff lookup 100"));
}

#[test]
fn opening_a_missing_netns_names_it() {
    require_root("opening_a_missing_netns_names_it");
    let err = RouteSocket::open(std::path::Path::new("/var/run/netns/ambit-netlink-absent"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("ambit-netlink-absent"), "{err}");
}
