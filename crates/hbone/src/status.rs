//! The status codes an HBONE server answers a CONNECT with, in the order the checks run.
//!
//! | status | meaning | when |
//! |---|---|---|
//! | 400 [`BAD_REQUEST`] | malformed request | method is not CONNECT; `:authority` missing or not `ip:port`/`host:port`; authority IP differs from the IP the connection arrived on (unless application tunnel or waypoint sandwich) |
//! | 503 [`UNAVAILABLE`] | cannot serve | local workload unknown; port cannot be resolved; target port is one of the proxy's own ports (loop guard: 15001, 15006, 15008, 15080 with SOCKS5); the upstream TCP connect failed |
//! | 401 [`DENIED`] | denied by policy | L4 authorization (RBAC) denied the client |
//! | 200 [`OK`] | tunnel established | sent **only after** the upstream TCP connection exists; bytes flow afterwards |
//!
//! A client treats anything but 200 as failure (`http status: <code>`).

use http::StatusCode;

/// 200: the upstream connection exists; the stream now carries the tunnel's bytes.
pub const OK: StatusCode = StatusCode::OK;
/// 400: not a CONNECT, bad or missing `:authority`, or destination IP mismatch.
pub const BAD_REQUEST: StatusCode = StatusCode::BAD_REQUEST;
/// 401: denied by authorization policy.
pub const DENIED: StatusCode = StatusCode::UNAUTHORIZED;
/// 503: unknown local workload, unresolvable or loop port, upstream connect failure.
pub const UNAVAILABLE: StatusCode = StatusCode::SERVICE_UNAVAILABLE;
