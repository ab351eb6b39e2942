//! A DestinationRule as it is written (`networking.istio.io/v1`, `v1beta1`, `v1alpha3`
//! share it): every field Istio defines, unknown fields refused (a misspelt
//! `consecutive5xxErrors` left out would eject nothing). Fields the waypoint does not apply
//! are read to be skipped (tuning it does not need) or refused by name (they change what
//! is sent); [`crate::dr_translate`] says which.

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::schema::{Metadata, TargetRef};
use crate::values::Text;

// Fields read only to be skipped are never used after reading.

#[allow(dead_code)] // apiVersion and kind are read from the document's header
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct DestinationRuleObject {
    pub api_version: Text,
    pub kind: Text,
    pub metadata: Metadata,
    pub spec: Option<DestinationRuleSpec>,
    pub status: Option<IgnoredAny>,
}

#[allow(dead_code)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct DestinationRuleSpec {
    pub host: Option<Text>,
    pub target_refs: Option<Vec<TargetRef>>,
    pub traffic_policy: Option<TrafficPolicyFields>,
    /// Only a route naming a subset uses one; HTTPRoutes cannot.
    pub subsets: Option<IgnoredAny>,
    pub export_to: Option<Vec<Text>>,
    pub workload_selector: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TrafficPolicyFields {
    pub load_balancer: Option<LoadBalancerFields>,
    pub connection_pool: Option<ConnectionPoolFields>,
    pub outlier_detection: Option<OutlierFields>,
    pub tls: Option<TlsFields>,
    pub port_level_settings: Option<Vec<PortLevelFields>>,
    pub tunnel: Option<IgnoredAny>,
    pub proxy_protocol: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PortLevelFields {
    pub port: Option<PortSelector>,
    pub load_balancer: Option<LoadBalancerFields>,
    pub connection_pool: Option<ConnectionPoolFields>,
    pub outlier_detection: Option<OutlierFields>,
    pub tls: Option<TlsFields>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PortSelector {
    pub number: Option<i64>,
}

#[allow(dead_code)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct LoadBalancerFields {
    pub simple: Option<Text>,
    pub consistent_hash: Option<ConsistentHashFields>,
    /// Locality is ranked by WDS's own preferences.
    pub locality_lb_setting: Option<IgnoredAny>,
    pub warmup_duration_secs: Option<IgnoredAny>,
    pub warmup: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ConsistentHashFields {
    pub http_header_name: Option<Text>,
    pub http_cookie: Option<CookieFields>,
    pub use_source_ip: Option<bool>,
    pub http_query_parameter_name: Option<Text>,
    pub ring_hash: Option<RingHashFields>,
    pub maglev: Option<MaglevFields>,
    pub minimum_ring_size: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CookieFields {
    pub name: Text,
    pub path: Option<Text>,
    pub ttl: Option<Text>,
    /// Newer Istio: extra attributes for a generated cookie; refused by name.
    pub attributes: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RingHashFields {
    pub minimum_ring_size: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MaglevFields {
    pub table_size: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ConnectionPoolFields {
    pub tcp: Option<TcpPoolFields>,
    pub http: Option<HttpPoolFields>,
}

#[allow(dead_code)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TcpPoolFields {
    pub max_connections: Option<i64>,
    pub connect_timeout: Option<Text>,
    pub tcp_keepalive: Option<IgnoredAny>,
    pub max_connection_duration: Option<IgnoredAny>,
    pub idle_timeout: Option<IgnoredAny>,
}

#[allow(dead_code)]
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HttpPoolFields {
    pub http1_max_pending_requests: Option<i64>,
    pub http2_max_requests: Option<i64>,
    pub max_requests_per_connection: Option<i64>,
    pub max_retries: Option<i64>,
    pub idle_timeout: Option<IgnoredAny>,
    pub h2_upgrade_policy: Option<IgnoredAny>,
    pub use_client_protocol: Option<IgnoredAny>,
    pub max_concurrent_streams: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct OutlierFields {
    pub consecutive_errors: Option<i64>,
    pub split_external_local_origin_errors: Option<bool>,
    pub consecutive_local_origin_failures: Option<i64>,
    pub consecutive_gateway_errors: Option<i64>,
    #[serde(rename = "consecutive5xxErrors")]
    pub consecutive_5xx_errors: Option<i64>,
    pub interval: Option<Text>,
    pub base_ejection_time: Option<Text>,
    pub max_ejection_percent: Option<i64>,
    pub min_health_percent: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TlsFields {
    pub mode: Option<Text>,
    pub client_certificate: Option<Text>,
    pub private_key: Option<Text>,
    pub ca_certificates: Option<Text>,
    pub credential_name: Option<Text>,
    pub subject_alt_names: Option<Vec<Text>>,
    pub sni: Option<Text>,
    pub insecure_skip_verify: Option<bool>,
    pub ca_crl: Option<Text>,
}
