//! Table tests of reading DestinationRules: Istio's documented examples (its circuit
//! breaking task and the reference's sticky-session rule, as users write them) into the
//! model with Istio's defaults, what is skipped, and each refusal with its line, column
//! and field.

use std::time::Duration;

use ambit_traffic_policy::{
    ClientIdentity, ClientTls, ConnectionPool, ConsistentHash, CookieKey, HashAlgorithm, HashKey,
    LoadBalancer, OutlierDetection, PortPolicy, TrafficPolicy,
};
use http::header::HeaderName;

use super::*;

fn parse(text: &str) -> Parsed {
    parse_documents("dr.yaml", text, &ParseOptions::default())
}

fn rule(text: &str) -> WaypointDestinationRule {
    let p = parse(text);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert_eq!(p.destination_rules.len(), 1, "{text}");
    p.destination_rules.into_iter().next().unwrap().value
}

const HEAD: &str = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: httpbin, namespace: shop}\nspec:\n  host: httpbin\n";

/// A rule of [`HEAD`] with `trafficPolicy` written as the flow map `policy` (line 6).
fn with_policy(policy: &str) -> String {
    format!("{HEAD}  trafficPolicy: {policy}\n")
}

fn policy(text: &str) -> PortPolicy {
    let r = rule(&with_policy(text));
    assert!(r.policy.ports.is_empty());
    r.policy.default
}

fn refusal(text: &str) -> String {
    let p = parse(text);
    assert!(p.destination_rules.is_empty(), "{:?}", p.destination_rules);
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    assert!(p.errors[0].object.as_ref().unwrap().is_destination_rule());
    p.errors[0].to_string()
}

#[test]
fn istio_circuit_breaking_task() {
    // The rule of Istio's "Circuit Breaking" task, as written there.
    let text = "\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: httpbin
spec:
  host: httpbin
  trafficPolicy:
    connectionPool:
      tcp:
        maxConnections: 1
      http:
        http1MaxPendingRequests: 1
        maxRequestsPerConnection: 1
    outlierDetection:
      consecutive5xxErrors: 1
      interval: 1s
      baseEjectionTime: 3m
      maxEjectionPercent: 100
";
    let r = rule(text);
    assert_eq!(
        (r.namespace.as_str(), r.name.as_str()),
        ("default", "httpbin")
    );
    assert_eq!(r.host, "httpbin");
    assert!(r.targets.is_empty() && r.export_to.is_empty());
    assert_eq!(
        r.policy,
        TrafficPolicy {
            default: PortPolicy {
                load_balancer: LoadBalancer::LeastRequest,
                connection_pool: ConnectionPool {
                    max_connections: 1,
                    max_pending_requests: 1,
                    ..ConnectionPool::default()
                },
                outlier: Some(OutlierDetection {
                    consecutive_5xx: 1,
                    interval: Duration::from_secs(1),
                    base_ejection_time: Duration::from_secs(180),
                    max_ejection_percent: 100,
                    ..OutlierDetection::default()
                }),
                tls: None,
            },
            ports: vec![],
        }
    );
}

#[test]
fn load_balancers() {
    let table: &[(&str, LoadBalancer)] = &[
        ("{}", LoadBalancer::LeastRequest),
        ("{loadBalancer: {simple: ROUND_ROBIN}}", LoadBalancer::RoundRobin),
        ("{loadBalancer: {simple: RANDOM}}", LoadBalancer::Random),
        ("{loadBalancer: {simple: LEAST_CONN}}", LoadBalancer::LeastRequest),
        ("{loadBalancer: {simple: UNSPECIFIED}}", LoadBalancer::LeastRequest),
        // Skipped settings: WDS ranks localities; warmup is tuning.
        (
            "{loadBalancer: {simple: RANDOM, localityLbSetting: {enabled: true}, warmupDurationSecs: 10s}}",
            LoadBalancer::Random,
        ),
        (
            // The reference's sticky-session example.
            "{loadBalancer: {consistentHash: {httpCookie: {name: user, ttl: 0s}}}}",
            LoadBalancer::ConsistentHash(ConsistentHash {
                key: HashKey::Cookie(CookieKey {
                    name: "user".into(),
                    path: None,
                    ttl: Some(Duration::ZERO),
                }),
                algorithm: HashAlgorithm::RingHash { minimum_ring_size: 1024 },
            }),
        ),
        (
            "{loadBalancer: {consistentHash: {httpCookie: {name: s, path: /app}}}}",
            LoadBalancer::ConsistentHash(ConsistentHash {
                key: HashKey::Cookie(CookieKey {
                    name: "s".into(),
                    path: Some("/app".into()),
                    ttl: None,
                }),
                algorithm: HashAlgorithm::RingHash { minimum_ring_size: 1024 },
            }),
        ),
        (
            "{loadBalancer: {consistentHash: {httpHeaderName: X-User, ringHash: {minimumRingSize: 4096}}}}",
            LoadBalancer::ConsistentHash(ConsistentHash {
                key: HashKey::Header(HeaderName::from_static("x-user")),
                algorithm: HashAlgorithm::RingHash { minimum_ring_size: 4096 },
            }),
        ),
        (
            "{loadBalancer: {consistentHash: {useSourceIp: true, minimumRingSize: 2048}}}",
            LoadBalancer::ConsistentHash(ConsistentHash {
                key: HashKey::SourceIp,
                algorithm: HashAlgorithm::RingHash { minimum_ring_size: 2048 },
            }),
        ),
        (
            "{loadBalancer: {consistentHash: {httpQueryParameterName: user, maglev: {}}}}",
            LoadBalancer::ConsistentHash(ConsistentHash {
                key: HashKey::QueryParameter("user".into()),
                algorithm: HashAlgorithm::Maglev { table_size: 65537 },
            }),
        ),
        (
            "{loadBalancer: {consistentHash: {httpQueryParameterName: user, maglev: {tableSize: 131}}}}",
            LoadBalancer::ConsistentHash(ConsistentHash {
                key: HashKey::QueryParameter("user".into()),
                algorithm: HashAlgorithm::Maglev { table_size: 131 },
            }),
        ),
    ];
    for (text, expected) in table {
        assert_eq!(&policy(text).load_balancer, expected, "{text}");
    }
}

#[test]
fn pools_outliers_ports_and_defaults() {
    let p = policy(
        "{connectionPool: {tcp: {maxConnections: 0, connectTimeout: 250ms, tcpKeepalive: {time: 7200s}}, http: {http2MaxRequests: 1000, maxRetries: 3, idleTimeout: 1h}}}",
    );
    assert_eq!(
        p.connection_pool,
        ConnectionPool {
            max_requests: 1000,
            max_retries: 3,
            connect_timeout: Duration::from_millis(250),
            ..ConnectionPool::default()
        },
        "0 keeps the default, as in Istio"
    );
    // The reference's example: 7 gateway errors by the deprecated field, 5 m, 15 m.
    let p =
        policy("{outlierDetection: {consecutiveErrors: 7, interval: 5m, baseEjectionTime: 15m}}");
    assert_eq!(
        p.outlier,
        Some(OutlierDetection {
            consecutive_gateway: 7,
            interval: Duration::from_secs(300),
            base_ejection_time: Duration::from_secs(900),
            ..OutlierDetection::default()
        })
    );
    let p = policy("{outlierDetection: {consecutive5xxErrors: 0, consecutiveGatewayErrors: 2, splitExternalLocalOriginErrors: true, consecutiveLocalOriginFailures: 3, minHealthPercent: 50}}");
    let o = p.outlier.unwrap();
    assert_eq!(
        (
            o.consecutive_5xx,
            o.consecutive_gateway,
            o.split_local_origin,
            o.consecutive_local_origin,
            o.min_health_percent
        ),
        (0, 2, true, 3, 50)
    );
    // Port-level settings replace the top level on their port.
    let r = rule(&with_policy(
        "{loadBalancer: {simple: RANDOM}, portLevelSettings: [{port: {number: 8080}, loadBalancer: {simple: ROUND_ROBIN}}]}",
    ));
    assert_eq!(
        r.policy.for_port(8080).load_balancer,
        LoadBalancer::RoundRobin
    );
    assert_eq!(r.policy.for_port(80).load_balancer, LoadBalancer::Random);
    // TLS modes that change nothing for mesh traffic.
    for tls in ["{mode: ISTIO_MUTUAL}", "{mode: DISABLE}", "{}"] {
        assert_eq!(policy(&format!("{{tls: {tls}}}")).tls, None);
    }
    // TLS origination, as Istio's egress tasks write it.
    let p = policy("{tls: {mode: SIMPLE}}");
    assert_eq!(
        p.tls,
        Some(ClientTls {
            client_identity: None,
            sni: None,
            subject_alt_names: vec![],
            ca_certificates: None,
            insecure_skip_verify: false,
        })
    );
    let p = policy("{tls: {mode: MUTUAL, clientCertificate: /etc/certs/client.pem, privateKey: /etc/certs/key.pem, caCertificates: /etc/certs/ca.pem, sni: api.example.com, subjectAltNames: [api.example.com, backup.example.com], insecureSkipVerify: false}}");
    assert_eq!(
        p.tls,
        Some(ClientTls {
            client_identity: Some(ClientIdentity {
                certificate: "/etc/certs/client.pem".into(),
                private_key: "/etc/certs/key.pem".into(),
            }),
            sni: Some("api.example.com".into()),
            subject_alt_names: vec!["api.example.com".into(), "backup.example.com".into()],
            ca_certificates: Some("/etc/certs/ca.pem".into()),
            insecure_skip_verify: false,
        })
    );
    // Subsets are read and left (no HTTPRoute can name one); exportTo and targetRefs kept.
    let r = rule(&format!(
        "{HEAD}  exportTo: [\".\", other]\n  targetRefs: [{{kind: Service, group: \"\", name: httpbin}}]\n  subsets: [{{name: v1, labels: {{version: v1}}}}]\n"
    ));
    assert_eq!(r.export_to, [".", "other"]);
    assert_eq!(
        r.targets,
        [PolicyTarget::Service {
            namespace: "shop".into(),
            name: "httpbin".into()
        }]
    );
}

#[test]
fn a_rule_for_selected_sidecars_is_skipped() {
    let p = parse(&format!(
        "{HEAD}  workloadSelector: {{matchLabels: {{app: a}}}}\n"
    ));
    assert!(p.errors.is_empty() && p.destination_rules.is_empty());
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(p.skipped[0].value.reason, SkipReason::RuleWorkloadSelector);
}

#[test]
fn refusals_name_the_field() {
    let table: &[(&str, &str)] = &[
        ("{loadBalancer: {simple: FASTEST}}", "dr.yaml:6:42: spec.trafficPolicy.loadBalancer.simple: \"FASTEST\" is not a load balancer"),
        ("{loadBalancer: {simple: PASSTHROUGH}}", "spec.trafficPolicy.loadBalancer.simple: PASSTHROUGH is not applied"),
        ("{loadBalancer: {simple: RANDOM, consistentHash: {useSourceIp: true}}}", "spec.trafficPolicy.loadBalancer.consistentHash: set either simple or consistentHash"),
        ("{loadBalancer: {consistentHash: {}}}", "spec.trafficPolicy.loadBalancer.consistentHash: names no hash key"),
        ("{loadBalancer: {consistentHash: {useSourceIp: true, httpHeaderName: x}}}", "set one hash key, not both httpHeaderName and useSourceIp"),
        ("{loadBalancer: {consistentHash: {httpHeaderName: \"bad header\"}}}", "spec.trafficPolicy.loadBalancer.consistentHash.httpHeaderName: \"bad header\" is not a header name"),
        ("{loadBalancer: {consistentHash: {httpCookie: {name: \"a;b\"}}}}", "httpCookie.name: \"a;b\" is not a cookie name"),
        ("{loadBalancer: {consistentHash: {httpCookie: {name: a, ttl: soon}}}}", "httpCookie.ttl: \"soon\" is not a duration"),
        ("{loadBalancer: {consistentHash: {httpCookie: {name: a, path: app}}}}", "httpCookie.path: a cookie's path starts with /"),
        ("{loadBalancer: {consistentHash: {httpCookie: {name: a, attributes: [{name: SameSite, value: Strict}]}}}}", "httpCookie.attributes: not applied"),
        ("{loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 65536}}}}", "maglev.tableSize: 65536 is not a prime below 5000011"),
        ("{loadBalancer: {consistentHash: {useSourceIp: true, maglev: {}, ringHash: {}}}}", "consistentHash.maglev: set either ringHash or maglev"),
        ("{loadBalancer: {consistentHash: {useSourceIp: true, maglev: {}, minimumRingSize: 5}}}", "consistentHash.minimumRingSize: the deprecated minimumRingSize"),
        ("{loadBalancer: {consistentHash: {useSourceIp: true, ringHash: {minimumRingSize: -1}}}}", "ringHash.minimumRingSize: must not be negative"),
        ("{connectionPool: {tcp: {maxConnections: -1}}}", "spec.trafficPolicy.connectionPool.tcp.maxConnections: must be 0 (the default) to 2147483647"),
        ("{connectionPool: {tcp: {connectTimeout: 0s}}}", "connectionPool.tcp.connectTimeout: must be at least 1ms"),
        ("{connectionPool: {http: {http2MaxRequests: 3000000000}}}", "connectionPool.http.http2MaxRequests: must be 0"),
        ("{connectionPool: {http: {maxPendingRequests: 1}}}", "unknown field `maxPendingRequests`"),
        ("{outlierDetection: {consecutive5xxErrors: -2}}", "outlierDetection.consecutive5xxErrors: must be 0 to 2147483647"),
        ("{outlierDetection: {maxEjectionPercent: 101}}", "outlierDetection.maxEjectionPercent: a percentage is 0 to 100"),
        ("{outlierDetection: {interval: 500us}}", "outlierDetection.interval: must be at least 1ms"),
        ("{outlierDetection: {consecutive5xx: 3}}", "unknown field `consecutive5xx`"),
        ("{tls: {mode: MUTUAL, privateKey: /k.pem}}", "spec.trafficPolicy.tls.clientCertificate: required with mode MUTUAL"),
        ("{tls: {mode: MUTUAL, clientCertificate: /c.pem}}", "spec.trafficPolicy.tls.privateKey: required with mode MUTUAL"),
        ("{tls: {mode: SIMPLE, clientCertificate: /c.pem}}", "spec.trafficPolicy.tls.mode: SIMPLE presents no client certificate"),
        ("{tls: {mode: SIMPLE, credentialName: api-cert}}", "spec.trafficPolicy.tls.credentialName: not read by the waypoint"),
        ("{tls: {mode: SIMPLE, caCrl: /crl.pem}}", "spec.trafficPolicy.tls.caCrl: not applied by the waypoint"),
        ("{tls: {mode: SIMPLE, caCertificates: certs/ca.pem}}", "spec.trafficPolicy.tls.caCertificates: \"certs/ca.pem\" is not an absolute path"),
        ("{tls: {mode: SIMPLE, sni: \"a b\"}}", "spec.trafficPolicy.tls.sni: \"a b\" is not a server name"),
        ("{tls: {mode: ISTIO_MUTUAL, caCertificates: /a.pem}}", "tls.caCertificates: must be empty with mode ISTIO_MUTUAL"),
        ("{tls: {mode: STRICT}}", "tls.mode: \"STRICT\" is not a TLS mode"),
        ("{tunnel: {targetHost: a, targetPort: 1}}", "spec.trafficPolicy.tunnel: not applied"),
        ("{proxyProtocol: {}}", "spec.trafficPolicy.proxyProtocol: not applied"),
        ("{portLevelSettings: [{loadBalancer: {simple: RANDOM}}]}", "spec.trafficPolicy.portLevelSettings[0].port: missing"),
        ("{portLevelSettings: [{port: {number: 0}}]}", "portLevelSettings[0].port.number: a port number is 1 to 65535"),
        ("{portLevelSettings: [{port: {number: 80}}, {port: {number: 80}}]}", "portLevelSettings[1].port.number: port 80 has settings already"),
        ("{portLevelSettings: [{port: {number: 80}, tls: {mode: MUTUAL}}]}", "portLevelSettings[0].tls.clientCertificate: required with mode MUTUAL"),
    ];
    for (text, expected) in table {
        let got = refusal(&with_policy(text));
        assert!(
            got.contains(expected),
            "{text}:\n  got {got}\n  not {expected}"
        );
    }
    let head_refusals: &[(&str, &str)] = &[
        ("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a, namespace: shop}\nspec: {}\n", "spec.host: missing"),
        ("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a, namespace: shop}\nspec: {host: \"*\"}\n", "spec.host: \"*\" alone is not a host"),
        ("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a, namespace: shop}\nspec: {host: \"a..b\"}\n", "spec.host: \"a..b\" is not a host name"),
        ("apiVersion: networking.istio.io/v2\nkind: DestinationRule\nmetadata: {name: a, namespace: shop}\nspec: {host: a}\n", "apiVersion: DestinationRule has no version \"v2\""),
        (&format!("{HEAD}  exportTo: [\"Other NS\"]\n"), "spec.exportTo[0]:"),
        (&format!("{HEAD}  targetRefs: [{{kind: Gateway, group: gateway.networking.k8s.io, name: w}}]\n"), "spec.targetRefs[0].kind: a DestinationRule targets a Service or a ServiceEntry"),
    ];
    for (text, expected) in head_refusals {
        let got = refusal(text);
        assert!(
            got.contains(expected),
            "{text}:\n  got {got}\n  not {expected}"
        );
    }
}

#[test]
fn wildcard_and_qualified_hosts_are_read() {
    for host in [
        "*.example.com",
        "httpbin.shop.svc.cluster.local",
        "api.example.com",
    ] {
        let r = rule(&format!(
            "apiVersion: networking.istio.io/v1beta1\nkind: DestinationRule\nmetadata: {{name: a, namespace: shop}}\nspec: {{host: \"{host}\"}}\n"
        ));
        assert_eq!(r.host, host);
        assert_eq!(r.policy, TrafficPolicy::default());
    }
}
