//! The mesh model (`ambit_state`) as xDS resources: `istio.workload.Address` for workloads
//! (named by uid) and services (named `namespace/hostname`), `istio.security.Authorization`
//! for policies (named `namespace/name`), and the waypoints' documents read from manifests
//! as their `ambit.waypoint.v1` resources (named `<kind>/<namespace>/<name>`). The field
//! mapping is `ambit_xds`'s (and `ambit_waypoint_xds`'s), the one conversion between the
//! model and the protos that the node proxy and the waypoint decode with too.
//!
//! Resource bytes are deterministic: a workload's `services` map is a `HashMap` in the
//! generated code, whose iteration order changes between runs, so its entries are encoded
//! by hand in key order. Equal resources therefore have equal bytes, and the version (a
//! SHA-256 of the bytes) changes only when the content does, across restarts too.

use ambit_proto::istio::workload as pw;
use ambit_proto::{Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::{Authorization, Service, Workload};
use ambit_waypoint_xds::{DocumentKind, DocumentOp, Documents};
use ambit_xds::ResourceType;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;

/// `Address.workload`, `Address.service` and `Workload.services` field numbers.
const ADDRESS_WORKLOAD_FIELD: u32 = 1;
const ADDRESS_SERVICE_FIELD: u32 = 2;
const WORKLOAD_SERVICES_FIELD: u32 = 22;

/// One entry of the `services` map as it goes on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct ServicesEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<pw::PortList>,
}

/// Appends a length-delimited field.
fn put_message_bytes(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// The workload as an Address resource named by its uid.
pub fn workload_resource(w: &Workload) -> Resource {
    let mut proto = ambit_xds::to_proto_workload(w);
    let mut services: Vec<(String, pw::PortList)> = proto.services.drain().collect();
    services.sort_by(|a, b| a.0.cmp(&b.0));
    let mut body = proto.encode_to_vec();
    for (key, ports) in services {
        let entry = ServicesEntry {
            key,
            value: Some(ports),
        };
        put_message_bytes(WORKLOAD_SERVICES_FIELD, &entry.encode_to_vec(), &mut body);
    }
    let mut address = Vec::with_capacity(body.len() + 8);
    put_message_bytes(ADDRESS_WORKLOAD_FIELD, &body, &mut address);
    resource(w.uid.to_string(), ADDRESS_TYPE, address)
}

/// The service as an Address resource named `namespace/hostname`.
pub fn service_resource(s: &Service) -> Resource {
    let mut address = Vec::new();
    put_message_bytes(
        ADDRESS_SERVICE_FIELD,
        &ambit_xds::to_proto_service(s).encode_to_vec(),
        &mut address,
    );
    resource(
        format!("{}/{}", s.namespace, s.hostname),
        ADDRESS_TYPE,
        address,
    )
}

/// The policy as an Authorization resource named `namespace/name`.
pub fn policy_resource(p: &Authorization) -> Resource {
    resource(
        p.key(),
        AUTHORIZATION_TYPE,
        ambit_xds::to_proto_authorization(p).encode_to_vec(),
    )
}

/// A waypoint's document (an AuthorizationPolicy, HTTPRoute, GRPCRoute or
/// RequestAuthentication) as its `ambit.waypoint.v1` resource named
/// `<kind>/<namespace>/<name>`, carrying `manifest` (its document as written), checked as a
/// waypoint whose root namespace is `root_namespace` will read it: its size, its decoding,
/// and that it decodes to this very object. The error says why a waypoint would refuse it.
pub fn waypoint_resource<K: DocumentKind>(
    value: &K::Value,
    manifest: &str,
    root_namespace: &str,
) -> Result<Resource, String> {
    let name = ambit_waypoint_xds::resource_name::<K>(value);
    let body = ambit_waypoint_xds::to_proto::<K>(value, manifest).encode_to_vec();
    let ty = Documents::<K>::with_root_namespace(root_namespace);
    ty.measure(&name, &body).map_err(|e| e.to_string())?;
    let decoded = ty.decode(&body).map_err(|e| e.to_string())?;
    match decoded.op {
        DocumentOp::Put(back) if *back == *value && decoded.key == name => {}
        _ => return Err("its wire form does not decode to the same document".into()),
    }
    Ok(resource(name, K::TYPE_URL, body))
}

fn resource(name: String, type_url: &str, value: Vec<u8>) -> Resource {
    Resource {
        name,
        version: version_of(&value),
        resource: Some(prost_types::Any {
            type_url: type_url.to_string(),
            value,
        }),
        ..Default::default()
    }
}

/// The version of a resource: the first 16 hex digits of the SHA-256 of its bytes.
pub fn version_of(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_proto::istio::security as sec;

    const MESH: &str = r#"
workloads:
- uid: c1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.0.0.2", "fd00::2"]
  protocol: HBONE
  node: node1
  workloadType: pod
  locality: {region: r1}
  waypoint: {destination: "/10.0.0.9", hboneMtlsPort: 15008}
  applicationTunnel: {protocol: PROXY, port: 15088}
  authorizationPolicies: ["default/allow"]
  services:
    default/a.default.svc.cluster.local: {80: 8080}
    default/b.default.svc.cluster.local: {90: 9090, 91: 0}
    default/c.default.svc.cluster.local: {1: 2}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10", "net1/10.96.0.0/16"]
  ports: {80: 8080}
  loadBalancer: {routingPreferences: [Network, Region], mode: Failover}
  visibility: Namespace
policies:
- name: allow
  namespace: default
  scope: WorkloadSelector
  action: Deny
  rules:
  - - - principals: [{prefix: "cluster.local/"}, {presence: {}}]
        sourceIps: ["10.0.0.0/8"]
        destinationPorts: [8080]
"#;

    fn mesh() -> ambit_state::LocalConfig {
        let mut cfg = ambit_state::parse_local_config("t.yaml", MESH).unwrap();
        for w in &mut cfg.workloads {
            w.normalize().unwrap();
        }
        cfg
    }

    fn decode_address(r: &Resource) -> pw::Address {
        let any = r.resource.as_ref().unwrap();
        assert_eq!(any.type_url, ADDRESS_TYPE);
        pw::Address::decode(any.value.as_slice()).unwrap()
    }

    #[test]
    fn a_workload_decodes_as_written_and_its_bytes_are_stable() {
        let cfg = mesh();
        let w = &cfg.workloads[0];
        let r = workload_resource(w);
        assert_eq!(r.name, "c1//v1/Pod/default/client");
        let Some(pw::address::Type::Workload(got)) = decode_address(&r).r#type else {
            panic!("not a workload");
        };
        assert_eq!(got.addresses.len(), 2);
        assert_eq!(got.addresses[0].as_ref(), [10, 0, 0, 2]);
        assert_eq!(got.tunnel_protocol, pw::TunnelProtocol::Hbone as i32);
        assert_eq!(got.workload_type, pw::WorkloadType::Pod as i32);
        assert_eq!(got.node, "node1");
        assert_eq!(got.capacity, Some(1));
        assert_eq!(got.services.len(), 3);
        let b = &got.services["default/b.default.svc.cluster.local"];
        assert_eq!(b.ports.len(), 2);
        assert_eq!(
            (b.ports[0].service_port, b.ports[0].target_port),
            (90, 9090)
        );
        assert_eq!(got.application_tunnel.unwrap().port, 15088);
        // The map decoded equals the map the proto would hold.
        let mut expected = ambit_xds::to_proto_workload(w);
        expected.services = got.services.clone();
        assert_eq!(got, expected);
        // Same content, same bytes, same version; different content, new version.
        assert_eq!(workload_resource(w), r);
        let mut w2 = w.clone();
        w2.services
            .get_mut("default/c.default.svc.cluster.local")
            .unwrap()
            .insert(1, 3);
        assert_ne!(workload_resource(&w2).version, r.version);
        assert_eq!(r.version.len(), 16);
    }

    /// A policy with L7 attributes, served to a node proxy over the wire (which has no
    /// field for them), decides every connection as the same policy loaded from the file:
    /// an ALLOW rule that uses one never matches; a DENY is enforced without them.
    #[test]
    fn a_policy_with_l7_attributes_decides_as_the_local_file_does() {
        use ambit_state::{authorize_observed, RbacContext, Unobserved};
        let policies = [
            ("Allow", "[[[{namespaces: [{exact: default}]}, {paths: [\"/admin\"]}]]]"),
            ("Allow", "[[[{namespaces: [{exact: default}], methods: [GET]}]]]"),
            ("Allow", "[[[{hosts: [a.example]}]], [[{namespaces: [{exact: other}]}]]]"),
            ("Allow", "[[[{namespaces: [{exact: default}]}], [{when: [{key: source.ip, values: [\"10.0.0.2\"]}]}]]]"),
            ("Deny", "[[[{paths: [\"/admin\"]}]]]"),
            ("Deny", "[[[{namespaces: [{exact: default}]}], [{hosts: [a.example]}]]]"),
            ("Deny", "[[[{namespaces: [{exact: other}], methods: [GET]}]]]"),
            ("Deny", "[[[{namespaces: [{exact: other}]}, {notMethods: [GET], destinationPorts: [9]}]]]"),
            ("Deny", "[[[{}, {headers: {x: y}}]]]"),
        ];
        let ctx = |ns: &str, port: u16| RbacContext {
            source_identity: Some(
                ambit_identity::SpiffeId::parse(&format!("spiffe://cluster.local/ns/{ns}/sa/c"))
                    .unwrap(),
            ),
            source_ip: "10.0.0.2".parse().unwrap(),
            destination: format!("10.0.0.3:{port}").parse().unwrap(),
        };
        let contexts = [ctx("default", 80), ctx("other", 80), ctx("other", 9)];
        let mut failures = Vec::new();
        for (action, rules) in policies {
            let yaml = format!(
                "policies:\n- {{name: p, namespace: default, scope: Global, action: {action}, rules: {rules}}}\n"
            );
            let local = ambit_state::parse_local_config("t", &yaml)
                .unwrap()
                .policies
                .remove(0);
            let any = policy_resource(&local).resource.unwrap();
            let served = ambit_xds::authorization_from_proto(
                sec::Authorization::decode(any.value.as_slice()).unwrap(),
            )
            .unwrap();
            for c in &contexts {
                let want = authorize_observed(&[&local], c, &Unobserved);
                let got = authorize_observed(&[&served], c, &Unobserved);
                if got != want {
                    failures.push(format!(
                        "{action} {rules} for {}: served {got:?}, local {want:?}",
                        c.source_identity.as_ref().unwrap()
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    #[test]
    fn services_and_policies_are_named_as_istiod_names_them() {
        let cfg = mesh();
        let s = service_resource(&cfg.services[0]);
        assert_eq!(s.name, "default/echo.default.svc.cluster.local");
        let Some(pw::address::Type::Service(got)) = decode_address(&s).r#type else {
            panic!("not a service");
        };
        assert_eq!(got.addresses.len(), 2);
        assert_eq!(got.addresses[1].network, "net1");
        assert_eq!(got.addresses[1].length, Some(16));
        assert_eq!(got.addresses[0].length, None);
        assert_eq!(got.visibility, pw::service::Visibility::Namespace as i32);
        let lb = got.load_balancing.unwrap();
        assert_eq!(
            lb.routing_preference,
            [
                pw::load_balancing::Scope::Network as i32,
                pw::load_balancing::Scope::Region as i32
            ]
        );
        assert_eq!(lb.mode, pw::load_balancing::Mode::Failover as i32);

        let p = policy_resource(&cfg.policies[0]);
        assert_eq!(p.name, "default/allow");
        let any = p.resource.unwrap();
        assert_eq!(any.type_url, AUTHORIZATION_TYPE);
        let got = sec::Authorization::decode(any.value.as_slice()).unwrap();
        assert_eq!(got.action, sec::Action::Deny as i32);
        assert_eq!(got.scope, sec::Scope::WorkloadSelector as i32);
        let m = &got.rules[0].clauses[0].matches[0];
        assert_eq!(m.principals.len(), 2);
        assert_eq!(
            m.principals[1].match_type,
            Some(sec::string_match::MatchType::Presence(()))
        );
        assert_eq!(m.source_ips[0].length, 8);
        assert_eq!(m.source_ips[0].address.as_ref(), [10, 0, 0, 0]);
        assert_eq!(m.destination_ports, [8080]);
    }
}
