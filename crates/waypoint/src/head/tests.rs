//! Table tests of [`prepare`]: what a head becomes, or why it is refused.

use super::*;

const V11: Version = Version::HTTP_11;
const V2: Version = Version::HTTP_2;
const V10: Version = Version::HTTP_10;

struct Case {
    what: &'static str,
    version: Version,
    method: &'static str,
    target: &'static str,
    headers: &'static [(&'static str, &'static str)],
    /// The authority and upgrade, or the refusal.
    want: Result<(&'static str, Option<&'static str>), Refused>,
    /// The headers left, in order (`name: value`), when prepared.
    left: &'static [&'static str],
}

fn run(c: &Case, upgrades: &UpgradeTypes) -> (Result<Head, Refused>, Vec<String>) {
    let mut h = HeaderMap::new();
    for (k, v) in c.headers {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    let method = Method::from_bytes(c.method.as_bytes()).unwrap();
    let uri: Uri = c.target.parse().unwrap();
    let got = prepare(c.version, &method, &uri, &mut h, upgrades);
    let left = h
        .iter()
        .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
        .collect();
    (got, left)
}

fn refused(r: Refused) -> Result<(&'static str, Option<&'static str>), Refused> {
    Err(r)
}

#[test]
fn head_table() {
    let cases = [
        Case {
            what: "origin form: Host is the authority",
            version: V11,
            method: "GET",
            target: "/a",
            headers: &[("host", "echo:80"), ("x-a", "1")],
            want: Ok(("echo:80", None)),
            left: &["host: echo:80", "x-a: 1"],
        },
        Case {
            what: "absolute form: the target's authority, written into Host",
            version: V11,
            method: "GET",
            target: "http://echo.default:80/a",
            headers: &[("host", "denied.example")],
            want: Ok(("echo.default:80", None)),
            left: &["host: echo.default:80"],
        },
        Case {
            what: "absolute form without Host",
            version: V11,
            method: "GET",
            target: "http://echo/a",
            headers: &[],
            want: refused(Refused::NoHost),
            left: &[],
        },
        Case {
            what: "two Host headers",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[("host", "echo"), ("host", "denied.example")],
            want: refused(Refused::TwoHosts),
            left: &[],
        },
        Case {
            what: "two equal Host headers",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[("host", "echo"), ("host", "echo")],
            want: refused(Refused::TwoHosts),
            left: &[],
        },
        Case {
            what: "no Host",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[],
            want: refused(Refused::NoHost),
            left: &[],
        },
        Case {
            what: "HTTP/1.0 without Host",
            version: V10,
            method: "GET",
            target: "/",
            headers: &[],
            want: Ok(("", None)),
            left: &[],
        },
        Case {
            what: "Host with user information",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[("host", "admin@echo")],
            want: refused(Refused::BadHost("admin@echo".into())),
            left: &[],
        },
        Case {
            what: "Host that is a list",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[("host", "echo, denied")],
            want: refused(Refused::BadHost("echo, denied".into())),
            left: &[],
        },
        Case {
            what: "empty Host",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[("host", "")],
            want: refused(Refused::BadHost(String::new())),
            left: &[],
        },
        Case {
            what: "absolute form with user information",
            version: V11,
            method: "GET",
            target: "http://admin@echo/",
            headers: &[("host", "echo")],
            want: refused(Refused::BadAuthority("admin@echo".into())),
            left: &[],
        },
        Case {
            what: "HTTP/2: :authority, Host equal but for case, dropped",
            version: V2,
            method: "GET",
            target: "http://echo:80/",
            headers: &[("host", "ECHO:80")],
            want: Ok(("echo:80", None)),
            left: &[],
        },
        Case {
            what: "HTTP/2: Host differing from :authority",
            version: V2,
            method: "GET",
            target: "http://echo:80/",
            headers: &[("host", "denied.example")],
            want: refused(Refused::HostNotAuthority {
                host: "denied.example".into(),
                authority: "echo:80".into(),
            }),
            left: &[],
        },
        Case {
            what: "HTTP/2: Host alone",
            version: V2,
            method: "GET",
            target: "/",
            headers: &[("host", "echo")],
            want: Ok(("echo", None)),
            left: &[],
        },
        Case {
            what: "HTTP/2: no authority at all",
            version: V2,
            method: "GET",
            target: "/",
            headers: &[],
            want: Ok(("", None)),
            left: &[],
        },
        Case {
            what: "hop-by-hop: fixed and named, never Host; what the client names goes first",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[
                ("host", "echo"),
                ("connection", "keep-alive, x-request-id, host, X-Secret"),
                ("keep-alive", "5"),
                ("proxy-connection", "keep-alive"),
                ("x-request-id", "mine"),
                ("x-secret", "1"),
                ("transfer-encoding", "chunked"),
                ("te", "gzip"),
                ("x-kept", "1"),
            ],
            want: Ok(("echo", None)),
            left: &["host: echo", "x-kept: 1"],
        },
        Case {
            what: "TE: trailers is kept",
            version: V2,
            method: "POST",
            target: "http://grpc:80/a.B/C",
            headers: &[("te", "trailers")],
            want: Ok(("grpc:80", None)),
            left: &["te: trailers"],
        },
        Case {
            what: "a client's XFCC is removed",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[
                ("host", "echo"),
                (
                    "x-forwarded-client-cert",
                    "By=spiffe://cluster.local/ns/a/sa/b;URI=spiffe://cluster.local/ns/x/sa/admin",
                ),
            ],
            want: Ok(("echo", None)),
            left: &["host: echo"],
        },
        Case {
            what: "websocket upgrade: allowed, headers stripped for the onward hop",
            version: V11,
            method: "GET",
            target: "/ws",
            headers: &[
                ("host", "echo"),
                ("connection", "Upgrade"),
                ("upgrade", "WebSocket"),
                ("sec-websocket-key", "k"),
            ],
            want: Ok(("echo", Some("WebSocket"))),
            left: &["host: echo", "sec-websocket-key: k"],
        },
        Case {
            what: "h2c upgrade: dropped, served as HTTP/1.1",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[
                ("host", "echo"),
                ("connection", "Upgrade, HTTP2-Settings"),
                ("upgrade", "h2c"),
                ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ],
            want: Ok(("echo", None)),
            left: &["host: echo"],
        },
        Case {
            what: "h2c upgrade in upper case: dropped too",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[
                ("host", "echo"),
                ("connection", "upgrade"),
                ("upgrade", "H2C"),
            ],
            want: Ok(("echo", None)),
            left: &["host: echo"],
        },
        Case {
            what: "an upgrade not allowed",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[
                ("host", "echo"),
                ("connection", "upgrade"),
                ("upgrade", "echo"),
            ],
            want: refused(Refused::Upgrade("echo".into())),
            left: &[],
        },
        Case {
            what: "h2c listed beside websocket: not one allowed protocol",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[
                ("host", "echo"),
                ("connection", "upgrade"),
                ("upgrade", "h2c, websocket"),
            ],
            want: refused(Refused::Upgrade("h2c, websocket".into())),
            left: &[],
        },
        Case {
            what: "Upgrade without Connection: upgrade is only a hop-by-hop header",
            version: V11,
            method: "GET",
            target: "/",
            headers: &[("host", "echo"), ("upgrade", "echo")],
            want: Ok(("echo", None)),
            left: &["host: echo"],
        },
        Case {
            what: "CONNECT inside the tunnel",
            version: V11,
            method: "CONNECT",
            target: "elsewhere:443",
            headers: &[("host", "elsewhere:443")],
            want: refused(Refused::Connect),
            left: &[],
        },
    ];
    let upgrades = UpgradeTypes::default();
    for c in &cases {
        let (got, left) = run(c, &upgrades);
        let got = got.map(|h| {
            (
                h.authority,
                h.upgrade.map(|u| u.to_str().unwrap().to_string()),
            )
        });
        let want = c
            .want
            .clone()
            .map(|(a, u)| (a.to_string(), u.map(str::to_string)));
        assert_eq!(got, want, "{}", c.what);
        if got.is_ok() {
            assert_eq!(left, c.left, "{}", c.what);
        }
    }
}

#[test]
fn upgrade_types_are_configured_and_never_h2c() {
    let echo = UpgradeTypes::parse("websocket, Echo").unwrap();
    assert_eq!(echo.names(), ["websocket", "echo"]);
    assert!(echo.allows("ECHO"));
    assert!(!echo.allows("h2c"));
    assert!(UpgradeTypes::parse("").unwrap().names().is_empty());
    for bad in ["h2c", "websocket,H2C", "web socket", "a/b"] {
        assert!(UpgradeTypes::parse(bad).is_err(), "{bad}");
    }
    // An upgrade the default does not allow, allowed by a list.
    let case = Case {
        what: "echo allowed",
        version: V11,
        method: "GET",
        target: "/",
        headers: &[
            ("host", "echo"),
            ("connection", "upgrade"),
            ("upgrade", "echo"),
        ],
        want: Ok(("echo", Some("echo"))),
        left: &["host: echo"],
    };
    let (got, left) = run(&case, &echo);
    assert_eq!(got.unwrap().upgrade.unwrap(), "echo");
    assert_eq!(left, case.left);
}
