use super::*;
use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_state::ProxyState;

fn base_workload() -> pw::Workload {
    pw::Workload {
        uid: "c1//v1/Pod/ns1/a".into(),
        name: "a".into(),
        namespace: "ns1".into(),
        addresses: vec![vec![10, 0, 0, 1].into()],
        ..Default::default()
    }
}

fn workload(p: pw::Workload) -> Result<Workload, ConvertError> {
    match address_from_proto(pw::Address {
        r#type: Some(pw::address::Type::Workload(p)),
    })? {
        AddressResource::Workload(w) => Ok(*w),
        other => panic!("not a workload: {other:?}"),
    }
}

fn service(p: pw::Service) -> Result<Service, ConvertError> {
    match address_from_proto(pw::Address {
        r#type: Some(pw::address::Type::Service(p)),
    })? {
        AddressResource::Service(s) => Ok(*s),
        other => panic!("not a service: {other:?}"),
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

fn gw_addr(bytes: Vec<u8>) -> pw::GatewayAddress {
    pw::GatewayAddress {
        destination: Some(pw::gateway_address::Destination::Address(
            pw::NetworkAddress {
                network: String::new(),
                address: bytes.into(),
                length: None,
            },
        )),
        hbone_mtls_port: 15008,
    }
}

#[test]
fn workload_defaults() {
    let w = workload(base_workload()).unwrap();
    // Empty stays empty in the model; the defaults apply where used.
    assert_eq!(w.trust_domain, "");
    assert_eq!(w.service_account, "");
    assert_eq!(w.cluster_id, "");
    assert_eq!(
        w.identity().to_string(),
        "spiffe://cluster.local/ns/ns1/sa/default"
    );
    assert_eq!(w.capacity, 1, "capacity unset ⇒ 1");
    assert_eq!(w.protocol, TunnelProtocol::Tcp);
    assert_eq!(w.workload_type, "deployment");
    assert_eq!(
        w.workload_ips,
        ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    // uid empty: the model fills it in with the cluster id default.
    let mut p = base_workload();
    p.uid.clear();
    assert_eq!(workload(p).unwrap().uid, "Kubernetes//v1/Pod/ns1/a");
    // An explicit capacity (even 0) is kept.
    let mut p = base_workload();
    p.capacity = Some(0);
    assert_eq!(workload(p).unwrap().capacity, 0);
    // Unknown enum numbers read as the default.
    let mut p = base_workload();
    p.status = 77;
    p.network_mode = 9;
    p.tunnel_protocol = 42;
    p.workload_type = 8;
    let w = workload(p).unwrap();
    assert_eq!(w.status, HealthStatus::Healthy);
    assert_eq!(w.network_mode, NetworkMode::Standard);
    assert_eq!(w.protocol, TunnelProtocol::Tcp);
    assert_eq!(w.workload_type, "deployment");
    // Gateway port 0 (unset) is the HBONE port; IPv6 addresses decode.
    let mut p = base_workload();
    let mut gw = gw_addr(vec![0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
    gw.hbone_mtls_port = 0;
    p.waypoint = Some(gw);
    let w = workload(p).unwrap();
    assert_eq!(w.waypoint.as_ref().unwrap().hbone_mtls_port, 15008);
}

#[test]
fn workload_rejects() {
    type Edit = fn(&mut pw::Workload);
    let cases: &[(&str, Edit, &str)] = &[
        ("short address", |p| p.addresses.push(vec![1, 2, 3].into()), "addresses[1]: address must be 4 or 16 bytes, got 3"),
        ("empty address", |p| p.addresses = vec![vec![].into()], "addresses[0]: address must be 4 or 16 bytes, got 0"),
        ("waypoint without destination", |p| p.waypoint = Some(pw::GatewayAddress { destination: None, hbone_mtls_port: 15008 }), "waypoint: gateway address has no destination"),
        ("gateway without destination", |p| p.network_gateway = Some(pw::GatewayAddress { destination: None, hbone_mtls_port: 15008 }), "networkGateway: gateway address has no destination"),
        ("gateway bad address", |p| p.network_gateway = Some(gw_addr(vec![1])), "networkGateway.address: address must be 4 or 16 bytes, got 1"),
        ("gateway port too large", |p| { let mut g = gw_addr(vec![1, 2, 3, 4]); g.hbone_mtls_port = 70000; p.waypoint = Some(g) }, "waypoint.hboneMtlsPort: port 70000 is larger than 65535"),
        ("service port too large", |p| { p.services.insert("ns1/s".into(), pw::PortList { ports: vec![pw::Port { service_port: 80, target_port: 65536, app_protocol: 0 }] }); }, "services[ns1/s].ports[0].targetPort: port 65536 is larger than 65535"),
        ("bad services key", |p| { p.services.insert("nokey".into(), pw::PortList::default()); }, "services: key \"nokey\" is not \"<namespace>/<hostname>\""),
        ("no name", |p| p.name.clear(), "name: must not be empty"),
        ("no namespace", |p| p.namespace.clear(), "namespace: must not be empty"),
        ("bad service account", |p| p.service_account = "a b".into(), "identity (trustDomain/namespace/serviceAccount): SPIFFE service account has ' ' at byte 1; a SPIFFE path segment allows only ASCII letters, digits, '.', '-' and '_' (no percent-encoding)"),
        ("app tunnel port", |p| p.application_tunnel = Some(pw::ApplicationTunnel { protocol: 1, port: 1 << 20 }), "applicationTunnel.port: port 1048576 is larger than 65535"),
    ];
    let mut failures = Vec::new();
    for (name, edit, want) in cases {
        let mut p = base_workload();
        edit(&mut p);
        match workload(p) {
            Ok(_) => failures.push(format!("{name}: accepted")),
            Err(e) if e.to_string() != *want => failures.push(format!(
                "{name}:\n   got {:?}\n  want {want:?}",
                e.to_string()
            )),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn empty_address_rejected() {
    let e = address_from_proto(pw::Address { r#type: None }).unwrap_err();
    assert_eq!(
        e.to_string(),
        "type: Address carries neither a workload nor a service"
    );
}

#[test]
fn host_network_not_indexed_by_ip() {
    let mut p = base_workload();
    p.network_mode = pw::NetworkMode::HostNetwork as i32;
    let w = workload(p).unwrap();
    let mut state = ProxyState::new();
    state.insert_workload(w).unwrap();
    assert!(state
        .workload_by_ip("", "10.0.0.1".parse().unwrap())
        .is_none());
    assert!(state.workload_by_uid("c1//v1/Pod/ns1/a").is_some());
}

#[test]
fn service_vips_and_defaults() {
    let mut p = base_service();
    let addr = |len: Option<u32>| pw::NetworkAddress {
        network: "n1".into(),
        address: vec![10, 96, 0, 0].into(),
        length: len,
    };
    p.addresses = vec![addr(None), addr(Some(32)), addr(Some(16))];
    p.visibility = 5;
    p.ip_families = 99;
    let s = service(p).unwrap();
    assert_eq!(s.vips[0].prefix_len, None, "absent ⇒ exact");
    assert_eq!(s.vips[1].prefix_len, None, "32 ⇒ exact");
    assert_eq!(s.vips[2].prefix_len, Some(16), "else CIDR");
    assert_eq!(s.vips[2].network, "n1");
    assert_eq!(
        s.visibility,
        ambit_state::Visibility::Public,
        "unknown visibility ⇒ PUBLIC"
    );
    assert_eq!(s.ip_families, IpFamilies::Automatic);
    let mut p = base_service();
    p.addresses = vec![pw::NetworkAddress {
        network: String::new(),
        address: vec![0xfd; 16].into(),
        length: Some(128),
    }];
    assert_eq!(service(p).unwrap().vips[0].prefix_len, None, "128 ⇒ exact");
}

#[test]
fn service_rejects() {
    type Edit = fn(&mut pw::Service);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "bad vip",
            |p| {
                p.addresses = vec![pw::NetworkAddress {
                    network: String::new(),
                    address: vec![1, 2].into(),
                    length: None,
                }]
            },
            "addresses[0]: address must be 4 or 16 bytes, got 2",
        ),
        (
            "bad prefix",
            |p| {
                p.addresses = vec![pw::NetworkAddress {
                    network: String::new(),
                    address: vec![1, 2, 3, 4].into(),
                    length: Some(33),
                }]
            },
            "addresses[0]: prefix length 33 is too long for 1.2.3.4",
        ),
        (
            "waypoint without destination",
            |p| p.waypoint = Some(pw::GatewayAddress::default()),
            "waypoint: gateway address has no destination",
        ),
        (
            "port too large",
            |p| {
                p.ports = vec![pw::Port {
                    service_port: 1 << 16,
                    target_port: 80,
                    app_protocol: 0,
                }]
            },
            "ports[0].servicePort: port 65536 is larger than 65535",
        ),
        (
            "no hostname",
            |p| p.hostname.clear(),
            "hostname: must be non-empty and contain no '/'",
        ),
    ];
    let mut failures = Vec::new();
    for (name, edit, want) in cases {
        let mut p = base_service();
        edit(&mut p);
        match service(p) {
            Ok(_) => failures.push(format!("{name}: accepted")),
            Err(e) if e.to_string() != *want => failures.push(format!(
                "{name}:\n   got {:?}\n  want {want:?}",
                e.to_string()
            )),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn authorization_drops_and_rejects() {
    use psec::string_match::MatchType;
    let m = psec::Match {
        principals: vec![
            psec::StringMatch { match_type: None },
            psec::StringMatch {
                match_type: Some(MatchType::Suffix("/sa/a".into())),
            },
            psec::StringMatch {
                match_type: Some(MatchType::Presence(())),
            },
        ],
        source_ips: vec![
            psec::Address {
                address: vec![10, 0, 0, 0].into(),
                length: 8,
            },
            psec::Address {
                address: vec![10, 0].into(),
                length: 8,
            },
            psec::Address {
                address: vec![10, 0, 0, 0].into(),
                length: 40,
            },
        ],
        destination_ports: vec![8080],
        ..Default::default()
    };
    let p = psec::Authorization {
        name: "p".into(),
        namespace: "ns1".into(),
        scope: psec::Scope::Namespace as i32,
        action: psec::Action::Deny as i32,
        rules: vec![psec::Rule {
            clauses: vec![psec::Clause {
                matches: vec![m.clone()],
            }],
        }],
        dry_run: true,
        extensions: vec![],
    };
    let a = authorization_from_proto(p.clone()).unwrap();
    assert_eq!(a.scope, PolicyScope::Namespace);
    assert_eq!(a.action, PolicyAction::Deny);
    assert!(a.dry_run);
    let got = &a.rules[0][0][0];
    assert_eq!(
        got.principals,
        [StringMatch::Suffix("/sa/a".into()), StringMatch::Presence],
        "a match without variant is dropped"
    );
    assert_eq!(
        got.source_ips,
        ["10.0.0.0/8".parse::<IpNet>().unwrap()],
        "unparsable addresses dropped"
    );
    assert_eq!(got.destination_ports, [8080]);

    let mut bad = p.clone();
    bad.rules[0].clauses[0].matches[0].not_destination_ports = vec![70000];
    assert_eq!(
        authorization_from_proto(bad).unwrap_err().to_string(),
        "rules[0].clauses[0].matches[0].notDestinationPorts[0]: port 70000 is larger than 65535"
    );
    let mut bad = p.clone();
    bad.namespace.clear();
    assert_eq!(
        authorization_from_proto(bad).unwrap_err().to_string(),
        "namespace: a Namespace-scoped policy needs a namespace"
    );
    let mut unknown = p;
    unknown.scope = 17;
    unknown.action = 3;
    let a = authorization_from_proto(unknown).unwrap();
    assert_eq!(
        (a.scope, a.action),
        (PolicyScope::Global, PolicyAction::Allow)
    );
}

const MESH: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.0.0.2", "fd00::2"]
  protocol: HBONE
  node: node1
  network: net1
  clusterId: cluster1
  canonicalName: client
  canonicalRevision: v1
  workloadName: client
  workloadType: pod
  hostname: client.example
  status: Unhealthy
  locality: {region: r1, zone: z1, subzone: s1}
  capacity: 2
  authorizationPolicies: ["default/allow-client"]
  nativeTunnel: true
  networkMode: HostNetwork
  waypoint: {destination: "/10.0.0.9", hboneMtlsPort: 15008}
  networkGateway: {destination: {namespace: gw, hostname: gw.example}, hbonePort: 15009}
  applicationTunnel: {protocol: PROXY, port: 15088}
  services:
    default/echo.default.svc.cluster.local: {80: 8080, 90: 0}
- name: server
  namespace: default
  workloadType: deployment
  trustDomain: example.org
  workloadIps: ["10.0.0.3"]
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10", "net1/10.97.0.0/16", "/fd00::/64"]
  ports: {80: 8080, 90: 0}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/echo"]
  waypoint: {destination: {namespace: default, hostname: wp.default}, hboneMtlsPort: 15009}
  loadBalancer: {routingPreferences: [Network, Region], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: IPv4
  canonical: true
  visibility: Namespace
- name: plain
  namespace: default
  hostname: plain.default
policies:
- name: allow-client
  namespace: default
  scope: WorkloadSelector
  action: Allow
  dryRun: true
  rules:
  - - - namespaces: [{exact: default}]
        principals: [{prefix: "cluster.local/"}, {Suffix: "/sa/client"}, {presence: {}}]
        notPrincipals: [{Exact: "x"}]
        serviceAccounts: [{namespace: default, serviceAccount: client}]
        notServiceAccounts: [{namespace: x, serviceAccount: y}]
        sourceIps: ["10.0.0.0/8", "10.1.2.3"]
        notSourceIps: ["fd00::/64"]
        destinationIps: ["10.0.0.3/32"]
        destinationPorts: [8080]
        notDestinationPorts: [9090]
        notNamespaces: [{suffix: "-test"}]
    - - destinationPorts: [1]
- {name: g, namespace: istio-system, scope: Global, action: Deny}
"#;

/// YAML → state → proto → (wire bytes) → state: equal.
#[test]
fn round_trip_through_the_wire() {
    use prost::Message;
    let cfg = ambit_state::parse_local_config("mesh.yaml", MESH).unwrap();
    let state = ProxyState::from_config(cfg).unwrap();
    for w in state.workloads() {
        let bytes = to_proto_address_workload(w).encode_to_vec();
        let back = address_from_proto(pw::Address::decode(&bytes[..]).unwrap()).unwrap();
        assert_eq!(back, AddressResource::Workload(Box::new((**w).clone())));
    }
    for s in state.services() {
        let bytes = to_proto_address_service(s).encode_to_vec();
        let back = address_from_proto(pw::Address::decode(&bytes[..]).unwrap()).unwrap();
        assert_eq!(back, AddressResource::Service(Box::new((**s).clone())));
    }
    for p in state.policies() {
        let bytes = to_proto_authorization(p).encode_to_vec();
        let back =
            authorization_from_proto(psec::Authorization::decode(&bytes[..]).unwrap()).unwrap();
        assert_eq!(&back, &**p);
    }
    assert_eq!(state.workloads().count(), 2);
    assert_eq!(state.services().count(), 2);
    assert_eq!(state.policies().count(), 2);
}

#[test]
fn a_sidecars_workload_is_kept_with_its_protocol() {
    // LEGACY_ISTIO_MTLS (a pod with a sidecar): read and sent on as it came, for the
    // waypoints that reach it with Istio mTLS (node proxies never pick it).
    let mut p = base_workload();
    p.tunnel_protocol = pw::TunnelProtocol::LegacyIstioMtls as i32;
    let w = workload(p).unwrap();
    assert_eq!(w.protocol, TunnelProtocol::LegacyIstioMtls);
    assert_eq!(
        to_proto_workload(&w).tunnel_protocol,
        pw::TunnelProtocol::LegacyIstioMtls as i32
    );
}
