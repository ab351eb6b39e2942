//! The answers the waypoint makes itself, as Envoy's waypoint words them (reference
//! waypoint.md §3.4): status, response flag, `response_code_details` and body, and how
//! one is shaped for a gRPC client (a trailers-only answer). Sans-IO.

use ambit_telemetry::ResponseFlag;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, StatusCode};

/// One answer made at the waypoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalReply {
    pub status: StatusCode,
    pub flag: ResponseFlag,
    /// The access log's `response_code_details` (and a gRPC answer's `grpc-message`).
    pub details: &'static str,
    /// The body to a non-gRPC client.
    pub body: &'static str,
}

impl LocalReply {
    const fn new(
        status: StatusCode,
        flag: ResponseFlag,
        details: &'static str,
        body: &'static str,
    ) -> LocalReply {
        LocalReply {
            status,
            flag,
            details,
            body,
        }
    }

    /// A reply whose body is also its details.
    const fn plain(status: StatusCode, flag: ResponseFlag, body: &'static str) -> LocalReply {
        LocalReply::new(status, flag, body, body)
    }

    /// A request HTTP does not allow, or one the waypoint cannot forward.
    pub const BAD_REQUEST: LocalReply =
        LocalReply::plain(StatusCode::BAD_REQUEST, ResponseFlag::None, "Bad Request");
    /// A method that is not upper case (Istio refuses it).
    pub const INVALID_METHOD: LocalReply = LocalReply::plain(
        StatusCode::BAD_REQUEST,
        ResponseFlag::None,
        "invalid method",
    );
    /// The client's body broke its framing: its fault, never retried.
    pub const BAD_REQUEST_BODY: LocalReply = LocalReply::new(
        StatusCode::BAD_REQUEST,
        ResponseFlag::DownstreamProtocolError,
        "http1.codec_error",
        "Bad Request",
    );
    /// Authorization policy denied the request.
    pub const DENIED: LocalReply = LocalReply::plain(
        StatusCode::FORBIDDEN,
        ResponseFlag::None,
        "RBAC: access denied",
    );
    /// Routes are attached to the Service and none matches.
    pub const NO_ROUTE: LocalReply = LocalReply::new(
        StatusCode::NOT_FOUND,
        ResponseFlag::NoRoute,
        "route_not_found",
        "",
    );
    /// The chosen rule cannot be served (unresolvable backend, all weights zero).
    pub const DIRECT_500: LocalReply = LocalReply::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        ResponseFlag::None,
        "direct_response",
        "",
    );
    /// No endpoint to send to.
    pub const NO_HEALTHY_UPSTREAM: LocalReply = LocalReply::plain(
        StatusCode::SERVICE_UNAVAILABLE,
        ResponseFlag::NoHealthyUpstream,
        "no healthy upstream",
    );
    /// Every onward connection attempt failed.
    pub const CONNECT_FAILURE: LocalReply = LocalReply::plain(
        StatusCode::SERVICE_UNAVAILABLE,
        ResponseFlag::UpstreamConnectionFailure,
        concat!(
            "upstream connect error or disconnect/reset before headers.",
            " reset reason: connection failure"
        ),
    );
    /// The onward connection ended before the response began.
    pub const CONNECTION_TERMINATION: LocalReply = LocalReply::plain(
        StatusCode::SERVICE_UNAVAILABLE,
        ResponseFlag::UpstreamConnectionTermination,
        concat!(
            "upstream connect error or disconnect/reset before headers.",
            " reset reason: connection termination"
        ),
    );
    /// The route's timeout, or the last try's, expired before the response began.
    pub const TIMEOUT: LocalReply = LocalReply::plain(
        StatusCode::GATEWAY_TIMEOUT,
        ResponseFlag::UpstreamRequestTimeout,
        "upstream request timeout",
    );
    /// The destination's connection pool is full: its requests in flight and waiting are
    /// at their DestinationRule's limits (Envoy's circuit breaker).
    pub const OVERFLOW: LocalReply = LocalReply::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ResponseFlag::UpstreamOverflow,
        "upstream_reset_before_response_started{overflow}",
        "upstream connect error or disconnect/reset before headers. reset reason: overflow",
    );
    /// A CORS preflight answered by a route's CORS filter (its headers added by the
    /// caller).
    pub const CORS_PREFLIGHT: LocalReply =
        LocalReply::new(StatusCode::OK, ResponseFlag::None, "cors_response", "");
    /// The upstream switched to a protocol the client did not ask for.
    pub const UPSTREAM_PROTOCOL_ERROR: LocalReply = LocalReply::plain(
        StatusCode::BAD_GATEWAY,
        ResponseFlag::UpstreamProtocolError,
        "upstream_protocol_error",
    );

    /// A redirect (its `Location` is added by the caller).
    pub fn redirect(status: u16) -> LocalReply {
        let status = StatusCode::from_u16(status)
            .ok()
            .filter(StatusCode::is_redirection)
            .unwrap_or(StatusCode::FOUND);
        LocalReply::new(status, ResponseFlag::None, "redirect", "")
    }

    /// A refusal with the status and body another decision gave (a JWT check, the
    /// request head's rules).
    pub fn refused(status: StatusCode, details: &'static str, body: &'static str) -> LocalReply {
        LocalReply::new(status, ResponseFlag::None, details, body)
    }

    /// The answer as sent to a client, gRPC or not.
    pub fn shape(&self, grpc: bool) -> Shaped {
        let mut headers = HeaderMap::new();
        if grpc {
            // A trailers-only answer: HTTP 200, the status in `grpc-status`, no body.
            let code = grpc_status_of(self.status);
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert("grpc-status", HeaderValue::from(code));
            if let Ok(v) = HeaderValue::from_str(self.details) {
                headers.insert("grpc-message", v);
            }
            return Shaped {
                status: StatusCode::OK,
                headers,
                body: Bytes::new(),
                grpc_status: Some(code),
            };
        }
        if !self.body.is_empty() {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        }
        Shaped {
            status: self.status,
            headers,
            body: Bytes::from_static(self.body.as_bytes()),
            grpc_status: None,
        }
    }
}

/// A local reply as it goes to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaped {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The `grpc-status` given to a gRPC client.
    pub grpc_status: Option<u32>,
}

/// The gRPC status Envoy gives a local reply of HTTP `status` (its `httpToGrpcStatus`).
pub fn grpc_status_of(status: StatusCode) -> u32 {
    match status.as_u16() {
        400 => 13,             // INTERNAL
        401 => 16,             // UNAUTHENTICATED
        403 => 7,              // PERMISSION_DENIED
        404 => 12,             // UNIMPLEMENTED
        429 | 502..=504 => 14, // UNAVAILABLE
        _ => 2,                // UNKNOWN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_carry_envoys_status_flag_and_words() {
        let cases: &[(LocalReply, u16, &str, &str)] = &[
            (LocalReply::NO_ROUTE, 404, "NR", ""),
            (LocalReply::DENIED, 403, "-", "RBAC: access denied"),
            (LocalReply::NO_HEALTHY_UPSTREAM, 503, "UH", "no healthy upstream"),
            (
                LocalReply::CONNECT_FAILURE,
                503,
                "UF",
                "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
            ),
            (
                LocalReply::CONNECTION_TERMINATION,
                503,
                "UC",
                "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
            ),
            (LocalReply::TIMEOUT, 504, "UT", "upstream request timeout"),
            (
                LocalReply::OVERFLOW,
                503,
                "UO",
                "upstream connect error or disconnect/reset before headers. reset reason: overflow",
            ),
            (LocalReply::UPSTREAM_PROTOCOL_ERROR, 502, "UPE", "upstream_protocol_error"),
            (LocalReply::BAD_REQUEST_BODY, 400, "DPE", "Bad Request"),
            (LocalReply::DIRECT_500, 500, "-", ""),
            (LocalReply::INVALID_METHOD, 400, "-", "invalid method"),
        ];
        for (reply, status, flag, body) in cases {
            assert_eq!(reply.status.as_u16(), *status, "{reply:?}");
            assert_eq!(reply.flag.as_str(), *flag, "{reply:?}");
            assert_eq!(reply.body, *body, "{reply:?}");
        }
    }

    #[test]
    fn a_grpc_client_gets_a_trailers_only_answer() {
        let cases: &[(LocalReply, u32)] = &[
            (LocalReply::BAD_REQUEST, 13),
            (LocalReply::DENIED, 7),
            (LocalReply::NO_ROUTE, 12),
            (LocalReply::NO_HEALTHY_UPSTREAM, 14),
            (LocalReply::UPSTREAM_PROTOCOL_ERROR, 14),
            (LocalReply::TIMEOUT, 14),
            (LocalReply::OVERFLOW, 14),
            (LocalReply::DIRECT_500, 2),
            (
                LocalReply::refused(StatusCode::UNAUTHORIZED, "jwt", "jwt"),
                16,
            ),
        ];
        for (reply, code) in cases {
            let shaped = reply.shape(true);
            assert_eq!(shaped.status, StatusCode::OK, "{reply:?}");
            assert_eq!(shaped.grpc_status, Some(*code), "{reply:?}");
            assert_eq!(shaped.headers["grpc-status"], code.to_string().as_str());
            assert_eq!(shaped.headers[CONTENT_TYPE], "application/grpc");
            assert_eq!(shaped.headers["grpc-message"], reply.details);
            assert!(shaped.body.is_empty(), "{reply:?}");
        }
    }

    #[test]
    fn a_plain_client_gets_the_status_and_text() {
        let shaped = LocalReply::DENIED.shape(false);
        assert_eq!(shaped.status, StatusCode::FORBIDDEN);
        assert_eq!(shaped.headers[CONTENT_TYPE], "text/plain");
        assert_eq!(&shaped.body[..], b"RBAC: access denied");
        assert_eq!(shaped.grpc_status, None);
        // An empty body has no content type.
        let shaped = LocalReply::NO_ROUTE.shape(false);
        assert_eq!(shaped.status, StatusCode::NOT_FOUND);
        assert!(shaped.headers.get(CONTENT_TYPE).is_none());
    }

    #[test]
    fn redirects_keep_a_redirect_status() {
        assert_eq!(
            LocalReply::redirect(301).status,
            StatusCode::MOVED_PERMANENTLY
        );
        assert_eq!(LocalReply::redirect(302).status, StatusCode::FOUND);
        // Not a redirect status: Envoy's default, 302.
        assert_eq!(LocalReply::redirect(200).status, StatusCode::FOUND);
        assert_eq!(LocalReply::redirect(99).status, StatusCode::FOUND);
    }
}
