//! The generated types against wire bytes built by hand, tag = field number << 3 | wire
//! type (0 varint, 2 length-delimited), for the fields that matter. A wrong field number
//! or type in a `.proto` file makes one of these fail.

use prost::Message;

use crate::istio::security::{self, string_match::MatchType};
use crate::istio::workload::{self, address, gateway_address};
use crate::{envoy::service::discovery::v3 as ds, google::rpc};

/// A length-delimited field: tag bytes, then the length, then the payload.
fn len_field(tag: &[u8], payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 128, "one-byte lengths only");
    let mut out = tag.to_vec();
    out.push(payload.len() as u8);
    out.extend_from_slice(payload);
    out
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn workload_fields_decode_from_hand_built_bytes() {
    // Port { service_port = 80 (1, varint), target_port = 8080 (2, varint) }
    let port = vec![0x08, 80, 0x10, 0x90, 0x3f];
    let port_list = len_field(&[0x0a], &port); // PortList.ports = 1
    let entry = cat(&[
        len_field(&[0x0a], b"ns/web.ns.svc"),
        len_field(&[0x12], &port_list),
    ]);
    // GatewayAddress { address = 2 { network = 1, address = 2 }, hbone_mtls_port = 3 }
    let net_addr = cat(&[
        len_field(&[0x0a], b"n1"),
        len_field(&[0x12], &[10, 9, 9, 9]),
    ]);
    let gateway = cat(&[len_field(&[0x12], &net_addr), vec![0x18, 0x98, 0x75]]);
    let bytes = cat(&[
        len_field(&[0xa2, 0x01], b"c1//v1/Pod/ns/a"), // uid = 20
        len_field(&[0x0a], b"a"),                     // name = 1
        len_field(&[0x12], b"ns"),                    // namespace = 2
        len_field(&[0x1a], &[10, 0, 0, 1]),           // addresses = 3
        len_field(
            &[0x1a],
            &[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        len_field(&[0xaa, 0x01], b"a.example"), // hostname = 21
        len_field(&[0x22], b"n1"),              // network = 4
        vec![0x28, 0x01],                       // tunnel_protocol = 5: HBONE
        len_field(&[0x32], b"td"),              // trust_domain = 6
        len_field(&[0x3a], b"sa"),              // service_account = 7
        len_field(&[0x42], &gateway),           // waypoint = 8
        len_field(&[0x9a, 0x01], &gateway),     // network_gateway = 19
        len_field(&[0x4a], b"node1"),           // node = 9
        len_field(&[0x52], b"canon"),           // canonical_name = 10
        len_field(&[0x5a], b"v1"),              // canonical_revision = 11
        vec![0x60, 0x02],                       // workload_type = 12: POD
        len_field(&[0x6a], b"wl"),              // workload_name = 13
        vec![0x70, 0x01],                       // native_tunnel = 14
        len_field(&[0xba, 0x01], &[0x08, 0x01, 0x10, 0x9f, 0x75]), // application_tunnel = 23
        len_field(&[0xb2, 0x01], &entry),       // services = 22
        len_field(&[0x82, 0x01], b"ns/allow"),  // authorization_policies = 16
        vec![0x88, 0x01, 0x01],                 // status = 17: UNHEALTHY
        len_field(&[0x92, 0x01], b"c1"),        // cluster_id = 18
        len_field(
            &[0xc2, 0x01],
            &cat(&[len_field(&[0x0a], b"r"), len_field(&[0x12], b"z")]),
        ), // locality = 24
        vec![0xc8, 0x01, 0x01],                 // network_mode = 25: HOST_NETWORK
        len_field(&[0xda, 0x01], &[0x08, 0x03]), // capacity = 27: UInt32Value{3}
    ]);
    let w = workload::Workload::decode(bytes.as_slice()).unwrap();
    assert_eq!(w.uid, "c1//v1/Pod/ns/a");
    assert_eq!((w.name.as_str(), w.namespace.as_str()), ("a", "ns"));
    assert_eq!(w.addresses.len(), 2);
    assert_eq!(&w.addresses[0][..], &[10, 0, 0, 1]);
    assert_eq!(w.addresses[1].len(), 16);
    assert_eq!(w.hostname, "a.example");
    assert_eq!(w.network, "n1");
    assert_eq!(w.tunnel_protocol(), workload::TunnelProtocol::Hbone);
    assert_eq!(
        (w.trust_domain.as_str(), w.service_account.as_str()),
        ("td", "sa")
    );
    let wp = w.waypoint.as_ref().unwrap();
    assert_eq!(wp.hbone_mtls_port, 15000);
    let Some(gateway_address::Destination::Address(a)) = &wp.destination else {
        panic!("waypoint destination: {:?}", wp.destination);
    };
    assert_eq!(
        (a.network.as_str(), &a.address[..]),
        ("n1", &[10, 9, 9, 9][..])
    );
    assert_eq!(a.length, None);
    assert!(w.network_gateway.is_some());
    assert_eq!(w.node, "node1");
    assert_eq!(
        (w.canonical_name.as_str(), w.canonical_revision.as_str()),
        ("canon", "v1")
    );
    assert_eq!(w.workload_type(), workload::WorkloadType::Pod);
    assert_eq!(w.workload_name, "wl");
    assert!(w.native_tunnel);
    let tunnel = w.application_tunnel.as_ref().unwrap();
    assert_eq!(
        tunnel.protocol(),
        workload::application_tunnel::Protocol::Proxy
    );
    assert_eq!(tunnel.port, 15007);
    let ports = &w.services["ns/web.ns.svc"].ports;
    assert_eq!((ports[0].service_port, ports[0].target_port), (80, 8080));
    assert_eq!(w.authorization_policies, vec!["ns/allow".to_string()]);
    assert_eq!(w.status(), workload::WorkloadStatus::Unhealthy);
    assert_eq!(w.cluster_id, "c1");
    let loc = w.locality.as_ref().unwrap();
    assert_eq!((loc.region.as_str(), loc.zone.as_str()), ("r", "z"));
    assert_eq!(w.network_mode(), workload::NetworkMode::HostNetwork);
    assert_eq!(w.capacity, Some(3));
}

#[test]
fn service_fields_decode_from_hand_built_bytes() {
    // NetworkAddress with length = 3 (optional, varint) 24: a CIDR VIP.
    let vip = cat(&[len_field(&[0x12], &[10, 96, 0, 0]), vec![0x18, 24]]);
    let port = vec![0x08, 80, 0x10, 0, 0x18, 0x01]; // named port, HTTP11
    let hostname_gw = cat(&[len_field(&[0x0a], b"ns"), len_field(&[0x12], b"wp.ns.svc")]);
    let waypoint = cat(&[len_field(&[0x0a], &hostname_gw), vec![0x18, 0x98, 0x75]]);
    let lb = vec![0x0a, 0x02, 0x02, 0x04, 0x10, 0x02, 0x18, 0x01]; // [ZONE, NODE], FAILOVER, ALLOW_ALL
    let weighted = cat(&[len_field(&[0x0a], &waypoint), vec![0x10, 7]]);
    let bytes = cat(&[
        len_field(&[0x0a], b"web"),
        len_field(&[0x12], b"ns"),
        len_field(&[0x1a], b"web.ns.svc"),
        len_field(&[0x22], &vip),
        len_field(&[0x2a], &port),
        len_field(&[0x32], b"spiffe://td/ns/ns/sa/web"),
        len_field(&[0x3a], &waypoint),
        len_field(&[0x42], &lb),
        vec![0x48, 0x03], // ip_families = 9: DUAL
        vec![0x58, 0x01], // canonical = 11
        vec![0x60, 0x01], // ingress_use_waypoint = 12
        len_field(&[0x6a], &weighted),
        vec![0x70, 0x01], // visibility = 14: NAMESPACE
    ]);
    let s = workload::Service::decode(bytes.as_slice()).unwrap();
    assert_eq!((s.name.as_str(), s.namespace.as_str()), ("web", "ns"));
    assert_eq!(s.hostname, "web.ns.svc");
    assert_eq!(&s.addresses[0].address[..], &[10, 96, 0, 0]);
    assert_eq!(s.addresses[0].length, Some(24));
    assert_eq!(s.ports[0].service_port, 80);
    assert_eq!(s.ports[0].target_port, 0);
    assert_eq!(s.ports[0].app_protocol(), workload::AppProtocol::Http11);
    assert_eq!(
        s.subject_alt_names,
        vec!["spiffe://td/ns/ns/sa/web".to_string()]
    );
    let wp = s.waypoint.as_ref().unwrap();
    let Some(gateway_address::Destination::Hostname(h)) = &wp.destination else {
        panic!("waypoint destination: {:?}", wp.destination);
    };
    assert_eq!(
        (h.namespace.as_str(), h.hostname.as_str()),
        ("ns", "wp.ns.svc")
    );
    let lb = s.load_balancing.as_ref().unwrap();
    use workload::load_balancing::{HealthPolicy, Mode, Scope};
    assert_eq!(
        lb.routing_preference().collect::<Vec<_>>(),
        vec![Scope::Zone, Scope::Node]
    );
    assert_eq!(lb.mode(), Mode::Failover);
    assert_eq!(lb.health_policy(), HealthPolicy::AllowAll);
    assert_eq!(s.ip_families(), workload::IpFamilies::Dual);
    assert!(s.canonical && s.ingress_use_waypoint);
    assert_eq!(s.weighted_waypoints[0].weight, 7);
    assert_eq!(s.visibility(), workload::service::Visibility::Namespace);

    // Address.service = 2 wraps it.
    let wrapped = len_field(&[0x12], &bytes[..9]);
    let a = workload::Address::decode(wrapped.as_slice()).unwrap();
    assert!(matches!(a.r#type, Some(address::Type::Service(_))));
}

#[test]
fn authorization_fields_decode_from_hand_built_bytes() {
    let exact = len_field(&[0x0a], b"ns1"); // StringMatch.exact = 1
    let prefix = len_field(&[0x12], b"spiffe"); // prefix = 2
    let suffix = len_field(&[0x1a], b"/sa/x"); // suffix = 3
    let presence = vec![0x22, 0x00]; // presence = 4: Empty
    let sa = cat(&[len_field(&[0x0a], b"ns"), len_field(&[0x12], b"sa")]);
    let cidr = cat(&[len_field(&[0x0a], &[10, 0, 0, 0]), vec![0x10, 8]]);
    let m = cat(&[
        len_field(&[0x0a], &exact),            // namespaces = 1
        len_field(&[0x12], &prefix),           // not_namespaces = 2
        len_field(&[0x1a], &suffix),           // principals = 3
        len_field(&[0x22], &presence),         // not_principals = 4
        len_field(&[0x2a], &cidr),             // source_ips = 5
        len_field(&[0x32], &cidr),             // not_source_ips = 6
        len_field(&[0x3a], &cidr),             // destination_ips = 7
        len_field(&[0x42], &cidr),             // not_destination_ips = 8
        len_field(&[0x4a], &[80, 0x90, 0x3f]), // destination_ports = 9 (packed)
        vec![0x50, 22],                        // not_destination_ports = 10 (unpacked also legal)
        len_field(&[0x5a], &sa),               // service_accounts = 11
        len_field(&[0x62], &sa),               // not_service_accounts = 12
    ]);
    let clause = len_field(&[0x12], &m); // Clause.matches = 2
    let rule = len_field(&[0x0a], &clause); // Rule.clauses = 1
    let bytes = cat(&[
        len_field(&[0x0a], b"deny-x"),
        len_field(&[0x12], b"ns1"),
        vec![0x18, 0x02], // scope = 3: WORKLOAD_SELECTOR
        vec![0x20, 0x01], // action = 4: DENY
        len_field(&[0x2a], &rule),
        vec![0x30, 0x01], // dry_run = 6
    ]);
    let p = security::Authorization::decode(bytes.as_slice()).unwrap();
    assert_eq!((p.name.as_str(), p.namespace.as_str()), ("deny-x", "ns1"));
    assert_eq!(p.scope(), security::Scope::WorkloadSelector);
    assert_eq!(p.action(), security::Action::Deny);
    assert!(p.dry_run);
    let m = &p.rules[0].clauses[0].matches[0];
    assert_eq!(
        m.namespaces[0].match_type,
        Some(MatchType::Exact("ns1".into()))
    );
    assert_eq!(
        m.not_namespaces[0].match_type,
        Some(MatchType::Prefix("spiffe".into()))
    );
    assert_eq!(
        m.principals[0].match_type,
        Some(MatchType::Suffix("/sa/x".into()))
    );
    assert_eq!(
        m.not_principals[0].match_type,
        Some(MatchType::Presence(()))
    );
    for list in [
        &m.source_ips,
        &m.not_source_ips,
        &m.destination_ips,
        &m.not_destination_ips,
    ] {
        assert_eq!(
            (&list[0].address[..], list[0].length),
            (&[10, 0, 0, 0][..], 8)
        );
    }
    assert_eq!(m.destination_ports, vec![80, 8080]);
    assert_eq!(m.not_destination_ports, vec![22]);
    assert_eq!(m.service_accounts[0].service_account, "sa");
    assert_eq!(m.not_service_accounts[0].namespace, "ns");
}

#[test]
fn delta_request_encodes_the_envoy_field_numbers() {
    let req = ds::DeltaDiscoveryRequest {
        type_url: "t".into(),
        response_nonce: "n".into(),
        error_detail: Some(rpc::Status {
            code: 0,
            message: "m".into(),
            details: vec![],
        }),
        initial_resource_versions: [("a".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let bytes = req.encode_to_vec();
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(has(&[0x12, 1, b't']), "type_url = 2: {bytes:02x?}");
    assert!(has(&[0x32, 1, b'n']), "response_nonce = 6: {bytes:02x?}");
    assert!(
        has(&[0x3a, 3, 0x12, 1, b'm']),
        "error_detail = 7 {{ message = 2 }}: {bytes:02x?}"
    );
    // initial_resource_versions = 5: entry { key = 1, value = 2 }
    assert!(
        has(&[0x2a, 6, 0x0a, 1, b'a', 0x12, 1, b'v']),
        "{bytes:02x?}"
    );
}

#[test]
fn delta_response_decodes_from_hand_built_bytes() {
    let any = cat(&[
        len_field(&[0x0a], b"type.googleapis.com/x"),
        len_field(&[0x12], b"\x01"),
    ]);
    let resource = cat(&[
        len_field(&[0x1a], b"ns/a"), // name = 3
        len_field(&[0x0a], b"v7"),   // version = 1
        len_field(&[0x12], &any),    // resource = 2
    ]);
    let bytes = cat(&[
        len_field(&[0x0a], b"sys"),     // system_version_info = 1
        len_field(&[0x12], &resource),  // resources = 2
        len_field(&[0x22], b"t"),       // type_url = 4
        len_field(&[0x2a], b"nonce-1"), // nonce = 5
        len_field(&[0x32], b"ns/gone"), // removed_resources = 6
    ]);
    let r = ds::DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap();
    assert_eq!(r.system_version_info, "sys");
    assert_eq!(r.type_url, "t");
    assert_eq!(r.nonce, "nonce-1");
    assert_eq!(r.removed_resources, vec!["ns/gone".to_string()]);
    assert_eq!(
        (
            r.resources[0].name.as_str(),
            r.resources[0].version.as_str()
        ),
        ("ns/a", "v7")
    );
    assert_eq!(
        r.resources[0].resource.as_ref().unwrap().type_url,
        "type.googleapis.com/x"
    );
}

#[test]
fn certificate_request_uses_istio_field_numbers() {
    let req = crate::IstioCertificateRequest {
        csr: "c".into(),
        validity_duration: 86400,
        metadata: Some(prost_types::Struct::default()),
    };
    let bytes = req.encode_to_vec();
    // csr = 1, validity_duration = 3 (varint 86400 = 80 a3 05), metadata = 4 (empty).
    assert_eq!(
        bytes,
        vec![0x0a, 1, b'c', 0x18, 0x80, 0xa3, 0x05, 0x22, 0x00]
    );
    let resp =
        crate::IstioCertificateResponse::decode(&[0x0a, 1, b'x', 0x0a, 1, b'y'][..]).unwrap();
    assert_eq!(resp.cert_chain, vec!["x".to_string(), "y".to_string()]);
}

/// ambit's own waypoint resources: their field numbers are the wire contract between
/// `ambit control` and ambit's waypoints of other versions, so they are pinned here byte by
/// byte. Each carries a document as written; a policy of the earlier form (translated
/// rules, fields 3 to 7) decodes with no document, which the waypoint refuses.
#[test]
fn waypoint_document_fields_decode_from_hand_built_bytes() {
    use crate::ambit::waypoint::v1 as wp;
    let policy = cat(&[
        len_field(&[0x42], b"AuthorizationPolicy"), // kind = 8
        len_field(&[0x12], b"ns"),                  // namespace = 2
        len_field(&[0x0a], b"p"),                   // name = 1
        len_field(&[0x4a], b"kind: x"),             // manifest = 9
    ]);
    let p = wp::AuthorizationPolicy::decode(policy.as_slice()).unwrap();
    assert_eq!(
        (
            p.kind.as_str(),
            p.namespace.as_str(),
            p.name.as_str(),
            p.manifest.as_str()
        ),
        ("AuthorizationPolicy", "ns", "p", "kind: x")
    );
    let earlier = cat(&[
        len_field(&[0x0a], b"p"),        // name = 1
        len_field(&[0x12], b"ns"),       // namespace = 2
        vec![0x18, 0x02],                // action = 3 (reserved now)
        len_field(&[0x3a], b"[[[{}]]]"), // rules_json = 7 (reserved now)
    ]);
    let p = wp::AuthorizationPolicy::decode(earlier.as_slice()).unwrap();
    assert!(p.kind.is_empty() && p.manifest.is_empty(), "{p:?}");
    let document = cat(&[
        len_field(&[0x0a], b"HTTPRoute"), // kind = 1
        len_field(&[0x12], b"ns"),        // namespace = 2
        len_field(&[0x1a], b"r"),         // name = 3
        len_field(&[0x22], b"kind: y"),   // manifest = 4
    ]);
    let r = wp::Route::decode(document.as_slice()).unwrap();
    assert_eq!(
        (
            r.kind.as_str(),
            r.namespace.as_str(),
            r.name.as_str(),
            r.manifest.as_str()
        ),
        ("HTTPRoute", "ns", "r", "kind: y")
    );
    let a = wp::RequestAuthentication::decode(document.as_slice()).unwrap();
    assert_eq!((a.name.as_str(), a.manifest.as_str()), ("r", "kind: y"));
    assert_eq!(
        crate::WAYPOINT_POLICY_TYPE,
        "type.googleapis.com/ambit.waypoint.v1.AuthorizationPolicy"
    );
    assert_eq!(
        crate::WAYPOINT_ROUTE_TYPE,
        "type.googleapis.com/ambit.waypoint.v1.Route"
    );
    assert_eq!(
        crate::WAYPOINT_AUTHN_TYPE,
        "type.googleapis.com/ambit.waypoint.v1.RequestAuthentication"
    );
    assert_eq!(
        crate::WAYPOINT_DESTINATION_RULE_TYPE,
        "type.googleapis.com/ambit.waypoint.v1.DestinationRule"
    );
}
