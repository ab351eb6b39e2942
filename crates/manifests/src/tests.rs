//! Table tests of reading manifests: every field of an AuthorizationPolicy (and its
//! not-form) into the model field it feeds, targets and their defaults, the actions and
//! dry run, what is skipped, and refusals with their exact line, column and field.

use ambit_state::{
    Condition, IpBlock, L7Attributes, PathMatch, PolicyAction, PolicyScope, RbacMatch,
    ServiceAccountMatch, StringMatch,
};

use super::*;

fn parse(text: &str) -> Parsed {
    parse_documents("p.yaml", text, &ParseOptions::default())
}

/// The one policy `text` holds (no refusal, nothing skipped).
fn policy(text: &str) -> WaypointPolicy {
    let p = parse(text);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert_eq!(p.policies.len(), 1, "{text}");
    p.policies.into_iter().next().unwrap().value
}

/// The one refusal of `text`, as shown.
fn refusal(text: &str) -> String {
    let p = parse(text);
    assert!(p.policies.is_empty(), "{:?}", p.policies);
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    p.errors[0].to_string()
}

const HEAD: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\nspec:\n  targetRefs: [{kind: Service, group: \"\", name: reviews}]\n";

/// The policy with one rule of one source (`from`) or one operation (`to`).
fn with_rule(section: &str, entry: &str, body: &str) -> String {
    format!("{HEAD}  rules:\n  - {section}:\n    - {entry}: {body}\n")
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}

fn l7(a: L7Attributes) -> RbacMatch {
    RbacMatch {
        l7: Some(Box::new(a)),
        ..RbacMatch::default()
    }
}

fn ip(s: &str) -> ipnet::IpNet {
    IpBlock::parse(s).unwrap().net()
}

fn sa(ns: &str, name: &str) -> ServiceAccountMatch {
    ServiceAccountMatch {
        namespace: ns.into(),
        service_account: name.into(),
    }
}

#[test]
fn every_source_field_and_its_not_form() {
    let block = |s: &str| IpBlock::parse(s).unwrap();
    let table: Vec<(&str, RbacMatch)> = vec![
        (
            "{principals: [cluster.local/ns/a/sa/b, \"*/sa/c\"]}",
            RbacMatch {
                principals: vec![
                    exact("cluster.local/ns/a/sa/b"),
                    StringMatch::Suffix("/sa/c".into()),
                ],
                ..RbacMatch::default()
            },
        ),
        (
            "{notPrincipals: [\"*\"]}",
            RbacMatch {
                not_principals: vec![StringMatch::Presence],
                ..RbacMatch::default()
            },
        ),
        (
            "{requestPrincipals: [iss/sub]}",
            l7(L7Attributes {
                request_principals: Some(vec![exact("iss/sub")]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{notRequestPrincipals: [\"iss/*\"]}",
            l7(L7Attributes {
                not_request_principals: Some(vec![StringMatch::Prefix("iss/".into())]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{namespaces: [prod-*]}",
            RbacMatch {
                namespaces: vec![StringMatch::Prefix("prod-".into())],
                ..RbacMatch::default()
            },
        ),
        (
            "{notNamespaces: [test]}",
            RbacMatch {
                not_namespaces: vec![exact("test")],
                ..RbacMatch::default()
            },
        ),
        // `ns/sa`, or `sa` in the policy's namespace.
        (
            "{serviceAccounts: [web/frontend, checkout]}",
            RbacMatch {
                service_accounts: vec![sa("web", "frontend"), sa("shop", "checkout")],
                ..RbacMatch::default()
            },
        ),
        (
            "{notServiceAccounts: [default]}",
            RbacMatch {
                not_service_accounts: vec![sa("shop", "default")],
                ..RbacMatch::default()
            },
        ),
        (
            "{ipBlocks: [10.0.0.0/8, 10.1.2.3, \"fd00::/64\"]}",
            RbacMatch {
                source_ips: vec![ip("10.0.0.0/8"), ip("10.1.2.3"), ip("fd00::/64")],
                ..RbacMatch::default()
            },
        ),
        (
            "{notIpBlocks: [192.168.0.1]}",
            RbacMatch {
                not_source_ips: vec![ip("192.168.0.1")],
                ..RbacMatch::default()
            },
        ),
        (
            "{remoteIpBlocks: [203.0.113.0/24]}",
            l7(L7Attributes {
                remote_ips: Some(vec![block("203.0.113.0/24")]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{notRemoteIpBlocks: [203.0.113.7]}",
            l7(L7Attributes {
                not_remote_ips: Some(vec![block("203.0.113.7")]),
                ..L7Attributes::default()
            }),
        ),
        // Fields together make one match object; an empty list sets nothing.
        (
            "{principals: [a/b], ipBlocks: [10.0.0.1], remoteIpBlocks: [], requestPrincipals: [\"*\"]}",
            RbacMatch {
                principals: vec![exact("a/b")],
                source_ips: vec![ip("10.0.0.1")],
                l7: Some(Box::new(L7Attributes {
                    request_principals: Some(vec![StringMatch::Presence]),
                    ..L7Attributes::default()
                })),
                ..RbacMatch::default()
            },
        ),
    ];
    for (source, want) in table {
        let p = policy(&with_rule("from", "source", source));
        assert_eq!(p.authorization.rules, vec![vec![vec![want]]], "{source}");
    }
}

#[test]
fn every_operation_field_and_its_not_form() {
    let path = |s: &str| PathMatch::parse(s).unwrap();
    let attrs = |a: L7Attributes| l7(a);
    let table: Vec<(&str, RbacMatch)> = vec![
        (
            "{hosts: [example.com, \"*.example.com\"]}",
            attrs(L7Attributes {
                hosts: Some(vec![
                    exact("example.com"),
                    StringMatch::Suffix(".example.com".into()),
                ]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{notHosts: [\"api.*\"]}",
            attrs(L7Attributes {
                not_hosts: Some(vec![StringMatch::Prefix("api.".into())]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{ports: [\"8080\", \"9090\"]}",
            RbacMatch {
                destination_ports: vec![8080, 9090],
                ..RbacMatch::default()
            },
        ),
        (
            "{notPorts: [\"15021\"]}",
            RbacMatch {
                not_destination_ports: vec![15021],
                ..RbacMatch::default()
            },
        ),
        (
            "{methods: [GET, \"P*\"]}",
            attrs(L7Attributes {
                methods: Some(vec![exact("GET"), StringMatch::Prefix("P".into())]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{notMethods: [DELETE]}",
            attrs(L7Attributes {
                not_methods: Some(vec![exact("DELETE")]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{paths: [/api/*, \"/users/{*}/info\"]}",
            attrs(L7Attributes {
                paths: Some(vec![path("/api/*"), path("/users/{*}/info")]),
                ..L7Attributes::default()
            }),
        ),
        (
            "{notPaths: [\"/admin/{**}\"]}",
            attrs(L7Attributes {
                not_paths: Some(vec![path("/admin/{**}")]),
                ..L7Attributes::default()
            }),
        ),
    ];
    for (operation, want) in table {
        let p = policy(&with_rule("to", "operation", operation));
        assert_eq!(p.authorization.rules, vec![vec![vec![want]]], "{operation}");
    }
}

#[test]
fn a_rule_is_its_from_to_and_when_clauses_in_that_order() {
    let when = "[{key: \"request.headers[x-a]\", values: [b]}, {key: destination.port, notValues: [\"81\"]}]";
    let conditions: Vec<Condition> = yaml_serde::from_str(when).unwrap();
    let text = format!(
        "{HEAD}  rules:\n  - from: [{{source: {{namespaces: [a]}}}}, {{source: {{namespaces: [b]}}}}]\n    to: [{{operation: {{methods: [GET]}}}}]\n    when: {when}\n  - to: [{{operation: {{ports: [\"80\"]}}}}]\n  - {{}}\n  - when: []\n"
    );
    let ns = |n: &str| RbacMatch {
        namespaces: vec![exact(n)],
        ..RbacMatch::default()
    };
    let get = l7(L7Attributes {
        methods: Some(vec![exact("GET")]),
        ..L7Attributes::default()
    });
    let conds = l7(L7Attributes {
        when: Some(conditions),
        ..L7Attributes::default()
    });
    let port = RbacMatch {
        destination_ports: vec![80],
        ..RbacMatch::default()
    };
    assert_eq!(
        policy(&text).authorization.rules,
        vec![
            vec![vec![ns("a"), ns("b")], vec![get], vec![conds]],
            vec![vec![port]],
            // `{}` matches every request; so does a rule whose `when` is empty.
            vec![],
            vec![],
        ]
    );
    // No rules: an ALLOW policy that matches nothing.
    assert_eq!(
        policy(HEAD).authorization.rules,
        Vec::<ambit_state::Rule>::new()
    );
}

#[test]
fn targets_and_their_defaults() {
    let opts = ParseOptions::default();
    let svc = |name: &str| PolicyTarget::Service {
        namespace: "shop".into(),
        name: name.into(),
    };
    let table: Vec<(&str, &str, Vec<PolicyTarget>)> = vec![
        (
            "shop",
            "targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]",
            vec![PolicyTarget::Gateway {
                namespace: "shop".into(),
                name: "waypoint".into(),
            }],
        ),
        // The core group is "" (or left out, or "core").
        (
            "shop",
            "targetRefs: [{kind: Service, name: a}, {kind: Service, group: \"\", name: b}, {kind: Service, group: core, name: c}]",
            vec![svc("a"), svc("b"), svc("c")],
        ),
        (
            "shop",
            "targetRefs: [{kind: ServiceEntry, group: networking.istio.io, name: egress}]",
            vec![PolicyTarget::ServiceEntry {
                namespace: "shop".into(),
                name: "egress".into(),
            }],
        ),
        // The deprecated singular form.
        ("shop", "targetRef: {kind: Service, name: a}", vec![svc("a")]),
        (
            "istio-system",
            "targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]",
            vec![PolicyTarget::GatewayClass {
                name: "istio-waypoint".into(),
            }],
        ),
    ];
    for (ns, refs, want) in table {
        let text = format!(
            "apiVersion: security.istio.io/v1beta1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: {ns}}}\nspec:\n  {refs}\n"
        );
        let p = parse_documents("p.yaml", &text, &opts);
        assert!(p.errors.is_empty(), "{refs}: {:?}", p.errors);
        assert_eq!(p.policies[0].value.targets, want, "{refs}");
    }

    // Without metadata.namespace: the default namespace, for the targets and for a bare
    // service account alike; the root namespace is a parameter.
    let opts = ParseOptions {
        root_namespace: "mesh-root".into(),
        default_namespace: "team".into(),
    };
    let text = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p}\nspec:\n  targetRefs: [{kind: Service, name: a}]\n  rules: [{from: [{source: {serviceAccounts: [web]}}]}]\n";
    let p = &parse_documents("p.yaml", text, &opts).policies[0].value;
    assert_eq!(p.authorization.namespace, "team");
    assert_eq!(
        p.targets,
        vec![PolicyTarget::Service {
            namespace: "team".into(),
            name: "a".into()
        }]
    );
    assert_eq!(
        p.authorization.rules[0][0][0].service_accounts,
        vec![sa("team", "web")]
    );
    let gc = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: mesh-root}\nspec:\n  targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]\n";
    assert_eq!(parse_documents("p.yaml", gc, &opts).policies.len(), 1);
    let e = &parse_documents("p.yaml", &gc.replace("mesh-root", "istio-system"), &opts).errors;
    assert_eq!(
        e[0].to_string(),
        "p.yaml:5:23: spec.targetRefs[0].kind: a GatewayClass target is honoured only in the root namespace (\"mesh-root\"), and this policy is in \"istio-system\""
    );
}

#[test]
fn targets_refused() {
    let doc = |spec: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: shop}}\nspec:\n{spec}")
    };
    let table = [
        (
            "  targetRefs:\n  - {kind: HTTPRoute, group: gateway.networking.k8s.io, name: r}\n",
            "p.yaml:6:12: spec.targetRefs[0].kind: a waypoint's policy cannot target a \"HTTPRoute\"; the kinds are Gateway and GatewayClass (gateway.networking.k8s.io), Service (core group, \"\") and ServiceEntry (networking.istio.io)",
        ),
        (
            "  targetRefs:\n  - {kind: Gateway, name: waypoint}\n",
            "p.yaml:6:12: spec.targetRefs[0].kind: Gateway is in group \"gateway.networking.k8s.io\", not \"\"",
        ),
        (
            "  targetRefs:\n  - {kind: Service, group: networking.istio.io, name: a}\n",
            "p.yaml:6:28: spec.targetRefs[0].group: Service is in group \"\", not \"networking.istio.io\"",
        ),
        (
            "  targetRefs:\n  - {kind: Service, name: a, namespace: other}\n",
            "p.yaml:6:41: spec.targetRefs[0].namespace: must not be set: a policy attaches only to targets in its own namespace (Istio refuses cross-namespace targetRefs)",
        ),
        (
            "  targetRefs:\n  - {kind: Service, name: Reviews.v1}\n",
            "p.yaml:6:27: spec.targetRefs[0].name: \"Reviews.v1\" is not a Kubernetes name: 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit",
        ),
        (
            "  targetRefs:\n  - {kind: Gateway, group: gateway.networking.k8s.io, name: -waypoint}\n",
            "p.yaml:6:61: spec.targetRefs[0].name: \"-waypoint\" is not a Kubernetes name: 1-253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
        ),
        (
            "  targetRefs:\n  - {kind: Service, name: \"\"}\n",
            "p.yaml:6:27: spec.targetRefs[0].name: must not be empty",
        ),
        (
            "  targetRef: {kind: Service, name: a}\n  targetRefs: [{kind: Service, name: b}]\n",
            "p.yaml:5:14: spec.targetRef: set either targetRef or targetRefs, not both",
        ),
        (
            "  selector: {matchLabels: {app: a}}\n  targetRefs: [{kind: Service, name: b}]\n",
            "p.yaml:5:13: spec.selector: set either selector (a workload's policy) or targetRefs (a waypoint's), not both",
        ),
        (
            "  targetRefs: [{kind: Service}]\n",
            "p.yaml:5:16: spec.targetRefs[0]: missing field `name`",
        ),
    ];
    for (spec, want) in table {
        assert_eq!(refusal(&doc(spec)), want, "{spec}");
    }
}

#[test]
fn actions_and_dry_run() {
    let doc = |annotations: &str, spec: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: p\n  namespace: shop\n{annotations}spec:\n  targetRefs: [{{kind: Service, name: a}}]\n{spec}")
    };
    let table: Vec<(&str, WaypointAction, PolicyAction)> = vec![
        ("", WaypointAction::Allow, PolicyAction::Allow),
        ("  action: ALLOW\n", WaypointAction::Allow, PolicyAction::Allow),
        (
            "  action: DENY\n  rules: [{}]\n",
            WaypointAction::Deny,
            PolicyAction::Deny,
        ),
        // AUDIT and CUSTOM hold Deny in the state's field (fail closed for a reader that
        // looks only there).
        (
            "  action: AUDIT\n",
            WaypointAction::Audit,
            PolicyAction::Deny,
        ),
        (
            "  action: CUSTOM\n  provider: {name: ext-authz}\n  rules: [{to: [{operation: {paths: [/admin]}}]}]\n",
            WaypointAction::Custom {
                provider: "ext-authz".into(),
            },
            PolicyAction::Deny,
        ),
    ];
    for (spec, action, state_action) in table {
        let p = policy(&doc("", spec));
        assert_eq!(p.action, action, "{spec}");
        assert_eq!(p.authorization.action, state_action, "{spec}");
        assert_eq!(p.authorization.scope, PolicyScope::WorkloadSelector);
        assert!(!p.authorization.dry_run);
    }

    let dry = |value: &str| {
        doc(
            &format!("  annotations:\n    istio.io/dry-run: {value}\n"),
            "",
        )
    };
    assert!(policy(&dry("\"true\"")).authorization.dry_run);
    assert!(!policy(&dry("\"false\"")).authorization.dry_run);
    assert_eq!(
        refusal(&dry("\"yes\"")),
        "p.yaml:7:23: metadata.annotations[\"istio.io/dry-run\"]: \"yes\" is neither \"true\" nor \"false\""
    );
    // Annotations are strings (the API server refuses a YAML boolean there too).
    assert_eq!(
        refusal(&dry("true")),
        "p.yaml:7:23: metadata.annotations.istio.io/dry-run: invalid type: boolean `true`, expected a string (a string: quote numbers and booleans)"
    );

    let refused = [
        (
            "  action: CUSTOM\n  rules: [{}]\n",
            "p.yaml:8:11: spec.action: a CUSTOM policy names its provider (spec.provider.name: an extensionProviders entry of MeshConfig)",
        ),
        (
            "  action: CUSTOM\n  provider: {name: \"\"}\n  rules: [{}]\n",
            "p.yaml:9:20: spec.provider.name: a CUSTOM policy names its provider (spec.provider.name: an extensionProviders entry of MeshConfig)",
        ),
        (
            "  action: CUSTOM\n  provider: {name: x}\n",
            "p.yaml:8:11: spec.action: a CUSTOM policy without rules never matches; add an empty rule ({}) to match every request",
        ),
        (
            "  action: DENY\n  rules: []\n",
            "p.yaml:8:11: spec.action: a DENY policy without rules never matches; add an empty rule ({}) to match every request",
        ),
        (
            "  action: ALLOW\n  provider: {name: x}\n",
            "p.yaml:9:13: spec.provider: only a CUSTOM policy names a provider",
        ),
        (
            "  action: allow\n",
            "p.yaml:8:11: spec.action: unknown action \"allow\"; one of ALLOW, DENY, AUDIT, CUSTOM",
        ),
        (
            "  action: CUSTOM\n  provider: {name: x}\n  rules: [{from: [{source: {principals: [a/b]}}]}]\n",
            "p.yaml:10:41: spec.rules[0].from[0].source.principals: is not supported with action CUSTOM (Istio refuses it)",
        ),
        (
            "  action: CUSTOM\n  provider: {name: x}\n  rules: [{when: [{key: \"request.auth.claims[iss]\", values: [a]}]}]\n",
            "p.yaml:10:25: spec.rules[0].when[0].key: request.auth.claims[iss] is not supported with action CUSTOM (Istio refuses it)",
        ),
    ];
    for (spec, want) in refused {
        assert_eq!(refusal(&doc("", spec)), want, "{spec}");
    }
}

#[test]
fn workload_policies_and_other_kinds_are_skipped() {
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: by-selector, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  rules: [{to: [{operation: {methods: [GET]}}]}]
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: whole-namespace, namespace: shop}
spec: {}
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: r, namespace: shop}
spec: {whatever: [1, 2]}
---
# only a comment
";
    let p = parse(text);
    assert!(p.policies.is_empty() && p.errors.is_empty(), "{p:?}");
    let shown: Vec<(String, usize, usize)> = p
        .skipped
        .iter()
        .map(|s| (s.value.to_string(), s.origin.document, s.origin.line))
        .collect();
    assert_eq!(
        shown,
        vec![
            ("security.istio.io/v1 AuthorizationPolicy shop/by-selector: selects workloads (spec.selector): enforced by their ztunnel, not by a waypoint".to_string(), 0, 1),
            ("security.istio.io/v1beta1 AuthorizationPolicy shop/whole-namespace: has no targetRefs: it applies to the namespace's workloads, enforced by ztunnel, not by a waypoint".to_string(), 1, 8),
            ("gateway.networking.k8s.io/v1alpha2 TCPRoute shop/r: a kind the waypoint does not read".to_string(), 2, 13),
        ]
    );
    assert_eq!(
        p.skipped.iter().map(|s| s.value.reason).collect::<Vec<_>>(),
        [
            SkipReason::Selector,
            SkipReason::NamespaceWide,
            SkipReason::UnsupportedKind
        ]
    );
}

/// A file of five documents: the bad ones are refused with their place in the file, the
/// good ones load.
#[test]
fn one_bad_document_is_refused_alone() {
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: good-1, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: a}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad-method, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: a}]
  rules:
  - to:
    - operation:
        methods: [GET, get]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: not-yaml, namespace: shop}
spec: {targetRefs: [
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: good-2, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: b}]
---
kind: AuthorizationPolicy
metadata: {name: no-version}
";
    let p = parse(text);
    let names: Vec<&str> = p
        .policies
        .iter()
        .map(|p| p.value.authorization.name.as_str())
        .collect();
    assert_eq!(names, ["good-1", "good-2"]);
    assert_eq!(
        p.policies
            .iter()
            .map(|p| (p.origin.document, p.origin.line))
            .collect::<Vec<_>>(),
        [(0, 1), (3, 22)]
    );
    let errors: Vec<String> = p.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "p.yaml:15:24: spec.rules[0].to[0].operation.methods[1]: method \"get\" is not upper case; methods are compared case-sensitively and a request whose method is not upper case is refused, so it can never match; write \"GET\"",
            "p.yaml:21:1: did not find expected node content, while parsing a flow node",
            "p.yaml:28:1: apiVersion: missing; every manifest names its apiVersion and kind",
        ]
    );
    assert_eq!(
        p.errors.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [ErrorKind::Invalid, ErrorKind::Syntax, ErrorKind::Invalid]
    );
}

#[test]
fn refusals_name_line_column_and_field() {
    let doc = |spec: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: shop}}\nspec:\n  targetRefs: [{{kind: Service, name: a}}]\n{spec}")
    };
    let table = [
        // Unknown fields: Istio refuses them, and a misspelt one could widen a policy.
        (
            "  rules:\n  - form: [{source: {namespaces: [a]}}]\n",
            "p.yaml:7:5: spec.rules[0].form: unknown field `form`, expected one of `from`, `to`, `when`",
        ),
        (
            "  rules:\n  - from: [{source: {namespace: [a]}}]\n",
            "p.yaml:7:22: spec.rules[0].from[0].source.namespace: unknown field `namespace`, expected one of `principals`, `notPrincipals`, `requestPrincipals`, `notRequestPrincipals`, `namespaces`, `notNamespaces`, `serviceAccounts`, `notServiceAccounts`, `ipBlocks`, `notIpBlocks`, `remoteIpBlocks`, `notRemoteIpBlocks`",
        ),
        (
            "  rules:\n  - to: [{operation: {ports: [8080]}}]\n",
            "p.yaml:7:31: spec.rules[0].to[0].operation.ports[0]: invalid type: integer `8080`, expected a port number (a string: quote numbers and booleans)",
        ),
        (
            "  rules:\n  - to: [{operation: {ports: [\"70000\"]}}]\n",
            "p.yaml:7:31: spec.rules[0].to[0].operation.ports[0]: \"70000\" is not a port number (1-65535)",
        ),
        (
            "  rules:\n  - from: [{source: {ipBlocks: [10.0.0.0/33]}}]\n",
            "p.yaml:7:33: spec.rules[0].from[0].source.ipBlocks[0]: \"10.0.0.0/33\" is not an IP address or CIDR",
        ),
        (
            "  rules:\n  - from: [{source: {principals: [\"spiffe://cluster.local/ns/a/sa/b\"]}}]\n",
            "p.yaml:7:35: spec.rules[0].from[0].source.principals[0]: principal \"spiffe://cluster.local/ns/a/sa/b\" starts with \"spiffe://\", but principals are compared without the scheme, so it can never match; drop the prefix: \"cluster.local/ns/a/sa/b\"",
        ),
        (
            "  rules:\n  - from: [{source: {serviceAccounts: [\"a/b/c\"]}}]\n",
            "p.yaml:7:40: spec.rules[0].from[0].source.serviceAccounts[0]: service account \"a/b/c\" must be <namespace>/<name>, or <name> for the policy's namespace",
        ),
        (
            "  rules:\n  - from: [{source: {serviceAccounts: [a/b], principals: [x]}}]\n",
            "p.yaml:7:39: spec.rules[0].from[0].source.serviceAccounts: cannot be set with principals or namespaces in the same source (Istio refuses it)",
        ),
        (
            "  rules:\n  - to: [{operation: {paths: [\"/a/{**}/b/{*}\"]}}]\n",
            "p.yaml:7:31: spec.rules[0].to[0].operation.paths[0]: path template \"/a/{**}/b/{*}\": {**} must be the last operator",
        ),
        (
            "  rules:\n  - when: [{key: source.color, values: [x]}]\n",
            "p.yaml:7:18: spec.rules[0].when[0].key: unknown condition key \"source.color\"; the keys are request.headers[<name>], source.ip, remote.ip, source.namespace, source.serviceAccount, source.trustDomain, source.principal, request.auth.principal, request.auth.audiences, request.auth.presenter, request.auth.claims[<claim>], destination.ip, destination.port, connection.sni, experimental.envoy.filters.<...>",
        ),
        // Left empty: Istio refuses them; a source or operation that sets nothing.
        (
            "  rules:\n  - from: []\n",
            "p.yaml:7:11: spec.rules[0].from: must not be empty; leave it out to match any source",
        ),
        (
            "  rules:\n  - to: [{operation: {}}]\n",
            "p.yaml:7:22: spec.rules[0].to[0].operation: sets no field; an operation matches on at least one",
        ),
        (
            "  rules:\n  - from: [{source: {principals: []}}]\n",
            "p.yaml:7:21: spec.rules[0].from[0].source: sets no field; a source matches on at least one",
        ),
        (
            "  rules:\n  - from: [{}]\n",
            "p.yaml:7:12: spec.rules[0].from[0]: source: must be set",
        ),
        (
            "  bogus: 1\n",
            "p.yaml:6:3: spec.bogus: unknown field `bogus`, expected one of `selector`, `targetRef`, `targetRefs`, `action`, `provider`, `rules`",
        ),
    ];
    for (spec, want) in table {
        assert_eq!(refusal(&doc(spec)), want, "{spec}");
    }

    // The object around the spec.
    let table = [
        (
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namepsace: shop}\n",
            "p.yaml:3:21: metadata.namepsace: unknown field `namepsace`, expected one of `name`, `namespace`, `annotations`, `labels`, `generateName`, `uid`, `resourceVersion`, `generation`, `creationTimestamp`, `deletionTimestamp`, `deletionGracePeriodSeconds`, `ownerReferences`, `finalizers`, `managedFields`, `selfLink`",
        ),
        (
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: My_Policy}\n",
            "p.yaml:3:18: metadata.name: \"My_Policy\" is not a Kubernetes name: 1-253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
        ),
        (
            "apiVersion: security.istio.io/v2\nkind: AuthorizationPolicy\nmetadata: {name: p}\n",
            "p.yaml:1:13: apiVersion: AuthorizationPolicy has no version \"v2\"; the versions are v1, v1beta1",
        ),
        (
            "apiVersion: v1\nkind: List\nitems: []\n",
            "p.yaml:2:7: kind: a List is not read; write its items as documents separated by ---",
        ),
        ("[1, 2]\n", "p.yaml:1:1: a manifest is a map with apiVersion, kind and metadata"),
        (
            "apiVersion: 1\nkind: AuthorizationPolicy\n",
            "p.yaml:1:13: apiVersion: must be a non-empty string",
        ),
    ];
    for (text, want) in table {
        assert_eq!(refusal(text), want, "{text}");
    }
}

#[test]
fn a_second_policy_of_the_same_name_is_refused() {
    // v1 and v1beta1 are one object in Kubernetes: the first read is kept.
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: p, namespace: shop}
spec: {targetRefs: [{kind: Service, name: a}]}
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata:
  namespace: shop
  name: p
spec: {targetRefs: [{kind: Service, name: b}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: p, namespace: other}
spec: {targetRefs: [{kind: Service, name: a}]}
";
    let p = parse(text);
    assert_eq!(p.policies.len(), 2);
    assert_eq!(
        p.policies[0].value.targets,
        vec![PolicyTarget::Service {
            namespace: "shop".into(),
            name: "a".into()
        }]
    );
    assert_eq!(p.policies[1].value.authorization.namespace, "other");
    assert_eq!(
        p.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["p.yaml:10:9: metadata.name: AuthorizationPolicy shop/p is defined again; the first definition (p.yaml:1) is kept"]
    );
    assert_eq!(p.errors[0].kind, ErrorKind::Duplicate);
}

#[test]
fn bytes_that_are_not_utf8_are_one_refusal() {
    let p = parse_bytes(
        "p.yaml",
        b"apiVersion: v1\nkind: \xff\n",
        &ParseOptions::default(),
    );
    assert_eq!(
        p.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["p.yaml:2:7: not UTF-8 text; manifests are UTF-8"]
    );
}

/// A syntax error's own positions (where the construct it broke began) count from the
/// start of the file, as the position reported with it does.
#[test]
fn syntax_errors_count_lines_from_the_file() {
    let p = parse(&format!("{HEAD}---\nkind: x\nmetadata:\n  name: 'open\n"));
    assert_eq!(p.policies.len(), 1);
    assert_eq!(
        p.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["p.yaml:10:1: found unexpected end of stream, while scanning a quoted scalar at line 9 column 9"]
    );
    // Cut short without a final newline: the end is placed at the end of the last line.
    let p = parse("apiVersion: v1\nkind: [\n---\napiVersion: v1\nkind: [");
    assert_eq!(
        p.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "p.yaml:3:1: did not find expected node content, while parsing a flow node",
            "p.yaml:5:8: did not find expected node content, while parsing a flow node"
        ]
    );
}
