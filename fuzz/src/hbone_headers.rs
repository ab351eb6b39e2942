//! The `hbone_headers` target: HBONE request metadata, the `:authority`, `baggage`,
//! `forwarded` and `traceparent` parsers, and `validate` on a CONNECT request head built
//! from the input.

use std::net::SocketAddr;

use ambit_hbone::headers::{BAGGAGE, FORWARDED, TRACEPARENT, X_FORWARDED_NETWORK};
use ambit_hbone::{
    forwarded_host, forwarded_value, parse_authority, validate, Baggage, ConnectRequest,
    TraceParent,
};
use http::header::{HeaderName, HeaderValue};
use http::{Method, StatusCode};

/// What the input came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The whole text as an authority, shown.
    pub authority: Option<String>,
    /// The whole text as `baggage` lines.
    pub baggage: Baggage,
    /// The host of the whole text as a `forwarded` header.
    pub forwarded_host: Option<String>,
    /// How many lines are a valid `traceparent`.
    pub traceparents: usize,
    /// The input as a request head: `None` when `http` cannot build it, else what
    /// `validate` understood or the status it refused with.
    pub request: Option<Result<Request, u16>>,
}

/// What `validate` understood of a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub authority: String,
    pub baggage: Option<Baggage>,
    pub forwarded_host: Option<String>,
    pub traceparent: bool,
    pub forwarded_network: Option<String>,
}

/// Input: text; invalid UTF-8 is replaced (the header parsers take `&str`). For `validate`
/// the raw bytes are split into lines: line 0 is the method, line 1 the authority (or a full
/// URI, so schemes and paths are seen too), every further line a header whose first byte
/// `% 5` picks the name (`baggage`, `traceparent`, `forwarded`, `x-forwarded-network`,
/// `x-other`).
///
/// Checks: authority display → parse round trip, and `ConnectRequest::to_http` →
/// `validate` gives the same authority; baggage formats as a valid header value that parses
/// back to the same metadata; `forwarded_value` → `forwarded_host` returns the host (minus
/// the characters `forwarded_value` drops); a traceparent has non-zero ids and round-trips;
/// `validate` refuses with 400 only, its authority matches `parse_authority`, and the
/// request rebuilt from what was understood validates to the same.
pub fn run(data: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(data);
    let authority = authority(&text);
    let baggage = baggage(&text);
    let host = forwarded(&text);
    let mut traceparents = 0;
    for line in text.split('\n') {
        forwarded(line);
        traceparents += usize::from(traceparent(line));
    }
    Outcome {
        authority,
        baggage,
        forwarded_host: host,
        traceparents,
        request: connect_request(data),
    }
}

/// `parse_authority`: whatever parses displays as something that parses to the same value,
/// and a request built for it validates to the same value.
fn authority(s: &str) -> Option<String> {
    let a = parse_authority(s).ok()?;
    let shown = a.to_string();
    assert_eq!(
        parse_authority(&shown).as_ref(),
        Ok(&a),
        "display round trip of {s:?} via {shown:?}"
    );
    // `to_http` may refuse an authority `http` cannot carry; it must not panic, and what it
    // builds must validate back to the same target.
    if let Ok(req) = ConnectRequest::new(a.clone()).to_http() {
        let v = validate(&req.into_parts().0)
            .unwrap_or_else(|e| panic!("own request for {s:?} rejected: {e}"));
        assert_eq!(v.authority, a, "{s:?}");
    }
    Some(shown)
}

/// `Baggage::parse` over several header lines; the value it formats is a valid header value
/// and parses back to the same metadata.
fn baggage(s: &str) -> Baggage {
    let b = Baggage::parse(s.split('\n'));
    let v = b.to_header_value();
    assert!(HeaderValue::from_str(&v).is_ok(), "{s:?} formats as {v:?}");
    assert_eq!(Baggage::parse([v.as_str()]), b, "{s:?} via {v:?}");
    let _ = b.is_empty();
    b
}

/// `forwarded_host`; a host it returns survives `forwarded_value` (minus the characters
/// `forwarded_value` documents it drops).
fn forwarded(s: &str) -> Option<String> {
    let host = forwarded_host(s)?;
    assert!(!host.is_empty());
    let client: SocketAddr = "[2001:db8::1]:4444".parse().expect("literal");
    let built = forwarded_value(client, Some(&host));
    assert!(
        HeaderValue::from_str(&built).is_ok(),
        "{host:?} builds {built:?}"
    );
    // Past 8192 bytes `forwarded_host` stops looking (quoting can double the length).
    if built.len() > 8192 {
        return Some(host);
    }
    let kept: String = host
        .chars()
        .filter(|c| c.is_ascii() && (*c == ' ' || c.is_ascii_graphic()))
        .collect();
    let expected = (!kept.is_empty()).then_some(kept);
    assert_eq!(forwarded_host(&built), expected, "{s:?} via {built:?}");
    Some(host)
}

/// `TraceParent::parse` round trip.
fn traceparent(s: &str) -> bool {
    let Ok(t) = TraceParent::parse(s) else {
        return false;
    };
    assert_ne!(t.trace_id, 0);
    assert_ne!(t.parent_id, 0);
    let shown = t.to_string();
    assert_eq!(TraceParent::parse(&shown), Ok(t), "{s:?} via {shown:?}");
    assert!(HeaderValue::from_str(&shown).is_ok());
    true
}

/// `validate` on a request head made of fuzz bytes (inputs `http` refuses are skipped).
fn connect_request(data: &[u8]) -> Option<Result<Request, u16>> {
    let mut lines = data.split(|&b| b == b'\n');
    let method = Method::from_bytes(lines.next()?).ok()?;
    let target = lines.next()?;
    // A CONNECT carries only an authority; anything else is tried as a full URI so that
    // `validate` also sees schemes and paths.
    let uri = match http::uri::Authority::try_from(target) {
        Ok(a) => {
            let mut p = http::uri::Parts::default();
            p.authority = Some(a);
            http::Uri::from_parts(p).ok()
        }
        Err(_) => http::Uri::try_from(target).ok(),
    };
    let uri = uri?;

    let mut req = http::Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = http::Version::HTTP_2;
    for line in lines.take(16) {
        let Some((&selector, value)) = line.split_first() else {
            continue;
        };
        let name = match selector % 5 {
            0 => HeaderName::from_static(BAGGAGE),
            1 => HeaderName::from_static(TRACEPARENT),
            2 => HeaderName::from_static(FORWARDED),
            3 => HeaderName::from_static(X_FORWARDED_NETWORK),
            _ => HeaderName::from_static("x-other"),
        };
        if let Ok(v) = HeaderValue::from_bytes(value) {
            req.headers_mut().append(name, v);
        }
    }
    let parts = req.into_parts().0;

    let v = match validate(&parts) {
        Ok(v) => v,
        Err(e) => {
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e}");
            let _ = e.to_string();
            return Some(Err(e.status.as_u16()));
        }
    };
    assert_eq!(parts.method, Method::CONNECT);
    let authority = parts
        .uri
        .authority()
        .expect("validated CONNECT has an authority");
    assert_eq!(
        parse_authority(authority.as_str()).as_ref(),
        Ok(&v.authority)
    );
    if let Some(n) = &v.forwarded_network {
        assert!(!n.is_empty() && n.trim() == n);
    }

    // Round trip: forward what was understood, validate it again.
    let baggage = v.baggage.clone().filter(|b| !b.is_empty());
    let again = ConnectRequest {
        authority: v.authority.clone(),
        baggage: baggage.clone(),
        forwarded: None,
        traceparent: v.traceparent,
    };
    if let Ok(req) = again.to_http() {
        let w = validate(&req.into_parts().0)
            .unwrap_or_else(|e| panic!("rebuilt request rejected: {e} ({v:?})"));
        assert_eq!(w.authority, v.authority);
        assert_eq!(w.baggage, baggage);
        assert_eq!(w.traceparent, v.traceparent);
    }
    Some(Ok(Request {
        authority: v.authority.to_string(),
        baggage: v.baggage,
        forwarded_host: v.forwarded_host,
        traceparent: v.traceparent.is_some(),
        forwarded_network: v.forwarded_network,
    }))
}
