//! Every L7 matcher: what it accepts (the typed value, and the text it is written back as)
//! and what it refuses (the whole message the user sees, with line and column).

use super::*;
use crate::local_schema::parse_local_config;
use crate::policy::{Authorization, RbacMatch};

/// A policy whose one match object is `m` (flow YAML), on line 6.
fn yaml(m: &str) -> String {
    format!("policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{m}]]]\n")
}

fn one_match(m: &str) -> Result<RbacMatch, String> {
    let mut cfg = parse_local_config("f.yaml", &yaml(m)).map_err(|e| e.to_string())?;
    let mut p: Authorization = cfg.policies.remove(0);
    Ok(p.rules.remove(0).remove(0).remove(0))
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}
fn prefix(s: &str) -> StringMatch {
    StringMatch::Prefix(s.into())
}
fn suffix(s: &str) -> StringMatch {
    StringMatch::Suffix(s.into())
}
fn lit(s: &str) -> PathSegment {
    PathSegment::Literal(s.into())
}
fn template(segments: Vec<PathSegment>) -> PathMatch {
    PathMatch::Template(PathTemplate { segments })
}
fn ip(s: &str) -> IpBlock {
    IpBlock::parse(s).unwrap()
}
fn header(name: &str, value: StringMatch) -> HeaderMatch {
    HeaderMatch {
        name: name.into(),
        value,
    }
}
fn text(key: TextKey, values: &[StringMatch]) -> Condition {
    Condition::Text(
        key,
        Values {
            values: Some(values.to_vec()),
            not_values: None,
        },
    )
}

/// (match object, the attributes it must read as, the match object written as JSON).
#[test]
fn accepted_table() {
    let none = L7Attributes::default();
    let cases: Vec<(&str, L7Attributes, &str)> = vec![
        // Paths: exact, prefix, suffix, presence, templates.
        (
            r#"{paths: ["/a", "/a/*", "*/info", "*", "/", "/a//b/"]}"#,
            L7Attributes {
                paths: Some(vec![
                    PathMatch::String(exact("/a")),
                    PathMatch::String(prefix("/a/")),
                    PathMatch::String(suffix("/info")),
                    PathMatch::String(StringMatch::Presence),
                    PathMatch::String(exact("/")),
                    PathMatch::String(exact("/a//b/")),
                ]),
                ..none.clone()
            },
            r#"{"paths":["/a","/a/*","*/info","*","/","/a//b/"]}"#,
        ),
        (
            r#"{notPaths: ["/a/{*}/b", "/a/{**}", "/{*}/{**}", "/a/{**}/b", "/{*}/", "/{**}"]}"#,
            L7Attributes {
                not_paths: Some(vec![
                    template(vec![lit("a"), PathSegment::One, lit("b")]),
                    template(vec![lit("a"), PathSegment::Many]),
                    template(vec![PathSegment::One, PathSegment::Many]),
                    template(vec![lit("a"), PathSegment::Many, lit("b")]),
                    template(vec![PathSegment::One, lit("")]),
                    template(vec![PathSegment::Many]),
                ]),
                ..none.clone()
            },
            r#"{"notPaths":["/a/{*}/b","/a/{**}","/{*}/{**}","/a/{**}/b","/{*}/","/{**}"]}"#,
        ),
        // Methods: upper-case tokens, with `*` at either end.
        (
            "{methods: [GET, \"P*\", \"*T\", \"*\", M-SEARCH], notMethods: []}",
            L7Attributes {
                methods: Some(vec![
                    exact("GET"),
                    prefix("P"),
                    suffix("T"),
                    StringMatch::Presence,
                    exact("M-SEARCH"),
                ]),
                not_methods: Some(vec![]),
                ..none.clone()
            },
            r#"{"methods":["GET","P*","*T","*","M-SEARCH"],"notMethods":[]}"#,
        ),
        // Hosts: compared without case, so any case is kept as written.
        (
            r#"{hosts: [example.com, "*.example.com", "api.*", "*", "Example.COM:8080"]}"#,
            L7Attributes {
                hosts: Some(vec![
                    exact("example.com"),
                    suffix(".example.com"),
                    prefix("api."),
                    StringMatch::Presence,
                    exact("Example.COM:8080"),
                ]),
                ..none.clone()
            },
            r#"{"hosts":["example.com","*.example.com","api.*","*","Example.COM:8080"]}"#,
        ),
        // Request principals: `<issuer>/<subject>`, any string really.
        (
            r#"{requestPrincipals: ["https://iss/sub", "*", "iss/*", "*/sub"], notRequestPrincipals: [x]}"#,
            L7Attributes {
                request_principals: Some(vec![
                    exact("https://iss/sub"),
                    StringMatch::Presence,
                    prefix("iss/"),
                    suffix("/sub"),
                ]),
                not_request_principals: Some(vec![exact("x")]),
                ..none.clone()
            },
            r#"{"requestPrincipals":["https://iss/sub","*","iss/*","*/sub"],"notRequestPrincipals":["x"]}"#,
        ),
        // Headers: sorted by name (as a JSON object shows them), values as strings.
        (
            r#"{headers: {x-b: "1", X-A: "v*", ":authority": "*"}, notHeaders: {}}"#,
            L7Attributes {
                headers: Some(vec![
                    header(":authority", StringMatch::Presence),
                    header("X-A", prefix("v")),
                    header("x-b", exact("1")),
                ]),
                not_headers: Some(vec![]),
                ..none.clone()
            },
            r#"{"headers":{":authority":"*","X-A":"v*","x-b":"1"},"notHeaders":{}}"#,
        ),
        // Remote IPs: as written (a bare address stays bare, case is kept).
        (
            r#"{remoteIps: ["10.0.0.1", "10.0.0.1/8", "FD00::1/64"], notRemoteIps: ["::1"]}"#,
            L7Attributes {
                remote_ips: Some(vec![ip("10.0.0.1"), ip("10.0.0.1/8"), ip("FD00::1/64")]),
                not_remote_ips: Some(vec![ip("::1")]),
                ..none.clone()
            },
            r#"{"remoteIps":["10.0.0.1","10.0.0.1/8","FD00::1/64"],"notRemoteIps":["::1"]}"#,
        ),
        // `when`: every key, each with its kind of value; written key, notValues, values.
        (
            concat!(
                "{when: [",
                "{key: \"request.headers[x-user]\", values: [alice, \"b*\"]},",
                "{key: source.ip, notValues: [\"10.0.0.0/8\"], values: [\"10.1.0.1\"]},",
                "{key: remote.ip, values: [\"fd00::/8\"]},",
                "{key: source.namespace, values: [\"team-*\"]},",
                "{key: source.serviceAccount, values: [ns/sa]},",
                "{key: source.trustDomain, values: [cluster.local]},",
                "{key: source.principal, values: [cluster.local/ns/a/sa/b]},",
                "{key: request.auth.principal, values: [\"iss/*\"]},",
                "{key: request.auth.audiences, values: [aud]},",
                "{key: request.auth.presenter, values: [\"*\"]},",
                "{key: \"request.auth.claims[groups]\", values: [admin]},",
                "{key: \"request.auth.claims[a][b]\", notValues: [x]},",
                "{key: destination.ip, values: [\"10.0.0.3\"]},",
                "{key: destination.port, values: [\"80\", \"65535\"], notValues: []},",
                "{key: connection.sni, values: [\"*.example.com\"]},",
                "{key: \"experimental.envoy.filters.network.mysql_proxy[db.table]\", values: [\"[update]\"]},",
                // The values before the key: typed once the key is known.
                "{values: [\"10.2.0.0/16\"], key: source.ip},",
                "]}"
            ),
            L7Attributes {
                when: Some(vec![
                    text(
                        TextKey::RequestHeader("x-user".into()),
                        &[exact("alice"), prefix("b")],
                    ),
                    Condition::Ip(
                        IpKey::SourceIp,
                        Values {
                            values: Some(vec![ip("10.1.0.1")]),
                            not_values: Some(vec![ip("10.0.0.0/8")]),
                        },
                    ),
                    Condition::Ip(
                        IpKey::RemoteIp,
                        Values {
                            values: Some(vec![ip("fd00::/8")]),
                            not_values: None,
                        },
                    ),
                    text(TextKey::SourceNamespace, &[prefix("team-")]),
                    text(TextKey::SourceServiceAccount, &[exact("ns/sa")]),
                    text(TextKey::SourceTrustDomain, &[exact("cluster.local")]),
                    text(TextKey::SourcePrincipal, &[exact("cluster.local/ns/a/sa/b")]),
                    text(TextKey::RequestAuthPrincipal, &[prefix("iss/")]),
                    text(TextKey::RequestAuthAudiences, &[exact("aud")]),
                    text(TextKey::RequestAuthPresenter, &[StringMatch::Presence]),
                    text(
                        TextKey::RequestAuthClaim(vec!["groups".into()]),
                        &[exact("admin")],
                    ),
                    Condition::Text(
                        TextKey::RequestAuthClaim(vec!["a".into(), "b".into()]),
                        Values {
                            values: None,
                            not_values: Some(vec![exact("x")]),
                        },
                    ),
                    Condition::Ip(
                        IpKey::DestinationIp,
                        Values {
                            values: Some(vec![ip("10.0.0.3")]),
                            not_values: None,
                        },
                    ),
                    Condition::DestinationPort(Values {
                        values: Some(vec![80, 65535]),
                        not_values: Some(vec![]),
                    }),
                    text(TextKey::ConnectionSni, &[suffix(".example.com")]),
                    text(
                        TextKey::EnvoyFilter("network.mysql_proxy[db.table]".into()),
                        &[exact("[update]")],
                    ),
                    Condition::Ip(
                        IpKey::SourceIp,
                        Values {
                            values: Some(vec![ip("10.2.0.0/16")]),
                            not_values: None,
                        },
                    ),
                ]),
                ..none.clone()
            },
            concat!(
                r#"{"when":["#,
                r#"{"key":"request.headers[x-user]","values":["alice","b*"]},"#,
                r#"{"key":"source.ip","notValues":["10.0.0.0/8"],"values":["10.1.0.1"]},"#,
                r#"{"key":"remote.ip","values":["fd00::/8"]},"#,
                r#"{"key":"source.namespace","values":["team-*"]},"#,
                r#"{"key":"source.serviceAccount","values":["ns/sa"]},"#,
                r#"{"key":"source.trustDomain","values":["cluster.local"]},"#,
                r#"{"key":"source.principal","values":["cluster.local/ns/a/sa/b"]},"#,
                r#"{"key":"request.auth.principal","values":["iss/*"]},"#,
                r#"{"key":"request.auth.audiences","values":["aud"]},"#,
                r#"{"key":"request.auth.presenter","values":["*"]},"#,
                r#"{"key":"request.auth.claims[groups]","values":["admin"]},"#,
                r#"{"key":"request.auth.claims[a][b]","notValues":["x"]},"#,
                r#"{"key":"destination.ip","values":["10.0.0.3"]},"#,
                r#"{"key":"destination.port","notValues":[],"values":["80","65535"]},"#,
                r#"{"key":"connection.sni","values":["*.example.com"]},"#,
                r#"{"key":"experimental.envoy.filters.network.mysql_proxy[db.table]","values":["[update]"]},"#,
                r#"{"key":"source.ip","values":["10.2.0.0/16"]}"#,
                r#"]}"#,
            ),
        ),
        // `null` is not written: no attribute.
        ("{paths: null, when: ~, destinationPorts: [1]}", none.clone(), r#"{"destinationPorts":[1]}"#),
    ];
    let mut failures = Vec::new();
    for (m, want, json) in cases {
        let got = match one_match(m) {
            Ok(got) => got,
            Err(e) => {
                failures.push(format!("{m}: refused: {e}"));
                continue;
            }
        };
        let attrs = got.l7.as_deref().cloned().unwrap_or_default();
        if attrs != want {
            failures.push(format!("{m}:\n   got {attrs:?}\n  want {want:?}"));
        }
        let written = serde_json::to_string(&got).unwrap();
        if written != json {
            failures.push(format!("{m}: written\n   {written}\n  want {json}"));
        }
        // What is written reads back the same, as JSON and as YAML.
        let back: RbacMatch = serde_json::from_str(&written).unwrap();
        let yaml_back: RbacMatch =
            yaml_serde::from_str(&yaml_serde::to_string(&got).unwrap()).unwrap();
        if back != got || yaml_back != got {
            failures.push(format!("{m}: does not read back"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// (match object, the error the user sees). The column is the value's own.
#[test]
fn refused_table() {
    let cases: &[(&str, &str)] = &[
        // Paths.
        (
            r#"{paths: ["/a", admin]}"#,
            r#"f.yaml: line 6, column 28: policies[0].rules[0][0][0].paths[1]: path "admin" does not start with "/", so it can never match; write "/admin""#,
        ),
        (
            r#"{paths: ["admin*"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path "admin*" does not start with "/", so it can never match; write "/admin*""#,
        ),
        (
            r#"{paths: ["/a?x=1"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path "/a?x=1" has a query or fragment; paths are matched without them"#,
        ),
        (
            r#"{notPaths: ["/a#top"]}"#,
            r#"f.yaml: line 6, column 25: policies[0].rules[0][0][0].notPaths[0]: path "/a#top" has a query or fragment; paths are matched without them"#,
        ),
        (
            r#"{paths: ["/a*b"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path "/a*b" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
        ),
        (
            r#"{paths: ["**"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path "**" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
        ),
        (
            r#"{paths: [""]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path must not be empty ("*" is any value)"#,
        ),
        (
            r#"{paths: ["/a/{id}"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path "/a/{id}" has a '{' or '}' outside a template operator; the operators are {*} (one segment) and {**} (any number of segments), each a whole segment"#,
        ),
        (
            r#"{paths: ["/a/{*}.txt"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path template "/a/{*}.txt": segment "{*}.txt" mixes an operator with other text; {*} and {**} must each be a whole segment, and a template takes no other '*'"#,
        ),
        (
            r#"{paths: ["/a/{*}/b*"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path template "/a/{*}/b*": segment "b*" mixes an operator with other text; {*} and {**} must each be a whole segment, and a template takes no other '*'"#,
        ),
        (
            r#"{paths: ["a/{*}"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path template "a/{*}" does not start with "/""#,
        ),
        (
            r#"{paths: ["/{**}/{*}"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path template "/{**}/{*}": {**} must be the last operator"#,
        ),
        (
            r#"{paths: ["/{**}/a/{**}"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: path template "/{**}/a/{**}": {**} must be the last operator"#,
        ),
        (
            r#"{paths: [80]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: invalid type: integer `80`, expected a path (a string: quote numbers and booleans)"#,
        ),
        (
            r#"{paths: "/a"}"#,
            r#"f.yaml: line 6, column 21: policies[0].rules[0][0][0].paths: invalid type: string "/a", expected a sequence"#,
        ),
        (
            r#"{paths: [["/a"]]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].paths[0]: invalid type: sequence, expected a path (a string: quote numbers and booleans)"#,
        ),
        // Methods.
        (
            "{methods: [GET, get]}",
            r#"f.yaml: line 6, column 29: policies[0].rules[0][0][0].methods[1]: method "get" is not upper case; methods are compared case-sensitively and a request whose method is not upper case is refused, so it can never match; write "GET""#,
        ),
        (
            r#"{notMethods: ["GET /"]}"#,
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].notMethods[0]: "GET /" is not an HTTP method"#,
        ),
        (
            r#"{methods: ["G*T"]}"#,
            r#"f.yaml: line 6, column 24: policies[0].rules[0][0][0].methods[0]: method "G*T" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
        ),
        (
            r#"{methods: [""]}"#,
            r#"f.yaml: line 6, column 24: policies[0].rules[0][0][0].methods[0]: method must not be empty ("*" is any value)"#,
        ),
        (
            "{methods: [true]}",
            r#"f.yaml: line 6, column 24: policies[0].rules[0][0][0].methods[0]: invalid type: boolean `true`, expected an HTTP method (a string: quote numbers and booleans)"#,
        ),
        // Hosts.
        (
            r#"{hosts: ["a b"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].hosts[0]: "a b" is not a host; hosts are compared with the request's Host, without scheme or path"#,
        ),
        (
            r#"{notHosts: ["https://a.example/"]}"#,
            r#"f.yaml: line 6, column 25: policies[0].rules[0][0][0].notHosts[0]: "https://a.example/" is not a host; hosts are compared with the request's Host, without scheme or path"#,
        ),
        (
            r#"{hosts: ["*.a.*"]}"#,
            r#"f.yaml: line 6, column 22: policies[0].rules[0][0][0].hosts[0]: host "*.a.*" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
        ),
        // Request principals.
        (
            r#"{requestPrincipals: [""]}"#,
            r#"f.yaml: line 6, column 34: policies[0].rules[0][0][0].requestPrincipals[0]: request principal must not be empty ("*" is any value)"#,
        ),
        (
            r#"{notRequestPrincipals: ["iss/*/x"]}"#,
            r#"f.yaml: line 6, column 37: policies[0].rules[0][0][0].notRequestPrincipals[0]: request principal "iss/*/x" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
        ),
        (
            "{requestPrincipals: [1]}",
            r#"f.yaml: line 6, column 34: policies[0].rules[0][0][0].requestPrincipals[0]: invalid type: integer `1`, expected a request principal (a string: quote numbers and booleans)"#,
        ),
        // Headers.
        (
            "{headers: [x]}",
            r#"f.yaml: line 6, column 23: policies[0].rules[0][0][0].headers: invalid type: sequence, expected a map of header names to values"#,
        ),
        (
            r#"{headers: {"": a}}"#,
            r#"f.yaml: line 6, column 24: policies[0].rules[0][0][0].headers.: "" is not a header name"#,
        ),
        (
            r#"{notHeaders: {"x a": b}}"#,
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].notHeaders.x a: "x a" is not a header name"#,
        ),
        (
            "{headers: {x-a: b, X-A: c}}",
            r#"f.yaml: line 6, column 32: policies[0].rules[0][0][0].headers.X-A: header "X-A" is given twice (names are compared without case)"#,
        ),
        (
            "{headers: {x: [a]}}",
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].headers.x: invalid type: sequence, expected a value (exact, prefix*, *suffix or *) (a string: quote numbers and booleans)"#,
        ),
        (
            "{headers: {x: 1}}",
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].headers.x: invalid type: integer `1`, expected a value (exact, prefix*, *suffix or *) (a string: quote numbers and booleans)"#,
        ),
        (
            r#"{headers: {x: ""}}"#,
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].headers.x: must not be empty ("*" is any value)"#,
        ),
        // Remote IPs.
        (
            "{remoteIps: [x]}",
            r#"f.yaml: line 6, column 26: policies[0].rules[0][0][0].remoteIps[0]: "x" is not an IP address or CIDR"#,
        ),
        (
            r#"{notRemoteIps: ["10.0.0.0/33"]}"#,
            r#"f.yaml: line 6, column 29: policies[0].rules[0][0][0].notRemoteIps[0]: "10.0.0.0/33" is not an IP address or CIDR"#,
        ),
        (
            r#"{remoteIps: ["::ffff:10.0.0.1"]}"#,
            r#"f.yaml: line 6, column 26: policies[0].rules[0][0][0].remoteIps[0]: "::ffff:10.0.0.1" is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write "10.0.0.1""#,
        ),
        // Conditions.
        (
            "{when: [x]}",
            r#"f.yaml: line 6, column 21: policies[0].rules[0][0][0].when[0]: invalid type: string "x", expected a condition {key, values, notValues}"#,
        ),
        (
            r#"{when: [{key: "request.header[x]", values: [a]}]}"#,
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].when[0].key: unknown condition key "request.header[x]"; the keys are request.headers[<name>], source.ip, remote.ip, source.namespace, source.serviceAccount, source.trustDomain, source.principal, request.auth.principal, request.auth.audiences, request.auth.presenter, request.auth.claims[<claim>], destination.ip, destination.port, connection.sni, experimental.envoy.filters.<...>"#,
        ),
        (
            "{when: [{key: source.ip}]}",
            r#"f.yaml: line 6, column 21: policies[0].rules[0][0][0].when[0]: a condition needs values or notValues (at least one value)"#,
        ),
        (
            "{when: [{key: source.ip, values: [], notValues: []}]}",
            r#"f.yaml: line 6, column 21: policies[0].rules[0][0][0].when[0]: a condition needs values or notValues (at least one value)"#,
        ),
        (
            r#"{when: [{key: source.ip, values: null, notValues: ["10.0.0.1"]}]}"#,
            "f.yaml: line 6, column 46: policies[0].rules[0][0][0].when[0].values: null is not a list of values; leave the field out",
        ),
        (
            r#"{when: [{key: source.ip, values: "10.0.0.1"}]}"#,
            r#"f.yaml: line 6, column 46: policies[0].rules[0][0][0].when[0].values: invalid type: string "10.0.0.1", expected a sequence of values"#,
        ),
        (
            "{when: [{key: source.ip, values: [x]}]}",
            r#"f.yaml: line 6, column 47: policies[0].rules[0][0][0].when[0].values[0]: "x" is not an IP address or CIDR"#,
        ),
        (
            r#"{when: [{notValues: ["10.0.0.1", x], key: destination.ip}]}"#,
            r#"f.yaml: line 6, column 21: policies[0].rules[0][0][0].when[0]: notValues[1]: "x" is not an IP address or CIDR"#,
        ),
        (
            r#"{when: [{key: destination.port, values: ["080"]}]}"#,
            r#"f.yaml: line 6, column 54: policies[0].rules[0][0][0].when[0].values[0]: "080" is not a port number (1-65535)"#,
        ),
        (
            r#"{when: [{key: destination.port, values: ["0"]}]}"#,
            r#"f.yaml: line 6, column 54: policies[0].rules[0][0][0].when[0].values[0]: "0" is not a port number (1-65535)"#,
        ),
        (
            r#"{when: [{key: destination.port, notValues: ["65536"]}]}"#,
            r#"f.yaml: line 6, column 57: policies[0].rules[0][0][0].when[0].notValues[0]: "65536" is not a port number (1-65535)"#,
        ),
        (
            "{when: [{key: destination.port, values: [80]}]}",
            r#"f.yaml: line 6, column 54: policies[0].rules[0][0][0].when[0].values[0]: invalid type: integer `80`, expected a port number (a string: quote numbers and booleans)"#,
        ),
        (
            r#"{when: [{key: "request.headers[]", values: [a]}]}"#,
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].when[0].key: condition key "request.headers[]": "" is not a header name"#,
        ),
        (
            "{when: [{key: request.auth.claims, values: [a]}]}",
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].when[0].key: condition key "request.auth.claims" is not request.auth.claims[<claim>] (nested: [<a>][<b>])"#,
        ),
        (
            r#"{when: [{key: "request.auth.claims[a]b", values: [a]}]}"#,
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].when[0].key: condition key "request.auth.claims[a]b" is not request.auth.claims[<claim>] (nested: [<a>][<b>])"#,
        ),
        (
            "{when: [{key: experimental.envoy.filters., values: [a]}]}",
            r#"f.yaml: line 6, column 27: policies[0].rules[0][0][0].when[0].key: unknown condition key "experimental.envoy.filters."; the keys are request.headers[<name>], source.ip, remote.ip, source.namespace, source.serviceAccount, source.trustDomain, source.principal, request.auth.principal, request.auth.audiences, request.auth.presenter, request.auth.claims[<claim>], destination.ip, destination.port, connection.sni, experimental.envoy.filters.<...>"#,
        ),
        (
            r#"{when: [{key: source.principal, values: ["spiffe://td/ns/a/sa/b"]}]}"#,
            r#"f.yaml: line 6, column 54: policies[0].rules[0][0][0].when[0].values[0]: principal "spiffe://td/ns/a/sa/b" starts with "spiffe://", but principals are compared without the scheme, so it can never match; drop the prefix: "td/ns/a/sa/b""#,
        ),
        (
            r#"{when: [{key: source.namespace, values: ["a*b"]}]}"#,
            r#"f.yaml: line 6, column 54: policies[0].rules[0][0][0].when[0].values[0]: "a*b" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
        ),
        (
            "{when: [{key: connection.sni, values: [a], value: [b]}]}",
            r#"f.yaml: line 6, column 56: policies[0].rules[0][0][0].when[0].value: unknown field `value`, expected one of `key`, `values`, `notValues`"#,
        ),
        (
            "{when: [{values: [a]}]}",
            r#"f.yaml: line 6, column 21: policies[0].rules[0][0][0].when[0]: missing field `key`"#,
        ),
        (
            "{when: [{key: connection.sni, values: [a], values: [b]}]}",
            r#"f.yaml: line 6, column 21: policies[0].rules[0][0][0].when[0]: duplicate field `values`"#,
        ),
    ];
    let mut failures = Vec::new();
    for (m, want) in cases {
        match one_match(m) {
            Ok(got) => failures.push(format!("{m}: accepted as {got:?}")),
            Err(e) if e != *want => failures.push(format!("{m}:\n   got {e:?}\n  want {want:?}")),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The Istio string form of a string match: every form reads back as itself.
#[test]
fn istio_string_forms() {
    let cases: &[(&str, Result<StringMatch, &str>)] = &[
        ("a", Ok(exact("a"))),
        ("a*", Ok(prefix("a"))),
        ("*a", Ok(suffix("a"))),
        ("*", Ok(StringMatch::Presence)),
        (
            "**",
            Err(
                r#""**" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
            ),
        ),
        (
            "*a*",
            Err(
                r#""*a*" has a '*' inside; a '*' may only be the whole value, or begin ("*suffix") or end ("prefix*") it"#,
            ),
        ),
        ("", Err(r#"must not be empty ("*" is any value)"#)),
    ];
    for (s, want) in cases {
        let got = StringMatch::from_istio(s);
        assert_eq!(
            got.as_ref().map_err(String::as_str),
            want.as_ref().map_err(|e| *e),
            "{s}"
        );
        if let Ok(m) = got {
            assert_eq!(m.to_istio(), *s);
        }
    }
}

/// A path match against normalised paths: string forms compare the whole path byte for
/// byte; `{*}` is one non-empty segment of template characters (RFC 3986 `pchar` without
/// `*` and `=`), `{**}` any run of them and `/`, even none.
#[test]
fn path_matches_table() {
    let cases: &[(&str, &str, bool)] = &[
        ("/a", "/a", true),
        ("/a", "/a/", false),
        ("/a", "/A", false),
        ("/a/*", "/a/", true),
        ("/a/*", "/a", false),
        ("*/b", "/a/b", true),
        ("*", "/", true),
        // {*}: exactly one segment, not empty.
        ("/a/{*}", "/a/b", true),
        ("/a/{*}", "/a/", false),
        ("/a/{*}", "/a", false),
        ("/a/{*}", "/a/b/c", false),
        ("/a/{*}", "/a/b/", false),
        ("/a/{*}", "/a/%2F", true),
        ("/a/{*}", "/a/~-._!$&'()+,;:@", true),
        ("/a/{*}", "/a/b=c", false),
        ("/a/{*}", "/a/b*", false),
        ("/a/{*}", "/a/é", false),
        ("/{*}/b/{*}", "/x/b/y", true),
        ("/{*}/b/{*}", "/x/c/y", false),
        ("/{*}/b/{*}", "/x/b/", false),
        ("/a/{*}/", "/a/b/", true),
        ("/a/{*}/", "/a/b", false),
        ("/A/{*}", "/a/b", false),
        // {**}: any number of segments, even none (but the `/` before it is literal).
        ("/a/{**}", "/a/", true),
        ("/a/{**}", "/a", false),
        ("/a/{**}", "/a/b/c/", true),
        ("/a/{**}", "/a/b=c", false),
        ("/a/{**}", "/ab/c", false),
        ("/{**}", "/", true),
        ("/{**}", "/x/y", true),
        ("/a/{**}/z", "/a/b/c/z", true),
        ("/a/{**}/z", "/a//z", true),
        ("/a/{**}/z", "/a/z", false),
        ("/a/{**}/z", "/a/b/z/y", false),
        ("/a/{**}/y/z", "/a/b/y/z", true),
        ("/a/{**}/y/z", "/a/b/z", false),
        ("/a/{*}/{**}", "/a/b/", true),
        ("/a/{*}/{**}", "/a/b", false),
        ("/a/{*}/{**}", "/a/b/c/d", true),
        ("/a/{*}/{**}", "/a//c", false),
    ];
    let mut failures = Vec::new();
    for (pattern, path, want) in cases {
        let m = PathMatch::parse(pattern).unwrap();
        if m.matches(path) != *want {
            failures.push(format!("{pattern} ~ {path}: want {want}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
