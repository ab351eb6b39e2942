//! Replays every seed of every target through the target's own body (`ambit_fuzz::*`), so
//! the invariants each target asserts run
//! here too, and checks each seed's outcome against the one named for it: every seed file
//! has an expectation and every expectation a seed file, so a new seed cannot go unchecked.
//! Run with `cargo test` in `fuzz/` (a plain build: no sanitizer, no nightly flags).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::PathBuf;

use ambit_agent::ipset::Entry;
use ambit_agent::rules::{host_probe_rules, pod_rules, Family, PodRuleOptions, SavedRules};
use ambit_fuzz::zds_sequences::{AgentStats, ProxyStats};
use ambit_fuzz::*;
use ambit_hbone::{parse_authority, Baggage, ConnectRequest, TraceParent};
use ambit_identity::SpiffeId;

/// Every seed of a target, by file name.
fn seeds_of(target: &str) -> BTreeMap<String, Vec<u8>> {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "corpus", target]
        .iter()
        .collect();
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    seeds_of(target)
        .remove(name)
        .unwrap_or_else(|| panic!("no seed {target}/{name}"))
}

/// A check of one seed's outcome (it panics when the outcome is not the one expected).
type Check<'a, O> = (&'a str, Box<dyn Fn(&O)>);

/// Runs `body` on every seed of `target` and hands each outcome to the check named for that
/// seed; the checks must name exactly the seed files.
fn replay_checked<O: Debug>(target: &str, body: impl Fn(&[u8]) -> O, checks: Vec<Check<'_, O>>) {
    let seeds = seeds_of(target);
    let named: Vec<&str> = checks.iter().map(|(n, _)| *n).collect();
    let files: Vec<&str> = seeds.keys().map(String::as_str).collect();
    let unnamed: Vec<&&str> = files.iter().filter(|f| !named.contains(f)).collect();
    let missing: Vec<&&str> = named.iter().filter(|n| !files.contains(n)).collect();
    assert!(
        unnamed.is_empty() && missing.is_empty(),
        "{target}: seeds without an expectation {unnamed:?}, expectations without a seed {missing:?}"
    );
    for (name, check) in checks {
        let outcome = body(&seeds[name]);
        eprintln!("{target}/{name}: {outcome:?}");
        check(&outcome);
    }
}

/// [`replay_checked`] with each seed's expected outcome.
fn replay<O: Debug + PartialEq + 'static>(
    target: &str,
    body: impl Fn(&[u8]) -> O,
    expected: Vec<(&str, O)>,
) {
    let checks = expected
        .into_iter()
        .map(|(name, want)| {
            let label = format!("{target}/{name}");
            let check: Box<dyn Fn(&O)> = Box::new(move |got: &O| assert_eq!(got, &want, "{label}"));
            (name, check)
        })
        .collect();
    replay_checked(target, body, checks);
}

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

/// Every fuzz target (a `[[bin]]` of Cargo.toml, and a file in fuzz_targets/: the same
/// set) has seeds in corpus/<target> and a `#[test] fn <target>_seeds` here that replays
/// them, so that no target's seeds go unrun.
#[test]
fn every_target_has_its_seeds_replayed() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let bins = manifest_bins(&manifest);
    let files: BTreeSet<String> = std::fs::read_dir(root.join("fuzz_targets"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    let named: BTreeSet<String> = bins.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(named, files, "[[bin]] targets and fuzz_targets/*.rs differ");
    for (name, path) in &bins {
        assert_eq!(*path, format!("fuzz_targets/{name}.rs"), "[[bin]] {name}");
    }
    let source = include_str!("seeds.rs");
    let mut missing = Vec::new();
    for name in &files {
        let corpus = root.join("corpus").join(name);
        let seeds = std::fs::read_dir(&corpus).map_or(0, |d| d.count());
        if seeds == 0 {
            missing.push(format!("{name}: no seeds in {}", corpus.display()));
        }
        match test_body(source, &format!("{name}_seeds")) {
            Some(body) if body.contains(&format!("\"{name}\"")) => {}
            Some(_) => missing.push(format!("{name}: {name}_seeds does not replay {name}")),
            None => missing.push(format!(
                "{name}: no #[test] fn {name}_seeds in tests/seeds.rs"
            )),
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

/// The `[[bin]]` sections of a manifest: each one's `name` and `path`.
fn manifest_bins(manifest: &str) -> Vec<(String, String)> {
    let value = |section: &str, key: &str| {
        section.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
        })
    };
    manifest
        .split("\n[[bin]]\n")
        .skip(1)
        .map(|rest| {
            // Up to the next section.
            let section = rest.split("\n[").next().unwrap_or_default();
            let name = value(section, "name").expect("a [[bin]] without a name");
            let path = value(section, "path").unwrap_or_default();
            (name, path)
        })
        .collect()
}

/// The body of `#[test] fn <name>()` in `source`, up to its closing brace (at the start of
/// a line, as rustfmt leaves it).
fn test_body<'s>(source: &'s str, name: &str) -> Option<&'s str> {
    let head = format!("#[test]\nfn {name}() {{\n");
    let start = source.find(&head)? + head.len();
    let len = source[start..].find("\n}\n")?;
    Some(&source[start..start + len])
}

#[test]
fn the_target_check_reads_manifests_and_tests() {
    let manifest = "[lib]\nname = \"x\"\n\n[[bin]]\nname = \"a\"\npath = \"fuzz_targets/a.rs\"\ntest = false\n\n[[bin]]\nname = \"b\"\npath = \"fuzz_targets/b.rs\"\n\n[profile.dev]\nname = \"no\"\n";
    assert_eq!(
        manifest_bins(manifest),
        [
            ("a".to_string(), "fuzz_targets/a.rs".to_string()),
            ("b".to_string(), "fuzz_targets/b.rs".to_string())
        ]
    );
    let source =
        "#[test]\nfn a_seeds() {\n    replay(\"a\", run, vec![]);\n}\n\nfn b_seeds() {\n}\n";
    assert_eq!(
        test_body(source, "a_seeds"),
        Some("    replay(\"a\", run, vec![]);")
    );
    // Not a test: no body found.
    assert_eq!(test_body(source, "b_seeds"), None);
}

#[test]
fn ca_dir_seeds() {
    use ca_dir::Outcome::*;
    replay(
        "ca_dir",
        ca_dir::run,
        vec![
            ("root_only", Signed),
            ("intermediate_sec1", Signed),
            ("key_mismatch", Refused("KeyMismatch".into())),
            ("chain_without_ca_cert", Refused("ChainStart".into())),
        ],
    );
}

#[test]
fn cmdadd_request_seeds() {
    use cmdadd_request::Outcome::*;
    replay(
        "cmdadd_request",
        cmdadd_request::run,
        vec![
            (
                "one_ipv4",
                Accepted {
                    pod: "shop/web-0".into(),
                    addresses: 1,
                },
            ),
            (
                "dual_stack",
                Accepted {
                    pod: "default/db".into(),
                    addresses: 2,
                },
            ),
        ],
    );
}

#[test]
fn cni_conflist_seeds() {
    use cni_conflist::Outcome::*;
    let chained = || Chained {
        into: "10-net.conflist".into(),
    };
    replay(
        "cni_conflist",
        cni_conflist::run,
        vec![
            ("bridge_conflist", chained()),
            ("single_conf", chained()),
            // A `.json` holding a single plugin is wrapped into a list too.
            ("json_single_plugin", chained()),
            // What the fuzzer found: two `type` keys passed the `.conf` check, then made a
            // list whose first plugin could not be read.
            ("conf_two_type_keys", Refused("NoType".into())),
            ("conf_without_type", Refused("NoType".into())),
            ("conflist_without_plugins", Refused("NoPlugins".into())),
            ("conflist_type_not_a_string", Refused("BadPlugin".into())),
            ("conflist_cut_short", Refused("Json".into())),
        ],
    );
}

#[test]
fn cni_plugin_seeds() {
    use cni_plugin::Outcome;
    let plugin = |exit_code, agent_calls| {
        Some(Outcome {
            exit_code,
            agent_calls,
            request_line: false,
        })
    };
    replay(
        "cni_plugin",
        cni_plugin::run,
        vec![
            ("add_ok", plugin(0, 1)),
            ("add_legacy_0.3.1", plugin(0, 1)),
            // Fail closed: an agent that refuses or cannot be reached fails the ADD.
            ("add_refused", plugin(1, 1)),
            ("add_unreachable", plugin(1, 1)),
            // kube-system is excluded: no call, the ADD passes.
            ("add_kube_system", plugin(0, 0)),
            ("check_ok", plugin(0, 1)),
            ("del", plugin(0, 1)),
            ("version", plugin(0, 0)),
            // The agent's request lines parse (as plugin stdin they are not a config).
            (
                "agent_request_add",
                Some(Outcome {
                    exit_code: 1,
                    agent_calls: 0,
                    request_line: true,
                }),
            ),
            (
                "agent_request_remove",
                Some(Outcome {
                    exit_code: 0,
                    agent_calls: 1,
                    request_line: true,
                }),
            ),
        ],
    );
}

#[test]
fn csr_request_seeds() {
    use csr_request::Outcome::*;
    replay(
        "csr_request",
        csr_request::run,
        vec![
            (
                "valid_p256",
                Signed("spiffe://cluster.local/ns/default/sa/web".into()),
            ),
            (
                "two_sans",
                Refused(ambit_identity::CsrError::SanCount { found: 2 }.to_string()),
            ),
        ],
    );
}

#[test]
fn hbone_headers_seeds() {
    use hbone_headers::{Outcome, Request};
    let none = Outcome {
        authority: None,
        baggage: Baggage::default(),
        forwarded_host: None,
        traceparents: 0,
        request: None,
    };
    let authority = |a: &str| Outcome {
        authority: Some(a.into()),
        ..none.clone()
    };
    let productpage = Baggage {
        cluster_id: Some("Kubernetes".into()),
        namespace: Some("bookinfo".into()),
        workload_type: Some("deployment".into()),
        workload_name: Some("productpage-v1".into()),
        ..Baggage::default()
    };
    let ratings = "ratings.bookinfo.svc.cluster.local";
    replay(
        "hbone_headers",
        hbone_headers::run,
        vec![
            ("authority_ipv4", authority("10.0.0.1:8080")),
            ("authority_ipv6", authority("[fd00:10:244::7]:9080")),
            ("authority_host", authority(&format!("{ratings}:9080"))),
            (
                "baggage_two_lines",
                Outcome {
                    baggage: Baggage {
                        cluster_id: Some("Kubernetes".into()),
                        namespace: Some("bookinfo".into()),
                        workload_type: Some("deployment".into()),
                        workload_name: Some("ratings-v1".into()),
                        service_name: Some("ratings".into()),
                        service_version: Some("v1".into()),
                        region: Some("eu-west1".into()),
                        zone: Some("eu-west1-c".into()),
                    },
                    ..none.clone()
                },
            ),
            (
                "baggage_escaped",
                Outcome {
                    baggage: Baggage {
                        namespace: Some("a,b".into()),
                        service_name: Some("x%y".into()),
                        ..Baggage::default()
                    },
                    ..none.clone()
                },
            ),
            (
                "forwarded",
                Outcome {
                    forwarded_host: Some(ratings.into()),
                    ..none.clone()
                },
            ),
            (
                "forwarded_quoted",
                Outcome {
                    forwarded_host: Some(r#"we"ird;host"#.into()),
                    ..none.clone()
                },
            ),
            (
                "traceparent",
                Outcome {
                    traceparents: 1,
                    ..none.clone()
                },
            ),
            (
                "connect_full",
                Outcome {
                    // Read whole as one header value, the text's baggage line counts and
                    // the forwarded host runs on to the end.
                    baggage: Baggage {
                        cluster_id: None,
                        ..productpage.clone()
                    },
                    forwarded_host: Some(format!("{ratings}\nSnetwork-2\nTx")),
                    request: Some(Ok(Request {
                        authority: "10.244.1.9:9080".into(),
                        baggage: Some(productpage.clone()),
                        forwarded_host: Some(ratings.into()),
                        traceparent: true,
                        forwarded_network: Some("network-2".into()),
                    })),
                    ..none.clone()
                },
            ),
            (
                "connect_host",
                Outcome {
                    request: Some(Ok(Request {
                        authority: format!("{ratings}:9080"),
                        baggage: None,
                        forwarded_host: None,
                        traceparent: false,
                        forwarded_network: None,
                    })),
                    ..none.clone()
                },
            ),
            (
                "get_with_path",
                Outcome {
                    request: Some(Err(400)),
                    ..none.clone()
                },
            ),
        ],
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
    for body in [hbone_headers::run(b""), hbone_headers::run(b"\n\n\n")] {
        assert_eq!(body.request, None);
    }
}

#[test]
fn hbone_server_seeds() {
    use hbone_server::Outcome;
    fn ended_with(what: &'static str) -> Box<dyn Fn(&Outcome)> {
        Box::new(move |o: &Outcome| {
            assert!(
                matches!(&o.ended, Some(Err(e)) if e.contains(what)),
                "ended with {:?}, not {what:?}",
                o.ended
            )
        })
    }
    let connect = |valid: bool| -> Box<dyn Fn(&Outcome)> {
        Box::new(move |o: &Outcome| {
            assert_eq!(o.connects, [("10.0.0.2:8080".to_string(), valid)]);
            ended_with("PING")(o);
        })
    };
    replay_checked(
        "hbone_server",
        hbone_server::run,
        vec![
            // A CONNECT in frames reaches the handler, validated; the client then never
            // answers the server's PINGs, which ends the connection.
            ("h2_connect", connect(true)),
            // Another method reaches the handler too, and is refused there.
            ("h2_not_connect", connect(false)),
            // Streams opened and reset at once: h2's rapid-reset guard ends the connection
            // with an error (ENHANCE_YOUR_CALM), not a panic or a hang.
            (
                "h2_rapid_reset",
                Box::new(|o: &Outcome| {
                    assert!(o.connects.is_empty());
                    ended_with("excessive load")(o);
                }),
            ),
            // PING, WINDOW_UPDATE, then GOAWAY: a clean end, no request.
            (
                "h2_ping_window_goaway",
                Box::new(|o: &Outcome| {
                    assert!(o.connects.is_empty());
                    assert_eq!(o.ended, Some(Ok(())));
                }),
            ),
            // Before TLS nothing is a request.
            ("tls_truncated_hello", ended_with("did not complete")),
            ("tls_plaintext_http", ended_with("TLS handshake failed")),
        ],
    );
}

#[test]
fn ipset_save_seeds() {
    let v4 = "istio-inpod-probes-v4";
    let entry = |ip: &str, comment: Option<&str>| Entry {
        ip: ip.parse().unwrap(),
        comment: comment.map(str::to_owned),
    };
    let (uid1, uid2) = (
        "6f3a1e2c-9d4b-4c1a-8e7f-0a1b2c3d4e5f",
        "0b5e7c11-2f4a-4d3e-9a61-7c8d9e0f1a2b",
    );
    let read = |set: &str, entries: Vec<Entry>| {
        Some(ipset_save::Outcome {
            set: set.into(),
            entries,
        })
    };
    let two = || {
        vec![
            entry("10.244.1.17", Some(uid1)),
            entry("10.244.1.23", Some(uid2)),
        ]
    };
    replay(
        "ipset_save",
        ipset_save::run,
        vec![
            ("probes_v4_save", read(v4, two())),
            // Both sets saved: picked by the first `add` line's name, and as the v6 set.
            ("all_sets_save_first", read(v4, two())),
            (
                "all_sets_save_v6",
                read(
                    "istio-inpod-probes-v6",
                    vec![entry("fd00:10:244:1::17", Some(uid1))],
                ),
            ),
            // `ipset list` prints members without `add <set>`: nothing is read from it.
            ("all_sets_list", read(v4, vec![])),
            (
                "escapes",
                read(
                    "s",
                    vec![
                        entry("10.1.2.3", Some(r#"uid "quoted" \ x"#)),
                        entry("10.1.2.4", None),
                        entry("::ffff:10.1.2.5", Some("")),
                    ],
                ),
            ),
        ],
    );
}

#[test]
fn iptables_save_seeds() {
    use iptables_save::PlanOutcome;
    // For each of the target's plans (v4 in-pod with DNS capture, v6 in-pod for ingress,
    // the v4 host probe set): residue, in sync, objects listed as ours. Every seed is shaped
    // like real output, so each one's removal and swap are simulated and checked.
    let plan = |residue, in_sync, ours| PlanOutcome {
        residue,
        in_sync,
        ours,
        simulated: true,
    };
    let clean = plan(false, false, 0);
    replay(
        "iptables_save",
        iptables_save::run,
        vec![
            // Our v4 rules with DNS capture plus the host probe chain in one netns: the
            // host set is in sync, but in a pod every `ISTIO_` chain is ours, so the host
            // chain counts as drift there.
            (
                "inpod_v4_dns_host",
                [
                    plan(true, false, 14),
                    plan(true, false, 14),
                    plan(true, true, 2),
                ],
            ),
            // The same saved with counters (`-c`): the rules are ours all the same.
            (
                "with_counters",
                [
                    plan(true, false, 7),
                    plan(true, false, 7),
                    plan(true, false, 1),
                ],
            ),
            // `ip6tables-save` of the v6 in-pod rules with DNS capture: in sync for that
            // plan, not for the ingress one.
            (
                "inpod_v6_dns",
                [plan(true, true, 12), plan(true, false, 12), clean],
            ),
            // Another version's residue: ours, and drifted.
            (
                "ingress_with_residue",
                [plan(true, false, 11), plan(true, false, 11), clean],
            ),
            ("clean_nat", [clean, clean, clean]),
        ],
    );
    // A comment that quotes `-j ISTIO_FAKE` names no chain of ours.
    let v4 =
        SavedRules::parse(&String::from_utf8(seed("iptables_save", "inpod_v4_dns_host")).unwrap());
    let objects = v4.owned_objects(|_, c| c.starts_with("ISTIO_") && c != "ISTIO_POSTRT");
    assert!(!objects.iter().any(|o| o.contains("FAKE")), "{objects:?}");
    let dns = PodRuleOptions::default();
    assert!(pod_rules(Family::V4, &dns).compare(&v4).residue);
    assert!(
        host_probe_rules(Family::V4, "istio-inpod-probes-v4")
            .compare(&v4)
            .structure_matches
    );
}

#[test]
fn local_config_seeds() {
    use local_config::Outcome::Loaded;
    let loaded = |workloads, services, policies| Loaded {
        workloads,
        services,
        policies,
    };
    replay(
        "local_config",
        local_config::run,
        vec![
            ("bookinfo.yaml", loaded(3, 2, 2)),
            ("minimal.yaml", loaded(1, 0, 0)),
            ("services_only.yaml", loaded(0, 1, 0)),
            ("empty.yaml", loaded(0, 0, 0)),
            ("l7_every_attribute.yaml", loaded(1, 0, 2)),
            (
                "l7_refused_method.yaml",
                local_config::Outcome::Refused(
                    "fuzz: line 6, column 24: policies[0].rules[0][0][0].methods[0]: method \"delete\" is not upper case; methods are compared case-sensitively and a request whose method is not upper case is refused, so it can never match; write \"DELETE\"".into(),
                ),
            ),
            (
                "l7_refused_template.yaml",
                local_config::Outcome::Refused(
                    "fuzz: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path template \"/{**}/{*}\": {**} must be the last operator".into(),
                ),
            ),
        ],
    );
}

#[test]
fn manifests_seeds() {
    use manifests::Outcome;
    replay(
        "manifests",
        manifests::run,
        vec![
            (
                "policies.yaml",
                Outcome {
                    policies: vec![
                        "istio-system/audit-all".into(),
                        "shop/deny-admin".into(),
                        "shop/ext".into(),
                        "shop/reviews".into(),
                    ],
                    authns: vec![],
                    routes: vec!["HTTPRoute shop/reviews".into()],
                    destination_rules: vec![],
                    skipped: 1,
                    errors: vec![],
                },
            ),
            // Routes: every filter and match kind, a GRPCRoute, a Gateway's route (a
            // waypoint's, were the Gateway one), a redirect beside backends refused.
            (
                "routes.yaml",
                Outcome {
                    policies: vec![],
                    authns: vec![],
                    routes: vec![
                        "GRPCRoute shop/echo".into(),
                        "HTTPRoute shop/ingress".into(),
                        "HTTPRoute shop/reviews".into(),
                    ],
                    destination_rules: vec![],
                    skipped: 0,
                    errors: vec!["fuzz:64:14: spec.rules[0].filters: a RequestRedirect filter cannot be used together with backendRefs".into()],
                },
            ),
            // A bad document is refused alone; a second `shop/fine` is refused, the first kept.
            (
                "one_bad_document.yaml",
                Outcome {
                    policies: vec!["shop/fine".into()],
                    authns: vec![],
                    routes: vec![],
                    destination_rules: vec![],
                    skipped: 0,
                    errors: vec![
                        "fuzz:6:40: spec.rules[0].to[0].operation.methods[0]: method \"get\" is not upper case; methods are compared case-sensitively and a request whose method is not upper case is refused, so it can never match; write \"GET\"".into(),
                        "fuzz:18:1: did not find expected node content, while parsing a flow node".into(),
                        "fuzz:21:18: metadata.name: AuthorizationPolicy shop/fine is defined again; the first definition (fuzz:8) is kept".into(),
                    ],
                },
            ),
            // RequestAuthentications: every JWT rule field, a GatewayClass target from the
            // root namespace, one with a selector skipped.
            (
                "request_authentication.yaml",
                Outcome {
                    policies: vec![],
                    authns: vec!["istio-system/mesh-jwt".into(), "shop/reviews-jwt".into()],
                    routes: vec![],
                    destination_rules: vec![],
                    skipped: 1,
                    errors: vec![],
                },
            ),
            // Each bad one refused alone; a refused shop/jwt is not the first, so the next one
            // is read and the one after it refused as a second.
            (
                "request_authentication_refused.yaml",
                Outcome {
                    policies: vec![],
                    authns: vec!["shop/jwt".into()],
                    routes: vec![],
                    destination_rules: vec![],
                    skipped: 0,
                    errors: vec![
                        "fuzz:8:66: spec.jwtRules[0].jwks: set only one of jwksUri and jwks; jwksUri is set too".into(),
                        "fuzz:15:37: spec.jwtRules[0].timeout: \"500us\" is shorter than 1ms".into(),
                        "fuzz:22:38: spec.jwtRules[0].presence: is not supported by this waypoint, and it changes which requests pass; remove it (the RequestAuthentication is refused while it is there)".into(),
                        "fuzz:33:18: metadata.name: RequestAuthentication shop/jwt is defined again; the first definition (fuzz:24) is kept".into(),
                    ],
                },
            ),
            // DestinationRules: every field read; one refused by name.
            (
                "destination_rules.yaml",
                Outcome {
                    policies: vec![],
                    authns: vec![],
                    routes: vec![],
                    destination_rules: vec!["shop/sticky".into()],
                    skipped: 0,
                    errors: vec!["fuzz:25:9: spec.host: \"*\" alone is not a host; name one, or \"*.\" and a domain".into()],
                },
            ),
            // A CORS filter, and parents of kind Gateway and ServiceEntry.
            (
                "cors_and_parents.yaml",
                Outcome {
                    policies: vec![],
                    authns: vec![],
                    routes: vec!["HTTPRoute shop/cors".into()],
                    destination_rules: vec![],
                    skipped: 0,
                    errors: vec![],
                },
            ),
            (
                "not_utf8.yaml",
                Outcome {
                    policies: vec![],
                    authns: vec![],
                    routes: vec![],
                    destination_rules: vec![],
                    skipped: 0,
                    errors: vec!["fuzz:3:18: not UTF-8 text; manifests are UTF-8".into()],
                },
            ),
        ],
    );
}

#[test]
fn pod_cgroup_seeds() {
    use pod_cgroup::Outcome;
    let pod = Outcome {
        pod_uid: Some("3b5c8e2d-1d1c-4b2e-9f0a-2b1c3d4e5f60".into()),
        start_time: None,
    };
    replay(
        "pod_cgroup",
        pod_cgroup::run,
        vec![
            ("cgroupfs", pod.clone()),
            ("systemd", pod.clone()),
            ("crio", pod),
            // A `stat` file whose command name holds spaces and parentheses.
            (
                "stat_odd_comm",
                Outcome {
                    pod_uid: None,
                    start_time: Some(123_456),
                },
            ),
        ],
    );
}

#[test]
fn socks5_request_seeds() {
    use socks5_request::Outcome::Request;
    let connect = |target: &str| Request {
        target: target.into(),
        trailing: 0,
    };
    replay(
        "socks5_request",
        socks5_request::run,
        vec![
            ("connect_ipv4", connect("10.0.0.7:8080")),
            ("connect_ipv6", connect("[fd00::7]:80")),
            ("connect_name", connect("echo.default.svc.cluster.local:80")),
        ],
    );
}

#[test]
fn request_head_seeds() {
    let prepared = |authority: &str, upgrade: Option<&str>| -> request_head::Outcome {
        Ok((authority.into(), upgrade.map(str::to_string)))
    };
    let refused = |variant: &str| -> request_head::Outcome { Err(variant.into()) };
    replay(
        "request_head",
        request_head::run,
        vec![
            ("origin_form", prepared("echo:80", None)),
            ("absolute_form_wins", prepared("echo.default:80", None)),
            ("two_hosts", refused("TwoHosts")),
            ("h2c_dropped", prepared("echo", None)),
            ("websocket", prepared("echo", Some("websocket"))),
            ("echo_refused", refused("Upgrade")),
            ("echo_allowed", prepared("echo", Some("echo"))),
            ("h2_host_differs", refused("HostNotAuthority")),
            ("hop_by_hop", prepared("echo", None)),
            ("connect", refused("Connect")),
            ("user_info", refused("BadHost")),
            ("http10_no_host", prepared("", None)),
        ],
    );
}

#[test]
fn pod_labels_seeds() {
    let map = |pairs: &[(&str, &str)]| -> Result<BTreeMap<String, String>, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    };
    replay(
        "pod_labels",
        pod_labels::run,
        vec![
            (
                "waypoint",
                map(&[
                    ("gateway.istio.io/managed", "istio.io-mesh-controller"),
                    (
                        "gateway.networking.k8s.io/gateway-class-name",
                        "istio-waypoint",
                    ),
                    ("gateway.networking.k8s.io/gateway-name", "waypoint"),
                    ("istio.io/dataplane-mode", "none"),
                ]),
            ),
            (
                "annotations",
                map(&[
                    (
                        "kubectl.kubernetes.io/last-applied-configuration",
                        "{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}\n",
                    ),
                    ("note", "tab\there \u{e9}\u{e9} \\ end"),
                ]),
            ),
            ("yaml_not_kubelet", Err("NotKeyValue".into())),
            ("bad_escape", Err("BadValue".into())),
        ],
    );
}

#[test]
fn spiffe_id_seeds() {
    replay(
        "spiffe_id",
        spiffe_id::run,
        vec![
            (
                "bookinfo",
                Ok(id(
                    "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage",
                )),
            ),
            // Every character the SPIFFE path set allows.
            (
                "escapes",
                Ok(SpiffeId::new("td.example_1", "My.Name-2_x", "..a..").unwrap()),
            ),
            ("trailing_slash", Err("TrailingSlash".into())),
        ],
    );
}

#[test]
fn x509_cert_seeds() {
    use x509_cert::Outcome;
    let svid = |s: &str| Outcome {
        ids: vec![id(s)],
        svid: Some(id(s)),
    };
    replay(
        "x509_cert",
        x509_cert::run,
        vec![
            (
                "spiffe_leaf.der",
                svid("spiffe://cluster.local/ns/bookinfo/sa/bookinfo-ratings"),
            ),
            // A SPIFFE and an https URI and DNS SANs: only `spiffe:` URIs count.
            ("multi_san.der", svid("spiffe://cluster.local/ns/a/sa/b")),
        ],
    );
}

#[test]
fn zds_request_seeds() {
    use zds_request::Outcome;
    let uid = "6f3a1e2c-9d4b-4c1a-8e7f-0a1b2c3d4e5f";
    // Each datagram is also tried as a response and a hello: protobuf reads many bytes as
    // many messages.
    let add = |request: Result<&'static str, String>| {
        Some(Outcome {
            request,
            response: Some(Err(uid.into())),
            hello: None,
        })
    };
    let other = |kind: &'static str| {
        Some(Outcome {
            request: Ok(kind),
            response: None,
            hello: Some(0),
        })
    };
    replay(
        "zds_request",
        zds_request::run,
        vec![
            // The fd rules: an Add needs exactly one fd.
            ("add_workload_1fd", add(Ok("AddWorkload"))),
            ("add_workload_0fd", add(Err("NoControlMessage".into()))),
            ("add_workload_2fd", add(Err("TooManyFds".into()))),
            ("keep_workload", other("KeepWorkload")),
            ("del_workload", other("DelWorkload")),
            ("snapshot_sent", other("SnapshotSent")),
            (
                "ack",
                Some(Outcome {
                    request: Err("EmptyUid".into()),
                    response: Some(Ok(())),
                    hello: None,
                }),
            ),
            (
                "nack",
                Some(Outcome {
                    request: Err("MissingWorkloadInfo".into()),
                    response: Some(Err("failed to create netns handle".into())),
                    hello: None,
                }),
            ),
            (
                "hello_v1",
                Some(Outcome {
                    request: Err("Decode".into()),
                    response: None,
                    hello: Some(1),
                }),
            ),
        ],
    );
}

#[test]
fn zds_proxy_states_seeds() {
    replay(
        "zds_proxy_states",
        zds_sequences::proxy,
        vec![
            (
                "snapshot_reconcile",
                ProxyStats {
                    starts: 4,
                    stops: 1,
                    failed_starts: 0,
                    snapshots: 2,
                    fatal_errors: 0,
                    ready: true,
                },
            ),
            (
                "replaced_netns_then_delete",
                ProxyStats {
                    starts: 2,
                    stops: 2,
                    failed_starts: 0,
                    snapshots: 1,
                    fatal_errors: 0,
                    ready: true,
                },
            ),
            (
                "pending_retry",
                ProxyStats {
                    starts: 3,
                    stops: 0,
                    failed_starts: 2,
                    snapshots: 1,
                    fatal_errors: 0,
                    ready: true,
                },
            ),
            (
                "protocol_errors",
                ProxyStats {
                    snapshots: 1,
                    fatal_errors: 2,
                    ready: true,
                    ..ProxyStats::default()
                },
            ),
            (
                "delete_before_snapshot",
                ProxyStats {
                    starts: 1,
                    stops: 1,
                    failed_starts: 0,
                    snapshots: 2,
                    fatal_errors: 0,
                    ready: true,
                },
            ),
            // The AddWorkload and SnapshotSent seeds of `zds_request`, decoded on the way.
            (
                "raw_datagrams",
                ProxyStats {
                    starts: 1,
                    snapshots: 1,
                    ready: true,
                    ..ProxyStats::default()
                },
            ),
        ],
    );
}

#[test]
fn zds_agent_session_seeds() {
    let closed_early = AgentStats {
        closed_early: true,
        ..AgentStats::default()
    };
    replay(
        "zds_agent_session",
        zds_sequences::agent,
        vec![
            (
                "snapshot_then_requests",
                AgentStats {
                    sent: 6,
                    acked: 2,
                    snapshots: 1,
                    ..AgentStats::default()
                },
            ),
            (
                "ack_timeout_late_ack",
                AgentStats {
                    sent: 3,
                    acked: 1,
                    timed_out: 1,
                    late_acks: 1,
                    snapshots: 1,
                    ..AgentStats::default()
                },
            ),
            (
                "stopped_acking",
                AgentStats {
                    sent: 5,
                    timed_out: 4,
                    snapshots: 1,
                    closed_early: true,
                    ..AgentStats::default()
                },
            ),
            ("no_hello", closed_early),
            ("unsolicited_before_snapshot", closed_early),
            (
                "malformed_answer",
                AgentStats {
                    sent: 1,
                    ..closed_early
                },
            ),
            (
                "peer_closed_mid_request",
                AgentStats {
                    sent: 1,
                    ..closed_early
                },
            ),
        ],
    );
}

/// Every DNS seed gets a reply from the target's body and from the local path over TCP.
#[test]
fn dns_query_seeds() {
    let answered = |data: &[u8]| {
        dns_query::query_path(data);
        ambit_dns::handle_locally(
            &ambit_state::ProxyState::new(),
            None,
            &ambit_dns::Settings::default(),
            &data[1..],
            ambit_dns::Protocol::Tcp,
        )
        .is_some()
    };
    replay(
        "dns_query",
        answered,
        vec![
            ("a_fqdn", true),
            ("aaaa_short_tcp", true),
            ("headless_unknown_client", true),
            ("mx_forwarded", true),
            ("search_stripped_edns", true),
            ("wildcard_fixed_search", true),
        ],
    );
}

/// The xDS seeds through the targets' bodies; what each is, through the client with its
/// default limits: how many changes it applies and which resources it rejects. (The
/// target's own smaller limits are checked in `ambit-xds`'s tests of these seeds.)
#[test]
fn xds_delta_seeds() {
    use ambit_xds::{DeltaClient, NodeConfig};
    let handled = |data: &[u8]| {
        xds_delta::delta_response(data);
        let h = DeltaClient::new(NodeConfig::default().to_node())
            .handle_bytes(&data[1..])
            .expect("a response");
        let rejected: Vec<String> = h.rejected.into_iter().map(|(n, _)| n).collect();
        (h.batch.len(), rejected)
    };
    replay(
        "xds_delta",
        handled,
        vec![
            ("address_workload_service", (3, vec![])),
            ("authorization", (1, vec![])),
            // The audit's 2,000,000-match policy, small, beside a good one.
            (
                "authorization_many_matches",
                (1, vec!["bookinfo/many".into()]),
            ),
            // A service body named for another service, beside a good one.
            (
                "address_misnamed",
                (
                    1,
                    vec!["bookinfo/announced.bookinfo.svc.cluster.local".into()],
                ),
            ),
            // 65 removals: over the target's 64, within the default limit.
            ("too_many_entries", (65, vec![])),
            // Three policies of 64 empty match objects: within the default budget of
            // what policies hold, over the target's (which refuses the response whole).
            ("authorization_split", (3, vec![])),
        ],
    );
}

#[test]
fn xds_resource_seeds() {
    use ambit_xds::shape::{check_address, check_authorization};
    let walked = |data: &[u8]| {
        xds_resource::resource_body(data);
        let body = &data[1..];
        let walk = if data[0] & 1 == 1 {
            check_authorization(body)
        } else {
            check_address(body)
        };
        walk.map_err(|e| variant(&e))
    };
    replay(
        "xds_resource",
        walked,
        vec![
            ("policy", Ok(())),
            ("workload", Ok(())),
            ("service", Ok(())),
            // The body is well formed; its name is what is wrong (the client refuses it).
            ("service_misnamed", Ok(())),
            ("policy_many_matches", Err("TooMany".into())),
            // 80 addresses once its two copies merge, over 64.
            ("workload_twice", Err("TooMany".into())),
        ],
    );
}

#[test]
fn xds_waypoint_document_seeds() {
    replay(
        "xds_waypoint_document",
        xds_waypoint_document::run,
        vec![
            ("policy_deny", Ok("AuthorizationPolicy/shop/deny-admin".into())),
            ("policy_custom", Ok("AuthorizationPolicy/shop/ext".into())),
            ("policy_bad_value", Err("manifest: AuthorizationPolicy/shop/deny-admin:7:38: spec.rules[0].to[0].operation.paths[0]: path \"admin\" does not start with \"/\", so it can never match; write \"/admin\"".into())),
            ("policy_misnamed", Err("manifest: the document is AuthorizationPolicy shop/deny-admin, not the AuthorizationPolicy shop/other the message names".into())),
            // The earlier form (translated rules as JSON, no document) is refused.
            ("policy_old_form", Err("kind: \"\" is not AuthorizationPolicy".into())),
            ("route_http", Ok("HTTPRoute/shop/r".into())),
            ("route_grpc", Ok("GRPCRoute/shop/g".into())),
            ("route_misnamed", Err("manifest: the document is HTTPRoute shop/r, not the HTTPRoute shop/other the message names".into())),
            ("route_bad_port", Err("manifest: HTTPRoute/shop/r:8:120: spec.rules[0].backendRefs[2].port: 0 is not a port (1-65535)".into())),
            ("route_garbage", Err("cannot decode ambit.waypoint.v1.Route: failed to decode Protobuf message: Route.kind: invalid varint".into())),
            ("authn_jwt", Ok("RequestAuthentication/shop/jwt".into())),
            ("authn_route_inside", Err("manifest: holds 0 objects of its kind and 1 others; exactly one is carried".into())),
            ("destination_rule", Ok("DestinationRule/shop/sticky".into())),
            ("destination_rule_refused", Err("manifest: DestinationRule/shop/sticky:6:50: spec.trafficPolicy.loadBalancer.consistentHash: names no hash key: set one of httpHeaderName, httpCookie, useSourceIp, httpQueryParameterName".into())),
        ],
    );
}

#[test]
fn request_authz_seeds() {
    use request_authz::Outcome;
    let decided = |path: &str, verdict: Result<(), &str>| Outcome {
        path: Ok(path.into()),
        verdict: verdict.map_err(|d| format!("rbac_access_denied_matched_policy[{d}]")),
    };
    let refused = |variant: &str, verdict: Result<(), &str>| Outcome {
        path: Err(variant.into()),
        verdict: verdict.map_err(|d| format!("rbac_access_denied_matched_policy[{d}]")),
    };
    replay(
        "request_authz",
        request_authz::run,
        vec![
            ("allowed_read", decided("/api/v1/items", Ok(()))),
            (
                "denied_dot_dot",
                decided("/admin/x", Err("ns[default]-policy[deny-admin]-rule[0]")),
            ),
            ("refused_nul", refused("Nul", Err("none"))),
            (
                "merge_slashes_blocked",
                decided(
                    "/api/v1/items",
                    Err("ns[default]-policy[deny-header]-rule[0]"),
                ),
            ),
            (
                "decode_slashes_admin",
                decided(
                    "/admin/panel",
                    Err("ns[default]-policy[deny-admin]-rule[0]"),
                ),
            ),
            (
                "base_keeps_encoded_slash",
                decided("/admin%2Fpanel", Ok(())),
            ),
            ("jwt_admin", decided("/x", Ok(()))),
            (
                "prod_from_outside",
                decided(
                    "/public/x",
                    Err("ns[default]-policy[deny-prod-outside]-rule[0]"),
                ),
            ),
            ("not_origin_form", refused("NotOriginForm", Err("none"))),
        ],
    );
}

#[test]
fn jwt_seeds() {
    let refused = |r: &str| format!("refused: {r}");
    replay(
        "jwt",
        jwt::run,
        vec![
            ("valid_a_bearer", "authenticated: https://a.fuzz/alice".into()),
            // Both of rule A's places hold it; rule B does not know its issuer but rule A
            // is valid, which is enough.
            ("valid_a_all_places", "authenticated: https://a.fuzz/alice".into()),
            ("valid_a_query", "authenticated: https://a.fuzz/alice".into()),
            ("valid_b_header", "authenticated: https://b.fuzz/bob".into()),
            ("expired", refused("Jwt is expired")),
            ("wrong_audience", refused("Audiences in Jwt are not allowed")),
            ("tampered_payload", refused("Jwt verification fails")),
            ("alg_none", refused("Jwt header [alg] is not supported")),
            ("unknown_kid", refused("Jwks doesn't have key to match kid or alg from Jwt")),
            ("garbage", refused("Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections")),
            ("jwks_key_a", "jwks: 1 keys, 0 skipped; the fixed token verifies".into()),
            // RS256, P-256 and the pinned Ed25519 key kept; the HMAC and the `enc` keys skipped.
            ("jwks_mixed", "jwks: 3 keys, 2 skipped; the fixed token verifies".into()),
            ("jwks_other_key", "jwks: 1 keys, 0 skipped; the fixed token refuses: Jwt verification fails".into()),
            ("jwks_not_json", "jwks error: NotJson".into()),
            ("jwks_no_usable_key", "jwks error: NoUsableKey".into()),
        ],
    );
}
