//! HBONE request metadata: the `:authority`, `baggage`, `forwarded` and `traceparent`
//! parsers, and `validate` on a CONNECT request head built from the input.
//!
//! Input: text; invalid UTF-8 is replaced (the header parsers take `&str`). For `validate`
//! the raw bytes are split into lines: line 0 is the method, line 1 the authority (or a full
//! URI), every further line a header whose first byte picks the name.
#![no_main]

use std::net::SocketAddr;

use ambit_hbone::headers::{BAGGAGE, FORWARDED, TRACEPARENT, X_FORWARDED_NETWORK};
use ambit_hbone::{
    forwarded_host, forwarded_value, parse_authority, validate, Baggage, ConnectRequest,
    TraceParent,
};
use http::header::{HeaderName, HeaderValue};
use http::{Method, StatusCode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    authority(&text);
    baggage(&text);
    forwarded(&text);
    for line in text.split('\n') {
        forwarded(line);
        traceparent(line);
    }
    connect_request(data);
});

/// `parse_authority`: whatever parses displays as something that parses to the same value,
/// and a request built for it validates to the same value.
fn authority(s: &str) {
    let Ok(a) = parse_authority(s) else { return };
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
}

/// `Baggage::parse` over several header lines; the value it formats is a valid header value
/// and parses back to the same metadata.
fn baggage(s: &str) {
    let b = Baggage::parse(s.split('\n'));
    let v = b.to_header_value();
    assert!(HeaderValue::from_str(&v).is_ok(), "{s:?} formats as {v:?}");
    assert_eq!(Baggage::parse([v.as_str()]), b, "{s:?} via {v:?}");
    let _ = b.is_empty();
}

/// `forwarded_host`; a host it returns survives `forwarded_value` (minus the characters
/// `forwarded_value` documents it drops).
fn forwarded(s: &str) {
    let Some(host) = forwarded_host(s) else {
        return;
    };
    assert!(!host.is_empty());
    let client: SocketAddr = "[2001:db8::1]:4444".parse().expect("literal");
    let built = forwarded_value(client, Some(&host));
    assert!(
        HeaderValue::from_str(&built).is_ok(),
        "{host:?} builds {built:?}"
    );
    // Past 8192 bytes `forwarded_host` stops looking (quoting can double the length).
    if built.len() > 8192 {
        return;
    }
    let kept: String = host
        .chars()
        .filter(|c| c.is_ascii() && (*c == ' ' || c.is_ascii_graphic()))
        .collect();
    let expected = (!kept.is_empty()).then_some(kept);
    assert_eq!(forwarded_host(&built), expected, "{s:?} via {built:?}");
}

/// `TraceParent::parse` round trip.
fn traceparent(s: &str) {
    if let Ok(t) = TraceParent::parse(s) {
        assert_ne!(t.trace_id, 0);
        assert_ne!(t.parent_id, 0);
        let shown = t.to_string();
        assert_eq!(TraceParent::parse(&shown), Ok(t), "{s:?} via {shown:?}");
        assert!(HeaderValue::from_str(&shown).is_ok());
    }
}

/// `validate` on a request head made of fuzz bytes (inputs `http` refuses are skipped).
fn connect_request(data: &[u8]) {
    let mut lines = data.split(|&b| b == b'\n');
    let Some(Ok(method)) = lines.next().map(Method::from_bytes) else {
        return;
    };
    let Some(target) = lines.next() else { return };
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
    let Some(uri) = uri else { return };

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
            return;
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
    let Ok(req) = again.to_http() else { return };
    let w = validate(&req.into_parts().0)
        .unwrap_or_else(|e| panic!("rebuilt request rejected: {e} ({v:?})"));
    assert_eq!(w.authority, v.authority);
    assert_eq!(w.baggage, baggage);
    assert_eq!(w.traceparent, v.traceparent);
}
