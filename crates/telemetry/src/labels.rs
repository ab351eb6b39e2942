//! Istio's traffic label set and who reports it.

use prometheus_client::encoding::EncodeLabelSet;

/// Which side of the traffic reports: `source` is a node proxy's outbound side,
/// `destination` its inbound side, `waypoint` a waypoint (istiod's `SERVER_GATEWAY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reporter {
    Source,
    Destination,
    Waypoint,
}

impl Reporter {
    pub fn as_str(self) -> &'static str {
        match self {
            Reporter::Source => "source",
            Reporter::Destination => "destination",
            Reporter::Waypoint => "waypoint",
        }
    }
}

/// The traffic label set, in ztunnel's order. Missing values are `unknown`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabels {
    pub reporter: &'static str,
    pub source_workload: String,
    pub source_canonical_service: String,
    pub source_canonical_revision: String,
    pub source_workload_namespace: String,
    pub source_principal: String,
    pub source_app: String,
    pub source_version: String,
    pub source_cluster: String,
    pub destination_service: String,
    pub destination_service_namespace: String,
    pub destination_service_name: String,
    pub destination_workload: String,
    pub destination_canonical_service: String,
    pub destination_canonical_revision: String,
    pub destination_workload_namespace: String,
    pub destination_principal: String,
    pub destination_app: String,
    pub destination_version: String,
    pub destination_cluster: String,
    pub request_protocol: &'static str,
    pub response_flags: ResponseFlag,
    pub connection_security_policy: &'static str,
    /// `source_region`, `source_zone`, `destination_region`, `destination_zone`: present
    /// only once workload information was applied, as in ztunnel, so it comes last.
    #[prometheus(flatten)]
    pub locality: Vec<(&'static str, String)>,
}

pub const UNKNOWN: &str = "unknown";

impl TrafficLabels {
    pub fn new(reporter: Reporter) -> TrafficLabels {
        let u = || UNKNOWN.to_string();
        TrafficLabels {
            reporter: reporter.as_str(),
            source_workload: u(),
            source_canonical_service: u(),
            source_canonical_revision: u(),
            source_workload_namespace: u(),
            source_principal: u(),
            source_app: u(),
            source_version: u(),
            source_cluster: u(),
            destination_service: u(),
            destination_service_namespace: u(),
            destination_service_name: u(),
            destination_workload: u(),
            destination_canonical_service: u(),
            destination_canonical_revision: u(),
            destination_workload_namespace: u(),
            destination_principal: u(),
            destination_app: u(),
            destination_version: u(),
            destination_cluster: u(),
            request_protocol: "tcp",
            response_flags: ResponseFlag::None,
            connection_security_policy: UNKNOWN,
            locality: Vec::new(),
        }
    }

    /// Adds the four locality labels from the workloads' `region`/`zone` (`unknown` when
    /// a workload or its locality is not known).
    pub fn set_locality(&mut self, src: Option<(&str, &str)>, dst: Option<(&str, &str)>) {
        let value = |s: Option<&str>| or_unknown(s.unwrap_or(""));
        self.locality = vec![
            ("source_region", value(src.map(|l| l.0))),
            ("source_zone", value(src.map(|l| l.1))),
            ("destination_region", value(dst.map(|l| l.0))),
            ("destination_zone", value(dst.map(|l| l.1))),
        ];
    }

    /// Whether a side names a workload `gone(namespace, name)` says has left the mesh (its
    /// series are then dropped).
    pub fn names_one_of(&self, gone: impl Fn(&str, &str) -> bool) -> bool {
        gone(&self.source_workload_namespace, &self.source_workload)
            || gone(
                &self.destination_workload_namespace,
                &self.destination_workload,
            )
    }
}

/// A label value, `unknown` when empty.
pub fn or_unknown(s: &str) -> String {
    if s.is_empty() {
        UNKNOWN.to_string()
    } else {
        s.to_string()
    }
}

/// Why a connection or request failed: the `response_flags` label and the access log's
/// flags, one type for both proxies. The node proxy uses ztunnel's names (`DENY`,
/// `CONNECT`, ...); the waypoint uses Envoy's short flags (`NR`, `UF`, ...), as Istio's
/// Envoy waypoint reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResponseFlag {
    #[default]
    None,
    /// Denied by authorization policy (ztunnel).
    Deny,
    /// The upstream connection could not be made (ztunnel).
    Connect,
    /// A TLS handshake or peer identity failed (ztunnel).
    TlsFailure,
    /// The HTTP/2 layer failed (ztunnel).
    H2HandshakeFailure,
    /// A timeout dialing HBONE: likely a NetworkPolicy blocks port 15008 (ztunnel).
    NetworkPolicy,
    /// `NR`: routes are attached and none matched.
    NoRoute,
    /// `UH`: no healthy endpoint to send to.
    NoHealthyUpstream,
    /// `UF`: the onward connection failed, after any retries.
    UpstreamConnectionFailure,
    /// `UC`: the onward connection ended before the response began.
    UpstreamConnectionTermination,
    /// `UT`: the route's or the try's timeout expired.
    UpstreamRequestTimeout,
    /// `URX`: the retry limit was reached without an answer to give.
    UpstreamRetryLimitExceeded,
    /// `UPE`: the upstream broke HTTP (an upgrade to a protocol not asked for).
    UpstreamProtocolError,
    /// `DPE`: the client broke HTTP (bad body framing).
    DownstreamProtocolError,
    /// `UO`: the destination's connection pool (a DestinationRule's circuit breaker) was
    /// full.
    UpstreamOverflow,
}

impl ResponseFlag {
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseFlag::None => "-",
            ResponseFlag::Deny => "DENY",
            ResponseFlag::Connect => "CONNECT",
            ResponseFlag::TlsFailure => "TLS_FAILURE",
            ResponseFlag::H2HandshakeFailure => "H2_HANDSHAKE_FAILURE",
            ResponseFlag::NetworkPolicy => "NETWORK_POLICY",
            ResponseFlag::NoRoute => "NR",
            ResponseFlag::NoHealthyUpstream => "UH",
            ResponseFlag::UpstreamConnectionFailure => "UF",
            ResponseFlag::UpstreamConnectionTermination => "UC",
            ResponseFlag::UpstreamRequestTimeout => "UT",
            ResponseFlag::UpstreamRetryLimitExceeded => "URX",
            ResponseFlag::UpstreamProtocolError => "UPE",
            ResponseFlag::DownstreamProtocolError => "DPE",
            ResponseFlag::UpstreamOverflow => "UO",
        }
    }
}

impl std::fmt::Display for ResponseFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl prometheus_client::encoding::EncodeLabelValue for ResponseFlag {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_flags_are_written_as_their_short_names() {
        let cases = [
            (ResponseFlag::None, "-"),
            (ResponseFlag::Deny, "DENY"),
            (ResponseFlag::Connect, "CONNECT"),
            (ResponseFlag::TlsFailure, "TLS_FAILURE"),
            (ResponseFlag::H2HandshakeFailure, "H2_HANDSHAKE_FAILURE"),
            (ResponseFlag::NetworkPolicy, "NETWORK_POLICY"),
            (ResponseFlag::NoRoute, "NR"),
            (ResponseFlag::NoHealthyUpstream, "UH"),
            (ResponseFlag::UpstreamConnectionFailure, "UF"),
            (ResponseFlag::UpstreamConnectionTermination, "UC"),
            (ResponseFlag::UpstreamRequestTimeout, "UT"),
            (ResponseFlag::UpstreamRetryLimitExceeded, "URX"),
            (ResponseFlag::UpstreamProtocolError, "UPE"),
            (ResponseFlag::DownstreamProtocolError, "DPE"),
            (ResponseFlag::UpstreamOverflow, "UO"),
        ];
        for (flag, name) in cases {
            assert_eq!(flag.as_str(), name);
            assert_eq!(flag.to_string(), name);
            let mut labels = TrafficLabels::new(Reporter::Waypoint);
            labels.response_flags = flag;
            let mut registry = prometheus_client::registry::Registry::default();
            let family = prometheus_client::metrics::family::Family::<
                TrafficLabels,
                prometheus_client::metrics::counter::Counter,
            >::default();
            registry.register("t", "t", family.clone());
            family.get_or_create(&labels).inc();
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            assert!(
                text.contains(&format!("response_flags=\"{name}\"")),
                "{text}"
            );
        }
    }
}
