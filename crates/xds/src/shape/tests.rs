//! Each limit at its figure (accepted and applied) and one over (NACKed naming the
//! resource, the field and the limit), through the delta client; the name checks per
//! type; and the walk's agreement with `prost`'s merge rules.

use super::*;
use crate::delta::{DeltaClient, Handled, NodeConfig};
use crate::reject::Rejection;
use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::ProxyState;
use prost::Message;

const UID: &str = "c1//v1/Pod/ns1/a";
const SVC: &str = "ns1/echo.ns1.svc.cluster.local";
const POLICY: &str = "ns1/p";

fn handle(type_url: &str, name: &str, body: Vec<u8>) -> (Handled, ProxyState) {
    let mut client = DeltaClient::new(NodeConfig::default().to_node());
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "1".into(),
        resources: vec![Resource {
            name: name.into(),
            version: "1".into(),
            resource: Some(prost_types::Any {
                type_url: type_url.into(),
                value: body,
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    let mut state = ProxyState::new();
    h.batch.clone().apply(&mut state);
    (h, state)
}

/// A body of one of the two types, and its resource name.
struct Body {
    type_url: &'static str,
    name: &'static str,
    bytes: Vec<u8>,
}

fn policy(rules: Vec<psec::Rule>) -> Body {
    policy_with(rules, Vec::new())
}

fn policy_with(rules: Vec<psec::Rule>, extensions: Vec<pw::Extension>) -> Body {
    Body {
        type_url: AUTHORIZATION_TYPE,
        name: POLICY,
        bytes: psec::Authorization {
            name: "p".into(),
            namespace: "ns1".into(),
            scope: psec::Scope::Namespace as i32,
            rules,
            extensions,
            ..Default::default()
        }
        .encode_to_vec(),
    }
}

fn rule(clauses: Vec<Vec<psec::Match>>) -> psec::Rule {
    psec::Rule {
        clauses: clauses
            .into_iter()
            .map(|matches| psec::Clause { matches })
            .collect(),
    }
}

fn ports_match(n: usize) -> psec::Match {
    psec::Match {
        destination_ports: (0..n).map(|i| 1 + (i as u32 % 65_000)).collect(),
        ..Default::default()
    }
}

fn principals_match(values: Vec<String>) -> psec::Match {
    psec::Match {
        principals: values
            .into_iter()
            .map(|v| psec::StringMatch {
                match_type: Some(psec::string_match::MatchType::Exact(v)),
            })
            .collect(),
        ..Default::default()
    }
}

fn empty_matches(n: usize) -> Vec<psec::Match> {
    vec![psec::Match::default(); n]
}

fn base_workload() -> pw::Workload {
    pw::Workload {
        uid: UID.into(),
        name: "a".into(),
        namespace: "ns1".into(),
        addresses: vec![vec![10, 0, 0, 1].into()],
        ..Default::default()
    }
}

fn workload(w: pw::Workload) -> Body {
    Body {
        type_url: ADDRESS_TYPE,
        name: UID,
        bytes: pw::Address {
            r#type: Some(pw::address::Type::Workload(w)),
        }
        .encode_to_vec(),
    }
}

fn base_service() -> pw::Service {
    pw::Service {
        name: "echo".into(),
        namespace: "ns1".into(),
        hostname: "echo.ns1.svc.cluster.local".into(),
        ..Default::default()
    }
}

fn service(s: pw::Service) -> Body {
    Body {
        type_url: ADDRESS_TYPE,
        name: SVC,
        bytes: pw::Address {
            r#type: Some(pw::address::Type::Service(s)),
        }
        .encode_to_vec(),
    }
}

fn ipv4(i: usize) -> Vec<u8> {
    vec![10, 1, (i >> 8) as u8, i as u8]
}

fn ports(n: usize) -> Vec<pw::Port> {
    (0..n)
        .map(|i| pw::Port {
            service_port: 1 + i as u32,
            target_port: 1 + i as u32,
            app_protocol: 0,
        })
        .collect()
}

fn extensions(n: usize) -> Vec<pw::Extension> {
    (0..n)
        .map(|i| pw::Extension {
            name: format!("x{i}"),
            config: None,
        })
        .collect()
}

fn services_map(lists: &[usize]) -> std::collections::HashMap<String, pw::PortList> {
    lists
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (
                format!("ns1/s{i}.ns1.svc.cluster.local"),
                pw::PortList { ports: ports(n) },
            )
        })
        .collect()
}

/// How a body with the count `n` of the limit under test is built.
type Build = fn(usize) -> Body;

/// Every count limit: the body built at the figure is accepted and held; one more is
/// NACKed with the field and the limit.
#[test]
fn each_count_limit_at_and_over_its_figure() {
    let cases: &[(Limit, Build, &str)] = &[
        (
            Limit::RulesPerPolicy,
            |n| policy(vec![psec::Rule::default(); n]),
            "rules",
        ),
        (
            Limit::ClausesPerRule,
            |n| policy(vec![rule(vec![Vec::new(); n])]),
            "rules[0].clauses",
        ),
        // Counted over the rule's clauses: half in each of two.
        (
            Limit::MatchesPerRule,
            |n| {
                policy(vec![rule(vec![
                    empty_matches(n / 2),
                    empty_matches(n - n / 2),
                ])])
            },
            "rules[0].clauses[1].matches",
        ),
        // Four rules at their own limit, then the rest in a fifth.
        (
            Limit::MatchesPerPolicy,
            |n| {
                let mut rules: Vec<_> = (0..n / MAX_MATCHES_PER_RULE)
                    .map(|_| rule(vec![empty_matches(MAX_MATCHES_PER_RULE)]))
                    .collect();
                rules.push(rule(vec![empty_matches(n % MAX_MATCHES_PER_RULE)]));
                policy(rules)
            },
            "rules[4].clauses[0].matches",
        ),
        // Packed ports count one value per varint.
        (
            Limit::ValuesPerField,
            |n| policy(vec![rule(vec![vec![ports_match(n)]])]),
            "rules[0].clauses[0].matches[0].destinationPorts",
        ),
        (
            Limit::ValuesPerField,
            |n| {
                let values = (0..n)
                    .map(|i| format!("cluster.local/ns/a/sa/{i}"))
                    .collect();
                policy(vec![rule(vec![vec![principals_match(values)]])])
            },
            "rules[0].clauses[0].matches[0].principals",
        ),
        (
            Limit::ValuesPerPolicy,
            |n| {
                let mut matches: Vec<_> = (0..n / MAX_VALUES_PER_FIELD)
                    .map(|_| ports_match(MAX_VALUES_PER_FIELD))
                    .collect();
                matches.push(ports_match(n % MAX_VALUES_PER_FIELD));
                policy(vec![rule(vec![matches])])
            },
            "rules[0].clauses[0].matches[16].destinationPorts",
        ),
        (
            Limit::Extensions,
            |n| policy_with(Vec::new(), extensions(n)),
            "extensions",
        ),
        (
            Limit::WorkloadAddresses,
            |n| {
                workload(pw::Workload {
                    addresses: (0..n).map(|i| ipv4(i).into()).collect(),
                    ..base_workload()
                })
            },
            "addresses",
        ),
        (
            Limit::WorkloadServices,
            |n| {
                workload(pw::Workload {
                    services: services_map(&vec![0; n]),
                    ..base_workload()
                })
            },
            "services",
        ),
        (
            Limit::PortsPerList,
            |n| {
                workload(pw::Workload {
                    services: services_map(&[n]),
                    ..base_workload()
                })
            },
            "services[0].ports",
        ),
        // Sixteen full lists, then the rest in a seventeenth (the last on the wire).
        (
            Limit::PortsPerWorkload,
            |n| {
                let mut lists = vec![MAX_PORTS_PER_LIST; n / MAX_PORTS_PER_LIST];
                if n % MAX_PORTS_PER_LIST > 0 {
                    lists.push(n % MAX_PORTS_PER_LIST);
                }
                workload(pw::Workload {
                    services: services_map(&lists),
                    ..base_workload()
                })
            },
            "services[16].ports",
        ),
        (
            Limit::WorkloadPolicies,
            |n| {
                workload(pw::Workload {
                    authorization_policies: (0..n).map(|i| format!("ns1/p{i}")).collect(),
                    ..base_workload()
                })
            },
            "authorizationPolicies",
        ),
        (
            Limit::Extensions,
            |n| {
                workload(pw::Workload {
                    extensions: extensions(n),
                    ..base_workload()
                })
            },
            "extensions",
        ),
        (
            Limit::ServiceAddresses,
            |n| {
                service(pw::Service {
                    addresses: (0..n)
                        .map(|i| pw::NetworkAddress {
                            network: String::new(),
                            address: ipv4(i).into(),
                            length: None,
                        })
                        .collect(),
                    ..base_service()
                })
            },
            "addresses",
        ),
        (
            Limit::PortsPerList,
            |n| {
                service(pw::Service {
                    ports: ports(n),
                    ..base_service()
                })
            },
            "ports",
        ),
        (
            Limit::SubjectAltNames,
            |n| {
                service(pw::Service {
                    subject_alt_names: (0..n)
                        .map(|i| format!("spiffe://cluster.local/ns/ns1/sa/s{i}"))
                        .collect(),
                    ..base_service()
                })
            },
            "subjectAltNames",
        ),
        (
            Limit::WeightedWaypoints,
            |n| {
                service(pw::Service {
                    weighted_waypoints: vec![pw::WeightedWaypoint::default(); n],
                    ..base_service()
                })
            },
            "weightedWaypoints",
        ),
        (
            Limit::RoutingPreferences,
            |n| {
                service(pw::Service {
                    load_balancing: Some(pw::LoadBalancing {
                        routing_preference: (0..n).map(|i| 1 + (i % 6) as i32).collect(),
                        ..Default::default()
                    }),
                    ..base_service()
                })
            },
            "loadBalancing.routingPreference",
        ),
        (
            Limit::Extensions,
            |n| {
                service(pw::Service {
                    extensions: extensions(n),
                    ..base_service()
                })
            },
            "extensions",
        ),
    ];
    for &(limit, build, field) in cases {
        let n = limit.max();
        let at = build(n);
        let (h, state) = handle(at.type_url, at.name, at.bytes);
        assert!(h.rejected.is_empty(), "{limit:?} at {n}: {:?}", h.rejected);
        let held = state.workloads().count() + state.services().count() + state.policies().count();
        assert_eq!(held, 1, "{limit:?} at {n}: not applied");

        let over = build(n + 1);
        let (h, state) = handle(over.type_url, over.name, over.bytes);
        assert_eq!(
            h.rejected,
            vec![(
                over.name.to_string(),
                Rejection::Shape(ShapeError::TooMany {
                    field: field.into(),
                    limit
                })
            )],
            "{limit:?} at {}",
            n + 1
        );
        let message = &h.reply.error_detail.expect("a NACK").message;
        assert_eq!(
            *message,
            format!(
                "{}: {field}: more than {n} {} (the limit)",
                over.name,
                limit.what()
            )
        );
        assert!(h.batch.is_empty());
        assert_eq!(state.workloads().count() + state.services().count(), 0);
        assert_eq!(state.policies().count(), 0);
    }
}

/// Every kind of string at [`MAX_STRING_BYTES`] is accepted, one byte more is NACKed.
#[test]
fn string_bytes_at_and_over_the_limit() {
    let cases: &[(Build, &str)] = &[
        (
            |n| {
                policy(vec![rule(vec![vec![principals_match(
                    vec!["p".repeat(n)],
                )]])])
            },
            "rules[0].clauses[0].matches[0].principals[0].exact",
        ),
        (
            |n| {
                policy(vec![rule(vec![vec![psec::Match {
                    not_service_accounts: vec![psec::ServiceAccountMatch {
                        namespace: "ns1".into(),
                        service_account: "s".repeat(n),
                    }],
                    ..Default::default()
                }]])])
            },
            "rules[0].clauses[0].matches[0].notServiceAccounts[0].serviceAccount",
        ),
        (
            |n| {
                workload(pw::Workload {
                    hostname: "h".repeat(n),
                    ..base_workload()
                })
            },
            "hostname",
        ),
        (
            |n| {
                workload(pw::Workload {
                    locality: Some(pw::Locality {
                        zone: "z".repeat(n),
                        ..Default::default()
                    }),
                    ..base_workload()
                })
            },
            "locality.zone",
        ),
        (
            |n| {
                workload(pw::Workload {
                    authorization_policies: vec!["ns1/q".into(), "q".repeat(n)],
                    ..base_workload()
                })
            },
            "authorizationPolicies[1]",
        ),
        (
            |n| {
                workload(pw::Workload {
                    services: [(
                        format!("ns1/{}", "s".repeat(n - 4)),
                        pw::PortList::default(),
                    )]
                    .into(),
                    ..base_workload()
                })
            },
            "services[0].key",
        ),
        (
            |n| {
                service(pw::Service {
                    subject_alt_names: vec!["s".repeat(n)],
                    ..base_service()
                })
            },
            "subjectAltNames[0]",
        ),
        (
            |n| {
                service(pw::Service {
                    waypoint: Some(pw::GatewayAddress {
                        destination: Some(pw::gateway_address::Destination::Hostname(
                            pw::NamespacedHostname {
                                namespace: "ns1".into(),
                                hostname: "w".repeat(n),
                            },
                        )),
                        hbone_mtls_port: 15008,
                    }),
                    ..base_service()
                })
            },
            "waypoint.hostname.hostname",
        ),
    ];
    for &(build, field) in cases {
        let at = build(MAX_STRING_BYTES);
        let (h, state) = handle(at.type_url, at.name, at.bytes);
        assert!(h.rejected.is_empty(), "{field}: {:?}", h.rejected);
        let held = state.workloads().count() + state.services().count() + state.policies().count();
        assert_eq!(held, 1, "{field}");

        let over = build(MAX_STRING_BYTES + 1);
        let (h, _) = handle(over.type_url, over.name, over.bytes);
        assert_eq!(
            h.rejected,
            vec![(
                over.name.to_string(),
                Rejection::Shape(ShapeError::TooLong {
                    field: field.into(),
                    len: MAX_STRING_BYTES + 1
                })
            )],
        );
        assert_eq!(
            h.reply.error_detail.unwrap().message,
            format!(
                "{}: {field}: 4097 bytes, more than the limit of 4096 bytes per string",
                over.name
            )
        );
    }
}

/// The audit's case, scaled down: a clause of many empty match objects (2 bytes each on
/// the wire) is refused on its bytes, and its NACK names the resource and the field.
#[test]
fn many_empty_matches_are_refused_before_decoding() {
    let body = policy(vec![rule(vec![empty_matches(200_000)])]);
    assert!(body.bytes.len() < 410_000, "2 bytes per match");
    assert_eq!(
        check_authorization(&body.bytes),
        Err(ShapeError::TooMany {
            field: "rules[0].clauses[0].matches".into(),
            limit: Limit::MatchesPerRule
        })
    );
    let (h, state) = handle(body.type_url, body.name, body.bytes);
    assert_eq!(
        h.reply.error_detail.unwrap().message,
        "ns1/p: rules[0].clauses[0].matches: more than 4096 match objects in one rule (the limit)"
    );
    assert_eq!(state.policies().count(), 0);
}

/// `prost` merges a singular sub-message that appears twice; the walk adds up the counts
/// of both occurrences, as the decoded message would hold them.
#[test]
fn merged_occurrences_add_up() {
    let half = |from: usize| {
        pw::Address {
            r#type: Some(pw::address::Type::Workload(pw::Workload {
                addresses: (from..from + 40).map(|i| ipv4(i).into()).collect(),
                ..base_workload()
            })),
        }
        .encode_to_vec()
    };
    let mut twice = half(0);
    twice.extend(half(40));
    // What prost makes of it: one workload with 80 addresses.
    match pw::Address::decode(twice.as_slice()).unwrap().r#type {
        Some(pw::address::Type::Workload(w)) => assert_eq!(w.addresses.len(), 80),
        other => panic!("{other:?}"),
    }
    assert_eq!(check_address(&half(0)), Ok(()));
    assert_eq!(
        check_address(&twice),
        Err(ShapeError::TooMany {
            field: "addresses".into(),
            limit: Limit::WorkloadAddresses
        })
    );

    // The same for a workload's `services` entry whose value appears twice.
    let entry = |ports_n: usize| {
        pw::Workload {
            services: services_map(&[ports_n]),
            ..Default::default()
        }
        .encode_to_vec()
    };
    // Field 22 entry bytes of both, joined into one entry: key once, value twice.
    let one = entry(600);
    let two = entry(600);
    let value_of = |bytes: &[u8]| -> Vec<u8> {
        // The encoded workload is just the one map entry (tag 22, length, entry).
        let entry = fields(bytes).next().unwrap().unwrap().1;
        let Value::Len(entry) = entry else { panic!() };
        fields(entry)
            .map(Result::unwrap)
            .find(|(n, _)| *n == 2)
            .map(|(_, v)| match v {
                Value::Len(b) => b.to_vec(),
                _ => panic!(),
            })
            .unwrap()
    };
    let mut merged_entry = Vec::new();
    let key = b"ns1/s0.ns1.svc.cluster.local";
    merged_entry.extend([0x0a, key.len() as u8]);
    merged_entry.extend(key);
    for v in [value_of(&one), value_of(&two)] {
        merged_entry.push(0x12);
        prost::encoding::encode_varint(v.len() as u64, &mut merged_entry);
        merged_entry.extend(v);
    }
    let mut w = Vec::new();
    prost::encoding::encode_key(22, prost::encoding::WireType::LengthDelimited, &mut w);
    prost::encoding::encode_varint(merged_entry.len() as u64, &mut w);
    w.extend(merged_entry);
    let decoded = pw::Workload::decode(w.as_slice()).unwrap();
    assert_eq!(decoded.services.values().next().unwrap().ports.len(), 1200);
    let mut address = Vec::new();
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut address);
    prost::encoding::encode_varint(w.len() as u64, &mut address);
    address.extend(w);
    assert_eq!(
        check_address(&address),
        Err(ShapeError::TooMany {
            field: "services[0].ports".into(),
            limit: Limit::PortsPerList
        })
    );
}

/// Unknown fields are skipped as `prost` skips them; malformed bytes are refused as a
/// decode error, before `prost` sees them.
#[test]
fn unknown_fields_skipped_malformed_refused() {
    let mut body = policy(vec![rule(vec![vec![ports_match(3)]])]).bytes;
    // Field 99, a string: unknown to both.
    prost::encoding::string::encode(99, &"x".repeat(10_000), &mut body);
    assert_eq!(check_authorization(&body), Ok(()));
    assert!(psec::Authorization::decode(body.as_slice()).is_ok());

    let mut truncated = policy(vec![rule(vec![empty_matches(3)])]).bytes;
    truncated.pop();
    let err = check_authorization(&truncated).unwrap_err();
    assert!(matches!(err, ShapeError::Malformed { .. }), "{err:?}");
    let (h, _) = handle(AUTHORIZATION_TYPE, POLICY, truncated);
    let message = h.reply.error_detail.unwrap().message;
    assert_eq!(
        message,
        "ns1/p: cannot decode istio.security.Authorization: a field runs past the end of its message"
    );
    // Inside a sub-message, the path says where.
    let mut body = psec::Authorization::default().encode_to_vec();
    // rules[0] = a Rule whose clauses[0] claims 5 bytes and has 1.
    body.extend([0x2a, 3, 0x0a, 5, 0x12]);
    assert_eq!(
        check_authorization(&body).unwrap_err().to_string(),
        "rules[0]: a field runs past the end of its message"
    );
}

/// A resource's name must be the name of what its body describes (the key the store
/// holds it by, and the name a removal uses).
#[test]
fn body_must_carry_the_resource_name() {
    let hidden_service = pw::Service {
        hostname: "hidden.ns1.svc.cluster.local".into(),
        ..base_service()
    };
    let other_uid = pw::Workload {
        uid: "c1//v1/Pod/ns1/b".into(),
        ..base_workload()
    };
    let no_uid = pw::Workload {
        uid: String::new(),
        cluster_id: "c1".into(),
        ..base_workload()
    };
    let p = |name: &str, namespace: &str| {
        psec::Authorization {
            name: name.into(),
            namespace: namespace.into(),
            scope: psec::Scope::Namespace as i32,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let address = |t: pw::address::Type| pw::Address { r#type: Some(t) }.encode_to_vec();
    /// (type, resource name, body, refused as (what, body's name)).
    type Case<'a> = (&'a str, &'a str, Vec<u8>, Option<(&'a str, &'a str)>);
    let cases: Vec<Case<'_>> = vec![
        (
            ADDRESS_TYPE,
            "ns1/announced.ns1.svc.cluster.local",
            address(pw::address::Type::Service(hidden_service.clone())),
            Some((
                "service namespace/hostname",
                "ns1/hidden.ns1.svc.cluster.local",
            )),
        ),
        (
            ADDRESS_TYPE,
            "ns1/hidden.ns1.svc.cluster.local",
            address(pw::address::Type::Service(hidden_service)),
            None,
        ),
        (
            ADDRESS_TYPE,
            UID,
            address(pw::address::Type::Workload(other_uid.clone())),
            Some(("workload uid", "c1//v1/Pod/ns1/b")),
        ),
        (
            ADDRESS_TYPE,
            "c1//v1/Pod/ns1/b",
            address(pw::address::Type::Workload(other_uid)),
            None,
        ),
        // Without a uid the body's name is the one the model derives.
        (
            ADDRESS_TYPE,
            "c1//v1/Pod/ns1/a",
            address(pw::address::Type::Workload(no_uid.clone())),
            None,
        ),
        (
            ADDRESS_TYPE,
            "ns1/a",
            address(pw::address::Type::Workload(no_uid)),
            Some(("workload uid", "c1//v1/Pod/ns1/a")),
        ),
        (
            AUTHORIZATION_TYPE,
            "ns1/a",
            p("b", "ns1"),
            Some(("policy namespace/name", "ns1/b")),
        ),
        (
            AUTHORIZATION_TYPE,
            "ns2/a",
            p("a", "ns1"),
            Some(("policy namespace/name", "ns1/a")),
        ),
        (AUTHORIZATION_TYPE, "ns1/a", p("a", "ns1"), None),
    ];
    for (type_url, name, body, refused) in cases {
        let (h, state) = handle(type_url, name, body);
        let held = state.workloads().count() + state.services().count() + state.policies().count();
        match refused {
            None => {
                assert!(h.rejected.is_empty(), "{name}: {:?}", h.rejected);
                assert_eq!(held, 1, "{name}");
            }
            Some((what, body)) => {
                assert_eq!(
                    h.rejected,
                    vec![(
                        name.to_string(),
                        Rejection::NameMismatch {
                            what,
                            body: body.into()
                        }
                    )]
                );
                assert_eq!(
                    h.reply.error_detail.unwrap().message,
                    format!("{name}: the body's {what} is {body:?}, not the resource name; refused so that a removal by name always removes what was announced")
                );
                assert_eq!(held, 0, "{name}");
            }
        }
    }
}
