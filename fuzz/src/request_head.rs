//! The `request_head` target: what `ambit waypoint` makes of a request head before any
//! decision (`ambit_waypoint::head::prepare`): the one authority, the hop-by-hop headers
//! removed, the one upgrade it may join, no client `x-forwarded-client-cert`.

use ambit_waypoint::head::{prepare, UpgradeTypes, XFCC};
use http::header::{CONNECTION, HOST, TE, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};

/// The head prepared: its authority and upgrade, or the refusal's variant.
pub type Outcome = Result<(String, Option<String>), String>;

/// Input: byte 0: bits 0-1 the version (HTTP/1.0, HTTP/1.1, HTTP/2, HTTP/2), bit 2
/// `AMBIT_UPGRADE_TYPES=websocket,echo` (else the default, `websocket`); the rest: text
/// (invalid UTF-8 replaced), lines split on `\n`: the method, the request target, then
/// `name: value` headers (a method, target or header `http` refuses ends the input
/// there: the server would have refused it first).
///
/// Checks, when prepared: no header the client named in `Connection` is left but `Host`;
/// no fixed hop-by-hop header, no `x-forwarded-client-cert`, `TE` only as `trailers`;
/// HTTP/1.x with an authority: exactly one `Host`, the authority; HTTP/2: no `Host`; the
/// authority is `host[:port]` without user information; an upgrade only on HTTP/1.1, one
/// the types allow, never `h2c`.
pub fn run(data: &[u8]) -> Outcome {
    let (flags, text) = match data {
        [f, rest @ ..] => (*f, String::from_utf8_lossy(rest)),
        [] => (1, Default::default()),
    };
    let version = [
        Version::HTTP_10,
        Version::HTTP_11,
        Version::HTTP_2,
        Version::HTTP_2,
    ][usize::from(flags & 3)];
    let types = if flags & 4 != 0 {
        UpgradeTypes::parse("websocket,echo").expect("a valid list")
    } else {
        UpgradeTypes::default()
    };
    let mut lines = text.split('\n');
    let Ok(method) = Method::from_bytes(lines.next().unwrap_or("GET").as_bytes()) else {
        return Err("Method".into());
    };
    let Ok(uri) = lines.next().unwrap_or("/").parse::<Uri>() else {
        return Err("Uri".into());
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            break;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) else {
            break;
        };
        headers.append(name, value);
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    let head = match prepare(version, &method, &uri, &mut headers, &types) {
        Ok(h) => h,
        Err(e) => {
            let _ = (e.to_string(), e.status(), e.details());
            return Err(crate::variant(&e));
        }
    };
    for n in named.iter().filter(|n| **n != HOST) {
        assert!(
            !headers.contains_key(n),
            "{n} was named in Connection and kept"
        );
    }
    for n in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "http2-settings",
    ] {
        assert!(!headers.contains_key(n), "hop-by-hop {n} kept");
    }
    assert!(!headers.contains_key(XFCC), "a client's XFCC kept");
    for te in headers.get_all(TE) {
        assert_eq!(te, "trailers", "TE kept");
    }
    let hosts: Vec<&HeaderValue> = headers.get_all(HOST).iter().collect();
    if version == Version::HTTP_2 {
        assert!(hosts.is_empty(), "HTTP/2 kept a Host: {hosts:?}");
    } else if !head.authority.is_empty() {
        assert_eq!(
            hosts,
            [head.authority.as_str()],
            "Host is not the authority"
        );
    }
    if !head.authority.is_empty() {
        assert!(!head.authority.contains('@'), "{:?}", head.authority);
        assert!(
            head.authority.parse::<http::uri::Authority>().is_ok(),
            "{:?}",
            head.authority
        );
    }
    let upgrade = head
        .upgrade
        .map(|u| String::from_utf8_lossy(u.as_bytes()).into_owned());
    if let Some(u) = &upgrade {
        assert_eq!(version, Version::HTTP_11, "an upgrade on {version:?}");
        assert!(types.allows(u), "{u} is not allowed");
        assert!(!u.eq_ignore_ascii_case("h2c"), "h2c joined");
    }
    // The onward hop gets the upgrade back only through `Head::upgrade`.
    assert!(!headers.contains_key(UPGRADE));
    Ok((head.authority, upgrade))
}
