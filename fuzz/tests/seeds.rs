//! Keeps the hand-written seed corpora meaningful: each seed that is meant to be valid still
//! gets past the parser, so the fuzzer starts from deep inside it. Run with `cargo test` in
//! `fuzz/` (a plain build: no sanitizer, no nightly flags).

use std::fs::File;
use std::path::PathBuf;

use ambit_agent::ipset::parse_save;
use ambit_agent::rules::{host_probe_rules, inpod_rules, Family, InpodRuleOptions, SavedRules};
use ambit_cni::api::{AgentCallError, AgentRequest, AgentResponse};
use ambit_cni::plugin::{run, Agent, CniEnv};
use ambit_hbone::{parse_authority, Baggage, ConnectRequest, TraceParent};
use ambit_identity::{spiffe_ids_of, SpiffeId};
use ambit_inpod::protocol::{decode_hello, decode_request, decode_response};
use ambit_inpod::Incoming;
use rustls::pki_types::CertificateDer;

fn seed(target: &str, name: &str) -> Vec<u8> {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "corpus", target, name]
        .iter()
        .collect();
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(target: &str, name: &str) -> String {
    String::from_utf8(seed(target, name)).expect("UTF-8 seed")
}

#[test]
fn hbone_seeds() {
    for name in ["authority_ipv4", "authority_ipv6", "authority_host"] {
        let a = parse_authority(&text("hbone_headers", name)).expect(name);
        ConnectRequest::new(a).to_http().expect(name);
    }
    let b = text("hbone_headers", "baggage_two_lines");
    let b = Baggage::parse(b.split('\n'));
    assert_eq!(b.workload_name.as_deref(), Some("ratings-v1"));
    assert_eq!(b.zone.as_deref(), Some("eu-west1-c"));
    assert!(TraceParent::parse(&text("hbone_headers", "traceparent")).is_ok());
    assert_eq!(
        ambit_hbone::forwarded_host(&text("hbone_headers", "forwarded")).as_deref(),
        Some("ratings.bookinfo.svc.cluster.local")
    );
}

#[test]
fn zds_seeds() {
    let devnull = || -> std::os::fd::OwnedFd { File::open("/dev/null").unwrap().into() };
    let add = seed("zds_request", "add_workload_1fd");
    match decode_request(&add[1..], vec![devnull()]) {
        Ok(Incoming::Add { uid, info, .. }) => {
            assert_eq!(uid, "6f3a1e2c-9d4b-4c1a-8e7f-0a1b2c3d4e5f");
            assert_eq!(info.namespace, "bookinfo");
        }
        other => panic!("{other:?}"),
    }
    for (name, kind) in [
        ("keep_workload", "KeepWorkload"),
        ("del_workload", "DelWorkload"),
        ("snapshot_sent", "SnapshotSent"),
    ] {
        let b = seed("zds_request", name);
        assert_eq!(
            decode_request(&b[1..], Vec::new()).expect(name).kind(),
            kind
        );
    }
    assert_eq!(
        decode_response(&seed("zds_request", "ack")[1..]).unwrap(),
        Ok(())
    );
    assert!(decode_response(&seed("zds_request", "nack")[1..])
        .unwrap()
        .is_err());
    assert_eq!(
        decode_hello(&seed("zds_request", "hello_v1")[1..])
            .unwrap()
            .version,
        1
    );
}

#[test]
fn local_config_seeds() {
    for name in [
        "bookinfo.yaml",
        "minimal.yaml",
        "empty.yaml",
        "services_only.yaml",
    ] {
        let cfg = ambit_state::parse_local_config(name, &text("local_config", name))
            .unwrap_or_else(|e| panic!("{e}"));
        ambit_state::ProxyState::from_config(cfg).unwrap();
    }
}

struct OkAgent;
impl Agent for OkAgent {
    fn call(&self, _: &AgentRequest) -> Result<AgentResponse, AgentCallError> {
        Ok(AgentResponse::ok())
    }
}

#[test]
fn cni_seeds() {
    let env = |command: &str| CniEnv {
        command: command.into(),
        container_id: "abc123".into(),
        netns: "/var/run/netns/cni-1234".into(),
        ifname: "eth0".into(),
        args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0".into(),
        path: "/opt/cni/bin".into(),
    };
    for (name, command) in [
        ("add_ok", "ADD"),
        ("add_legacy_0.3.1", "ADD"),
        ("check_ok", "CHECK"),
        ("del", "DEL"),
        ("version", "VERSION"),
    ] {
        let b = seed("cni_plugin", name);
        let out = run(&env(command), &b[1..], &OkAgent);
        assert_eq!(out.exit_code, 0, "{name}: {}", out.stdout);
    }
    for name in ["agent_request_add", "agent_request_remove"] {
        let b = seed("cni_plugin", name);
        ambit_cni::api::parse_request(&b[1..]).expect(name);
    }
}

#[test]
fn identity_seeds() {
    let id = SpiffeId::parse(&text("spiffe_id", "bookinfo")).unwrap();
    assert_eq!(id.service_account(), "bookinfo-productpage");
    assert!(SpiffeId::parse(&text("spiffe_id", "escapes")).is_ok());
    let der = seed("x509_cert", "spiffe_leaf.der");
    assert_eq!(
        spiffe_ids_of(&CertificateDer::from(der.as_slice())),
        [SpiffeId::parse("spiffe://cluster.local/ns/bookinfo/sa/bookinfo-ratings").unwrap()]
    );
}

#[test]
fn iptables_save_seeds() {
    let dns = InpodRuleOptions::default();
    let ingress = InpodRuleOptions {
        dns_capture: false,
        bypass_inbound: true,
        ..dns
    };
    // Real `iptables-save` output after our in-pod and host rules were installed in one
    // netns (and a comment that quotes a jump): the host set is in sync, but in a pod every
    // `ISTIO_` chain is ours, so the host chain counts as drift there.
    let v4 = SavedRules::parse(&text("iptables_save", "inpod_v4_dns_host"));
    let host = host_probe_rules(Family::V4, "istio-inpod-probes-v4").compare(&v4);
    assert!(host.residue && host.structure_matches, "{host:?}");
    let c = inpod_rules(Family::V4, &dns).compare(&v4);
    assert!(c.residue && !c.structure_matches, "{c:?}");
    let without_host = v4.owned_objects(|_, c| c.starts_with("ISTIO_") && c != "ISTIO_POSTRT");
    assert!(
        !without_host.iter().any(|o| o.contains("FAKE")),
        "{without_host:?}"
    );
    let v6 = SavedRules::parse(&text("iptables_save", "inpod_v6_dns"));
    assert!(inpod_rules(Family::V6, &dns).compare(&v6).structure_matches);
    // Another version's residue: ours, and drifted.
    let old = SavedRules::parse(&text("iptables_save", "ingress_with_residue"));
    let c = inpod_rules(Family::V4, &ingress).compare(&old);
    assert!(c.residue && !c.structure_matches, "{c:?}");
    assert!(old.owned_objects(|_, c| c.starts_with("ISTIO_")).len() >= 6);
    // A clean netns: nothing of ours.
    let clean = SavedRules::parse(&text("iptables_save", "clean_nat"));
    assert_eq!(clean.table("nat").map(|t| t.chains.len()), Some(4));
    assert!(!inpod_rules(Family::V4, &dns).compare(&clean).residue);
}

#[test]
fn ipset_save_seeds() {
    let v4 = "istio-inpod-probes-v4";
    let entries = parse_save(&text("ipset_save", "probes_v4_save")[1..], v4);
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0].comment.as_deref(),
        Some("6f3a1e2c-9d4b-4c1a-8e7f-0a1b2c3d4e5f")
    );
    let v6 = parse_save(
        &text("ipset_save", "all_sets_save_v6")[1..],
        "istio-inpod-probes-v6",
    );
    assert_eq!(v6.len(), 1);
    // `ipset list` prints members without `add <set>`: nothing is read from it.
    assert!(parse_save(&text("ipset_save", "all_sets_list")[1..], v4).is_empty());
    let odd = parse_save(&text("ipset_save", "escapes")[1..], "s");
    assert_eq!(odd.len(), 3);
    assert_eq!(odd[0].comment.as_deref(), Some(r#"uid "quoted" \ x"#));
    assert_eq!(odd[2].comment.as_deref(), Some(""));
}

/// Edge cases worth keeping whatever the fuzzer does: none may panic.
#[test]
fn edge_cases_do_not_panic() {
    // A scoped IPv6 authority parses; `to_http` may refuse it but must not panic.
    if let Ok(a) = parse_authority("[fe80::1%2]:80") {
        let _ = ConnectRequest::new(a).to_http();
    }
    let _ = parse_authority(&"9".repeat(300));
    let _ = TraceParent::parse(&"é".repeat(30));
    let _ = ambit_hbone::forwarded_host(&format!("host=\"{}", "\\".repeat(9000)));
    let _ = SpiffeId::parse("spiffe://a/ns/%/sa/%4");
}

#[path = "../fuzz_targets/drivers/hbone_server.rs"]
mod hbone_server;

#[test]
fn hbone_server_seeds() {
    // A CONNECT in frames reaches the handler, validated; the client then never answers
    // the server's PINGs, which ends the connection.
    let connect = hbone_server::drive(&seed("hbone_server", "h2_connect"));
    assert_eq!(
        connect.connects,
        [("10.0.0.2:8080".to_string(), true)],
        "{:?}",
        connect.ended
    );
    assert!(
        matches!(&connect.ended, Some(Err(e)) if e.contains("PING")),
        "{:?}",
        connect.ended
    );
    // Another method reaches the handler too, and is refused there.
    let get = hbone_server::drive(&seed("hbone_server", "h2_not_connect"));
    assert_eq!(get.connects, [("10.0.0.2:8080".to_string(), false)]);
    // Streams opened and reset at once: h2's rapid-reset guard ends the connection with
    // an error (ENHANCE_YOUR_CALM), not a panic or a hang.
    let rapid = hbone_server::drive(&seed("hbone_server", "h2_rapid_reset"));
    assert!(matches!(rapid.ended, Some(Err(_))), "{:?}", rapid.ended);
    let control = hbone_server::drive(&seed("hbone_server", "h2_ping_window_goaway"));
    assert!(control.connects.is_empty() && control.ended.is_some());
    // Before TLS nothing is a request.
    for name in ["tls_truncated_hello", "tls_plaintext_http"] {
        let tls = hbone_server::drive(&seed("hbone_server", name));
        assert!(tls.connects.is_empty(), "{name}");
        assert!(matches!(tls.ended, Some(Err(_))), "{name}: {:?}", tls.ended);
    }
}

/// Seeds of `x509_cert` as SVIDs: the plain leaf has its one id; the multi-SAN one (a SPIFFE
/// and an https URI) too, since only `spiffe:` URIs count.
#[test]
fn svid_seeds() {
    let der = seed("x509_cert", "spiffe_leaf.der");
    assert_eq!(
        ambit_identity::svid_identity(&CertificateDer::from(der.as_slice())).unwrap(),
        SpiffeId::parse("spiffe://cluster.local/ns/bookinfo/sa/bookinfo-ratings").unwrap()
    );
    let der = seed("x509_cert", "multi_san.der");
    let ids = spiffe_ids_of(&CertificateDer::from(der.as_slice()));
    assert_eq!(
        ambit_identity::svid_identity(&CertificateDer::from(der.as_slice())).ok(),
        ids.first().cloned()
    );
}

/// Seeds of `ca_dir`: the two good directories load and sign; the two bad ones are refused
/// for the reason their names give.
#[test]
fn ca_dir_seeds() {
    use ambit_identity::{CaError, CertificateAuthority, PluginCaPem};
    let load = |name: &str| {
        let data = seed("ca_dir", name);
        let parts: Vec<&[u8]> = data.split(|b| *b == 0).collect();
        assert_eq!(parts.len(), 4, "{name}");
        let files = PluginCaPem {
            ca_cert: parts[0],
            ca_key: parts[1],
            root_cert: parts[2],
            cert_chain: parts[3],
        };
        CertificateAuthority::from_plugin_pem(std::path::Path::new("ca"), files)
    };
    let id = SpiffeId::new("cluster.local", "fuzz", "fuzz").unwrap();
    for name in ["root_only", "intermediate_sec1"] {
        let ca = load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let leaf = ca.issue(&id, std::time::Duration::from_secs(60)).unwrap();
        assert_eq!(
            ambit_identity::peer_identity(Some(&leaf.chain)),
            Some(id.clone())
        );
    }
    assert!(matches!(
        load("key_mismatch"),
        Err(CaError::KeyMismatch { .. })
    ));
    assert!(matches!(
        load("chain_without_ca_cert"),
        Err(CaError::ChainStart { .. })
    ));
}

#[path = "../fuzz_targets/zds_sequences.rs"]
mod zds_sequences;

/// Every seed of a target, by name (a new seed file is replayed without editing this test).
fn seeds_of(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "corpus", target]
        .iter()
        .collect();
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

#[test]
fn zds_proxy_states_seeds() {
    use zds_sequences::ProxyStats;
    for (name, bytes) in seeds_of("zds_proxy_states") {
        let stats = zds_sequences::proxy(&bytes);
        let expected = match name.as_str() {
            "snapshot_reconcile" => Some(ProxyStats {
                starts: 4,
                stops: 1,
                failed_starts: 0,
                snapshots: 2,
                fatal_errors: 0,
                ready: true,
            }),
            "replaced_netns_then_delete" => Some(ProxyStats {
                starts: 2,
                stops: 2,
                failed_starts: 0,
                snapshots: 1,
                fatal_errors: 0,
                ready: true,
            }),
            "pending_retry" => Some(ProxyStats {
                starts: 3,
                stops: 0,
                failed_starts: 2,
                snapshots: 1,
                fatal_errors: 0,
                ready: true,
            }),
            "protocol_errors" => Some(ProxyStats {
                snapshots: 1,
                fatal_errors: 2,
                ready: true,
                ..ProxyStats::default()
            }),
            "delete_before_snapshot" => Some(ProxyStats {
                starts: 1,
                stops: 1,
                failed_starts: 0,
                snapshots: 2,
                fatal_errors: 0,
                ready: true,
            }),
            // The AddWorkload and SnapshotSent seeds of `zds_request`, decoded on the way.
            "raw_datagrams" => Some(ProxyStats {
                starts: 1,
                snapshots: 1,
                ready: true,
                ..ProxyStats::default()
            }),
            _ => None,
        };
        if let Some(expected) = expected {
            assert_eq!(stats, expected, "seed {name}");
        }
    }
}

#[test]
fn zds_agent_session_seeds() {
    use zds_sequences::AgentStats;
    for (name, bytes) in seeds_of("zds_agent_session") {
        let stats = zds_sequences::agent(&bytes);
        let expected = match name.as_str() {
            "snapshot_then_requests" => Some(AgentStats {
                sent: 6,
                acked: 2,
                snapshots: 1,
                ..AgentStats::default()
            }),
            "ack_timeout_late_ack" => Some(AgentStats {
                sent: 3,
                acked: 1,
                timed_out: 1,
                late_acks: 1,
                snapshots: 1,
                ..AgentStats::default()
            }),
            "stopped_acking" => Some(AgentStats {
                sent: 5,
                timed_out: 4,
                snapshots: 1,
                closed_early: true,
                ..AgentStats::default()
            }),
            "no_hello" | "unsolicited_before_snapshot" => Some(AgentStats {
                closed_early: true,
                ..AgentStats::default()
            }),
            "malformed_answer" => Some(AgentStats {
                sent: 1,
                closed_early: true,
                ..AgentStats::default()
            }),
            "peer_closed_mid_request" => Some(AgentStats {
                sent: 1,
                closed_early: true,
                ..AgentStats::default()
            }),
            _ => None,
        };
        if let Some(expected) = expected {
            assert_eq!(stats, expected, "seed {name}");
        }
    }
}

#[test]
fn csr_request_seeds() {
    let (id, _) =
        ambit_identity::requested_identity(&text("csr_request", "valid_p256")).expect("valid_p256");
    assert_eq!(id.to_string(), "spiffe://cluster.local/ns/default/sa/web");
    assert!(matches!(
        ambit_identity::requested_identity(&text("csr_request", "two_sans")),
        Err(ambit_identity::CsrError::SanCount { found: 2 })
    ));
}

#[test]
fn socks5_seeds_are_whole_connects() {
    use ambit_proxy::socks5::wire::{parse_greeting, parse_request, Parsed, Target};
    for name in ["connect_ipv4", "connect_ipv6", "connect_name"] {
        let data = seed("socks5_request", name);
        let Ok(Parsed::Done((), used)) = parse_greeting(&data) else {
            panic!("{name}: the greeting does not parse");
        };
        match parse_request(&data[used..]) {
            Ok(Parsed::Done(target, len)) => {
                assert_eq!(used + len, data.len(), "{name}: trailing bytes");
                if name == "connect_name" {
                    assert!(matches!(target, Target::Name { port: 80, .. }), "{name}");
                }
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// Every DNS seed gets a reply (none is cut short before the decision), and keeps the
/// target's invariants.
#[test]
fn dns_query_seeds() {
    for (name, bytes) in seeds_of("dns_query") {
        ambit_dns::fuzzing::query_path(&bytes);
        let query = &bytes[1..];
        let reply = ambit_dns::handle_locally(
            &ambit_state::ProxyState::new(),
            None,
            &ambit_dns::Settings::default(),
            query,
            ambit_dns::Protocol::Tcp,
        );
        assert!(reply.is_some(), "{name}: answered");
    }
}

#[test]
fn cmdadd_request_seeds_parse() {
    for (name, pod, ips) in [("one_ipv4", "web-0", 1), ("dual_stack", "db", 2)] {
        let req = ambit_cni::istio_api::parse(&seed("cmdadd_request", name)).expect(name);
        assert_eq!(
            (req.pod_name.as_str(), req.addresses().len()),
            (pod, ips),
            "{name}"
        );
    }
}

#[test]
fn pod_cgroup_seeds_name_the_pod() {
    for name in ["cgroupfs", "systemd", "crio"] {
        assert_eq!(
            ambit_agent::k8s::procscan::pod_uid_from_cgroup(&text("pod_cgroup", name)).as_deref(),
            Some("3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60"),
            "{name}"
        );
    }
}

#[test]
fn cni_conflist_seeds_are_valid_primaries() {
    use ambit_agent::install::conflist::validate;
    for (name, file) in [
        ("bridge_conflist", "10-net.conflist"),
        ("single_conf", "10-net.conf"),
    ] {
        let data = seed("cni_conflist", name);
        validate(file, &data[1..]).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The xDS seeds of refusals: the 5,000-match policy (the audit's 2,000,000-match case,
/// small) and the body named for another service are NACKed with their reasons, the good
/// resource beside each is applied; every `xds_resource` seed runs through its target.
#[test]
fn xds_seeds_refuse_what_they_should() {
    use ambit_xds::{DeltaClient, Limit, NodeConfig, Rejection, ShapeError};
    let handle = |name: &str| {
        let data = seed("xds_delta", name);
        ambit_xds::fuzzing::delta_response(&data);
        DeltaClient::new(NodeConfig::default().to_node())
            .handle_bytes(&data[1..])
            .expect(name)
    };
    let h = handle("authorization_many_matches");
    assert_eq!(
        h.rejected,
        vec![(
            "bookinfo/many".to_string(),
            Rejection::Shape(ShapeError::TooMany {
                field: "rules[0].clauses[0].matches".into(),
                limit: Limit::MatchesPerRule
            })
        )]
    );
    assert_eq!(h.batch.ops.len(), 1);
    let h = handle("address_misnamed");
    assert!(
        matches!(&h.rejected[..], [(n, Rejection::NameMismatch { .. })] if n == "bookinfo/announced.bookinfo.svc.cluster.local"),
        "{:?}",
        h.rejected
    );
    assert_eq!(h.batch.ops.len(), 1);
    for name in [
        "policy",
        "policy_many_matches",
        "workload",
        "service",
        "workload_twice",
        "service_misnamed",
    ] {
        ambit_xds::fuzzing::resource_body(&seed("xds_resource", name));
    }
    let many = seed("xds_resource", "policy_many_matches");
    assert!(matches!(
        ambit_xds::shape::check_authorization(&many[1..]),
        Err(ShapeError::TooMany {
            limit: Limit::MatchesPerRule,
            ..
        })
    ));
}
