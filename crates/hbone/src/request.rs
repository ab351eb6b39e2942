//! The CONNECT request, sans-IO: building it (client) and validating it (server, steps 1-2 of
//! the server processing: method, then authority).

use http::header::HeaderValue;
use http::{Method, Request, StatusCode};

use crate::error::HeaderError;
use crate::headers::{
    forwarded_host, parse_authority, Authority, Baggage, TraceParent, BAGGAGE, FORWARDED,
    TRACEPARENT, X_FORWARDED_NETWORK,
};

pub use crate::status;

/// What a client asks for: the tunnel target plus telemetry headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The `:authority`: tunnel target.
    pub authority: Authority,
    /// Source workload metadata (`baggage`); omitted when `None` or empty.
    pub baggage: Option<Baggage>,
    /// A complete `forwarded` value, usually from [`crate::headers::forwarded_value`].
    pub forwarded: Option<String>,
    /// `traceparent`; usually [`TraceParent::random`] per outbound connection.
    pub traceparent: Option<TraceParent>,
}

impl ConnectRequest {
    /// A request for `authority` with no telemetry headers.
    pub fn new(authority: Authority) -> ConnectRequest {
        ConnectRequest {
            authority,
            baggage: None,
            forwarded: None,
            traceparent: None,
        }
    }

    /// The HTTP/2 request: method CONNECT, URI = authority only. h2 encodes it as classic
    /// CONNECT: `:method` and `:authority`, no `:scheme`, no `:path`.
    ///
    /// Fails only when a public field was filled with something that cannot go on the wire
    /// (an `Authority::Host` that is not a DNS name, a `forwarded` value with control bytes).
    pub fn to_http(&self) -> Result<Request<()>, HeaderError> {
        let authority = self.authority.to_string();
        if let Authority::Host { host, .. } = &self.authority {
            if !crate::headers::authority_is_dns_name(host) {
                return Err(HeaderError::InvalidHost(crate::headers::excerpt(
                    &authority,
                )));
            }
        }
        let uri_authority = http::uri::Authority::try_from(authority.as_str())
            .map_err(|_| HeaderError::InvalidHost(crate::headers::excerpt(&authority)))?;
        let uri = http::Uri::from_parts({
            let mut p = http::uri::Parts::default();
            p.authority = Some(uri_authority);
            p
        })
        .map_err(|_| HeaderError::InvalidHost(crate::headers::excerpt(&authority)))?;

        let mut req = Request::new(());
        *req.method_mut() = Method::CONNECT;
        *req.uri_mut() = uri;
        *req.version_mut() = http::Version::HTTP_2;
        let headers = req.headers_mut();
        if let Some(b) = &self.baggage {
            let v = b.to_header_value();
            if !v.is_empty() {
                let v = HeaderValue::try_from(v)
                    .map_err(|_| HeaderError::InvalidHeaderValue { name: BAGGAGE })?;
                headers.insert(BAGGAGE, v);
            }
        }
        if let Some(f) = &self.forwarded {
            let v = HeaderValue::from_str(f)
                .map_err(|_| HeaderError::InvalidHeaderValue { name: FORWARDED })?;
            headers.insert(FORWARDED, v);
        }
        if let Some(t) = &self.traceparent {
            let v = HeaderValue::try_from(t.to_string())
                .map_err(|_| HeaderError::InvalidHeaderValue { name: TRACEPARENT })?;
            headers.insert(TRACEPARENT, v);
        }
        Ok(req)
    }
}

/// Why a server refuses a CONNECT: the status to answer with and a reason for the logs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {reason}")]
pub struct Rejection {
    /// The HTTP status to send.
    pub status: StatusCode,
    /// Human-readable reason (for logs; not sent on the wire).
    pub reason: String,
}

impl Rejection {
    /// A rejection with `status` and `reason`.
    pub fn new(status: StatusCode, reason: impl Into<String>) -> Rejection {
        Rejection {
            status,
            reason: reason.into(),
        }
    }
}

/// A CONNECT that passed validation, with its telemetry headers parsed (leniently: a bad
/// telemetry header is ignored, never a reason to refuse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidatedConnect {
    /// The tunnel target.
    pub authority: Authority,
    /// Source workload metadata from every `baggage` line, if any was present.
    pub baggage: Option<Baggage>,
    /// `host=` from the first `forwarded` header: the destination service hostname.
    pub forwarded_host: Option<String>,
    /// The first valid `traceparent`.
    pub traceparent: Option<TraceParent>,
    /// `x-forwarded-network` (inner CONNECT of double HBONE).
    pub forwarded_network: Option<String>,
}

/// Server processing steps 1-2: method must be CONNECT (else 400); `:authority` must parse
/// as `ip:port` or `host:port` (else 400). A classic CONNECT has no path; one with a path
/// (extended CONNECT or a hand-built request) is refused with 400 too.
pub fn validate(req: &http::request::Parts) -> Result<ValidatedConnect, Rejection> {
    if req.method != Method::CONNECT {
        return Err(Rejection::new(
            status::BAD_REQUEST,
            format!(
                "method {} is not CONNECT",
                crate::headers::excerpt(req.method.as_str())
            ),
        ));
    }
    if req.uri.scheme().is_some() || req.uri.path_and_query().is_some() {
        return Err(Rejection::new(
            status::BAD_REQUEST,
            "CONNECT must carry only :authority (no :scheme, no :path)",
        ));
    }
    let Some(authority) = req.uri.authority() else {
        return Err(Rejection::new(status::BAD_REQUEST, "missing :authority"));
    };
    let authority = parse_authority(authority.as_str())
        .map_err(|e| Rejection::new(status::BAD_REQUEST, e.to_string()))?;

    let headers = &req.headers;
    let mut baggage_lines = headers
        .get_all(BAGGAGE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .peekable();
    let baggage = baggage_lines
        .peek()
        .is_some()
        .then(|| Baggage::parse(baggage_lines));
    let forwarded_host = headers
        .get(FORWARDED)
        .and_then(|v| v.to_str().ok())
        .and_then(forwarded_host);
    let traceparent = headers
        .get_all(TRACEPARENT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| TraceParent::parse(v).ok());
    let forwarded_network = headers
        .get(X_FORWARDED_NETWORK)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    Ok(ValidatedConnect {
        authority,
        baggage,
        forwarded_host,
        traceparent,
        forwarded_network,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::forwarded_value;

    fn parts(method: Method, uri: &str) -> http::request::Parts {
        let mut r = Request::new(());
        *r.method_mut() = method;
        *r.uri_mut() = uri.parse().unwrap();
        r.into_parts().0
    }

    #[test]
    fn build_minimal() {
        let req = ConnectRequest::new(parse_authority("10.0.0.1:8080").unwrap());
        let r = req.to_http().unwrap();
        assert_eq!(r.method(), Method::CONNECT);
        assert_eq!(r.uri().to_string(), "10.0.0.1:8080");
        assert!(r.uri().scheme().is_none());
        assert!(r.uri().path_and_query().is_none());
        assert!(r.headers().is_empty());
    }

    #[test]
    fn build_full_and_validate_round_trip() {
        let tp = TraceParent::random();
        let baggage = Baggage {
            cluster_id: Some("Kubernetes".into()),
            namespace: Some("default".into()),
            ..Default::default()
        };
        let req = ConnectRequest {
            authority: parse_authority("[ff06::c3]:80").unwrap(),
            baggage: Some(baggage.clone()),
            forwarded: Some(forwarded_value(
                "10.1.1.1:4000".parse().unwrap(),
                Some("svc.ns.svc.cluster.local"),
            )),
            traceparent: Some(tp),
        };
        let r = req.to_http().unwrap();
        assert_eq!(r.uri().to_string(), "[ff06::c3]:80");
        assert_eq!(
            r.headers()[BAGGAGE],
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default"
        );
        let v = validate(&r.into_parts().0).unwrap();
        assert_eq!(v.authority, req.authority);
        assert_eq!(v.baggage, Some(baggage));
        assert_eq!(
            v.forwarded_host.as_deref(),
            Some("svc.ns.svc.cluster.local")
        );
        assert_eq!(v.traceparent, Some(tp));
        assert_eq!(v.forwarded_network, None);
    }

    #[test]
    fn build_hostname_authority() {
        let req =
            ConnectRequest::new(parse_authority("remote.default.svc.cluster.local:8080").unwrap());
        let r = req.to_http().unwrap();
        assert_eq!(r.uri().to_string(), "remote.default.svc.cluster.local:8080");
        assert_eq!(
            validate(&r.into_parts().0).unwrap().authority,
            req.authority
        );
    }

    #[test]
    fn build_rejects_hand_made_garbage() {
        let req = ConnectRequest::new(Authority::Host {
            host: "bad host/".into(),
            port: 80,
        });
        assert!(req.to_http().is_err());
        let mut req = ConnectRequest::new(parse_authority("1.1.1.1:1").unwrap());
        req.forwarded = Some("a\r\nb".into());
        assert_eq!(
            req.to_http().unwrap_err(),
            HeaderError::InvalidHeaderValue { name: FORWARDED }
        );
    }

    #[test]
    fn non_connect_is_400() {
        for m in [Method::GET, Method::POST, Method::OPTIONS] {
            let e = validate(&parts(m, "http://10.0.0.1:80/")).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.reason.contains("not CONNECT"), "{e}");
        }
        // Even with a valid CONNECT-shaped URI.
        let e = validate(&parts(Method::GET, "10.0.0.1:80")).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn bad_authority_is_400() {
        for uri in ["example.com:0", "10.0.0.1:99999", "a_b:80", "[::1]:0"] {
            let r = http::Uri::try_from(uri);
            let Ok(uri) = r else { continue };
            let mut req = Request::new(());
            *req.method_mut() = Method::CONNECT;
            *req.uri_mut() = uri;
            let e = validate(&req.into_parts().0).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e}");
        }
        // Missing authority.
        let e = validate(&parts(Method::CONNECT, "/")).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        // Authority without a port.
        let mut p = http::uri::Parts::default();
        p.authority = Some("example.com".parse().unwrap());
        let mut req = Request::new(());
        *req.method_mut() = Method::CONNECT;
        *req.uri_mut() = http::Uri::from_parts(p).unwrap();
        let e = validate(&req.into_parts().0).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.reason.contains("no port"), "{e}");
        // A path is not classic CONNECT.
        let e = validate(&parts(Method::CONNECT, "http://10.0.0.1:80/x")).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn telemetry_headers_are_lenient() {
        let mut req = ConnectRequest::new(parse_authority("1.2.3.4:80").unwrap())
            .to_http()
            .unwrap();
        let h = req.headers_mut();
        h.append(BAGGAGE, HeaderValue::from_static("k8s.cluster.name=c1"));
        h.append(BAGGAGE, HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        h.append(
            BAGGAGE,
            HeaderValue::from_static("k8s.namespace.name=ns, junk"),
        );
        h.append(TRACEPARENT, HeaderValue::from_static("garbage"));
        h.append(
            TRACEPARENT,
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        h.append(FORWARDED, HeaderValue::from_static("nonsense"));
        h.append(X_FORWARDED_NETWORK, HeaderValue::from_static(" net-1 "));
        let v = validate(&req.into_parts().0).unwrap();
        let b = v.baggage.unwrap();
        assert_eq!(b.cluster_id.as_deref(), Some("c1"));
        assert_eq!(b.namespace.as_deref(), Some("ns"));
        assert_eq!(v.traceparent.unwrap().parent_id, 0x00f067aa0ba902b7);
        assert_eq!(v.forwarded_host, None);
        assert_eq!(v.forwarded_network.as_deref(), Some("net-1"));
    }
}
