//! Keeps the hand-written seed corpora meaningful: each seed that is meant to be valid still
//! gets past the parser, so the fuzzer starts from deep inside it. Run with `cargo test` in
//! `fuzz/` (a plain build: no sanitizer, no nightly flags).

use std::fs::File;
use std::path::PathBuf;

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
