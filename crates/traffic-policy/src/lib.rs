//! Istio's DestinationRule `trafficPolicy` as the waypoint applies it, sans-IO:
//!
//! - the model ([`TrafficPolicy`], per port [`PortPolicy`]): the load balancer, the
//!   connection pool limits and outlier detection, with Istio's defaults;
//! - [`hash`]: consistent hashing, ring hash and Maglev, deterministic (the same key goes
//!   to the same endpoint in every waypoint replica and after a restart) and moving only
//!   the keys of an endpoint that leaves;
//! - [`outlier`]: consecutive 5xx / gateway / local-origin failures ejecting an endpoint
//!   for a growing time, bounded by the share of the pool that may be ejected;
//! - [`pick`]: round robin and least request (the power of two choices).
//!
//! Time and random draws are passed in; nothing here does IO.
#![forbid(unsafe_code)]

pub mod hash;
pub mod outlier;
pub mod pick;

use std::time::Duration;

use http::header::HeaderName;

/// A DestinationRule's traffic policy: one for every port, with `portLevelSettings`
/// replacing it whole on the ports they name (Istio inherits nothing from the top level
/// into a port's settings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrafficPolicy {
    pub default: PortPolicy,
    /// `portLevelSettings`, by service port; each port once.
    pub ports: Vec<(u16, PortPolicy)>,
}

impl TrafficPolicy {
    /// The policy of service port `port`.
    pub fn for_port(&self, port: u16) -> &PortPolicy {
        self.ports
            .iter()
            .find(|(p, _)| *p == port)
            .map_or(&self.default, |(_, policy)| policy)
    }
}

/// What applies to the requests to one service port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortPolicy {
    pub load_balancer: LoadBalancer,
    pub connection_pool: ConnectionPool,
    /// `outlierDetection`; `None`: no endpoint is ever ejected.
    pub outlier: Option<OutlierDetection>,
    /// `tls` with mode `SIMPLE` or `MUTUAL`: TLS originated to endpoints outside the mesh.
    /// `None` for `DISABLE` and `ISTIO_MUTUAL` (mesh endpoints are reached over HBONE,
    /// mutual TLS already).
    pub tls: Option<ClientTls>,
}

/// `tls`: TLS originated by the waypoint to an endpoint outside the mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// `MUTUAL`: with a client certificate.
    pub client_identity: Option<ClientIdentity>,
    /// `sni`; not written: the host the endpoint was resolved from (a ServiceEntry's),
    /// else the Service's hostname.
    pub sni: Option<String>,
    /// `subjectAltNames`: the server's certificate must name one; empty: it must name
    /// the SNI.
    pub subject_alt_names: Vec<String>,
    /// `caCertificates`: the roots, a PEM file; not written: the system's.
    pub ca_certificates: Option<std::path::PathBuf>,
    /// `insecureSkipVerify`: no check of the server's certificate at all.
    pub insecure_skip_verify: bool,
}

/// `clientCertificate` and `privateKey`: PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub certificate: std::path::PathBuf,
    pub private_key: std::path::PathBuf,
}

/// `loadBalancer`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LoadBalancer {
    /// `LEAST_REQUEST`, also what `UNSPECIFIED` (or no `loadBalancer`) means: Istio's
    /// default.
    #[default]
    LeastRequest,
    RoundRobin,
    /// `RANDOM`: weighted by the endpoints' capacity.
    Random,
    ConsistentHash(ConsistentHash),
}

/// `consistentHash`: the key and the algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsistentHash {
    pub key: HashKey,
    pub algorithm: HashAlgorithm,
}

/// What a request is hashed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// `httpHeaderName`: the header's value (all of its values, comma-joined). A request
    /// without it gets no hash: it is balanced as `RANDOM`, as Envoy does.
    Header(HeaderName),
    /// `httpCookie`.
    Cookie(CookieKey),
    /// `useSourceIp`: the caller's address as the waypoint sees it.
    SourceIp,
    /// `httpQueryParameterName`: the parameter's first value.
    QueryParameter(String),
}

/// `httpCookie`: hash on a cookie; with a `ttl`, generate it when the request has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieKey {
    pub name: String,
    /// `path`: sent with a generated cookie.
    pub path: Option<String>,
    /// `ttl`: when written, a request without the cookie gets one (`Max-Age` of the TTL;
    /// `0s`: a session cookie). Not written: a request without it gets no hash.
    pub ttl: Option<Duration>,
}

/// The consistent hashing algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashAlgorithm {
    /// `ringHash` (also the default, and the deprecated `minimumRingSize`).
    RingHash { minimum_ring_size: u64 },
    /// `maglev`: a prime `tableSize`.
    Maglev { table_size: u64 },
}

/// Ring hash's default ring size (Istio's and Envoy's).
pub const DEFAULT_RING_SIZE: u64 = 1024;
/// The largest ring built, whatever `minimumRingSize` asks (Envoy's maximum).
pub const MAX_RING_SIZE: u64 = 8 * 1024 * 1024;
/// Maglev's default table size.
pub const DEFAULT_MAGLEV_TABLE: u64 = 65537;
/// Maglev tables are smaller than this (Istio's CRD bound).
pub const MAX_MAGLEV_TABLE: u64 = 5_000_011;

impl Default for HashAlgorithm {
    fn default() -> Self {
        HashAlgorithm::RingHash {
            minimum_ring_size: DEFAULT_RING_SIZE,
        }
    }
}

/// `connectionPool`, as Envoy's circuit breakers apply it: the limits hold for the
/// destination (service and port) as a whole at this waypoint, not per endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionPool {
    /// `tcp.maxConnections`: the onward HTTP/1.1 connections in use, each carrying one
    /// request at a time: so requests in flight (default unlimited).
    pub max_connections: u32,
    /// `http.http2MaxRequests`: requests in flight (default unlimited).
    pub max_requests: u32,
    /// `http.http1MaxPendingRequests`: requests waiting for a free place; one more is
    /// answered 503 with flag `UO` (default unlimited).
    pub max_pending_requests: u32,
    /// `http.maxRetries`: retries in flight; past it a retry is not made (default
    /// unlimited).
    pub max_retries: u32,
    /// `tcp.connectTimeout` (Istio's default: 10 s).
    pub connect_timeout: Duration,
}

/// What "unlimited" is in Istio's fields (2^32 - 1).
pub const UNLIMITED: u32 = u32::MAX;
/// `tcp.connectTimeout` when not written.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ConnectionPool {
    fn default() -> Self {
        ConnectionPool {
            max_connections: UNLIMITED,
            max_requests: UNLIMITED,
            max_pending_requests: UNLIMITED,
            max_retries: UNLIMITED,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

impl ConnectionPool {
    /// Requests that may be in flight at once.
    pub fn max_in_flight(&self) -> u32 {
        self.max_connections.min(self.max_requests)
    }

    /// True when no limit on requests is set (the pool need not count them).
    pub fn is_unlimited(&self) -> bool {
        self.max_in_flight() == UNLIMITED
    }
}

/// `outlierDetection`, with Istio's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierDetection {
    /// `consecutive5xxErrors` (default 5; 0 turns it off).
    pub consecutive_5xx: u32,
    /// `consecutiveGatewayErrors` (502, 503, 504; default 0: off).
    pub consecutive_gateway: u32,
    /// `splitExternalLocalOriginErrors`: count connection failures apart from answers.
    pub split_local_origin: bool,
    /// `consecutiveLocalOriginFailures` (default 5), when split.
    pub consecutive_local_origin: u32,
    /// `interval` (default 10 s): how often an ejection's multiplier shrinks again.
    pub interval: Duration,
    /// `baseEjectionTime` (default 30 s), times the endpoint's ejections so far.
    pub base_ejection_time: Duration,
    /// `maxEjectionPercent` (default 10): no ejection once this share is ejected.
    pub max_ejection_percent: u32,
    /// `minHealthPercent` (default 0): below this share available, ejections are ignored.
    pub min_health_percent: u32,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_5xx: 5,
            consecutive_gateway: 0,
            split_local_origin: false,
            consecutive_local_origin: 5,
            interval: Duration::from_secs(10),
            base_ejection_time: Duration::from_secs(30),
            max_ejection_percent: 10,
            min_health_percent: 0,
        }
    }
}

/// The longest an ejection lasts, however often the endpoint was ejected (Envoy's
/// `max_ejection_time` default).
pub const MAX_EJECTION_TIME: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_level_settings_replace_the_default_whole() {
        let port = PortPolicy {
            load_balancer: LoadBalancer::RoundRobin,
            ..PortPolicy::default()
        };
        let policy = TrafficPolicy {
            default: PortPolicy {
                load_balancer: LoadBalancer::Random,
                outlier: Some(OutlierDetection::default()),
                ..PortPolicy::default()
            },
            ports: vec![(8080, port.clone())],
        };
        assert_eq!(policy.for_port(8080), &port);
        assert_eq!(policy.for_port(80).load_balancer, LoadBalancer::Random);
        assert!(policy.for_port(8080).outlier.is_none(), "nothing inherited");
    }

    #[test]
    fn the_pool_limits_requests_by_the_smaller_limit() {
        let pool = ConnectionPool {
            max_connections: 3,
            max_requests: 10,
            ..ConnectionPool::default()
        };
        assert_eq!(pool.max_in_flight(), 3);
        assert!(!pool.is_unlimited());
        assert!(ConnectionPool::default().is_unlimited());
    }
}
