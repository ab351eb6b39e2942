//! The `baggage` header: workload metadata for telemetry, W3C baggage syntax.
//!
//! Wire format, in this order, empty values omitted:
//! `k8s.cluster.name=<cluster>,k8s.namespace.name=<ns>,k8s.<type>.name=<workload>,`
//! `service.name=<canonical name>,service.version=<canonical revision>,`
//! `cloud.region=<region>,cloud.availability_zone=<zone>`.
//!
//! Values are percent-encoded where the W3C grammar requires it (never for ordinary
//! Kubernetes names, so the output matches Istio's byte for byte) and decoded when parsed.

use std::fmt::Write as _;

const CLUSTER: &str = "k8s.cluster.name";
const NAMESPACE: &str = "k8s.namespace.name";
const SERVICE_NAME: &str = "service.name";
const SERVICE_VERSION: &str = "service.version";
const REGION: &str = "cloud.region";
const ZONE: &str = "cloud.availability_zone";

/// Most list members looked at across all header lines (W3C sets 180 as a floor for
/// implementations; we need 7).
const MAX_MEMBERS: usize = 180;
/// Longest workload type accepted (`deployment`, `cronjob`, `statefulset`, ...).
const MAX_TYPE_LEN: usize = 32;

/// Workload metadata carried in `baggage`. `workload_type` is the lower-case workload kind
/// (`deployment`, `cronjob`, `pod`, `job`, ...); the workload name is only emitted when the type
/// is set and is a plain lower-case token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Baggage {
    /// `k8s.cluster.name`
    pub cluster_id: Option<String>,
    /// `k8s.namespace.name`
    pub namespace: Option<String>,
    /// the `<type>` in `k8s.<type>.name`
    pub workload_type: Option<String>,
    /// `k8s.<type>.name`
    pub workload_name: Option<String>,
    /// `service.name` (canonical service name)
    pub service_name: Option<String>,
    /// `service.version` (canonical revision)
    pub service_version: Option<String>,
    /// `cloud.region`
    pub region: Option<String>,
    /// `cloud.availability_zone`
    pub zone: Option<String>,
}

impl Baggage {
    /// True when no field carries a value.
    pub fn is_empty(&self) -> bool {
        *self == Baggage::default() || self.to_header_value().is_empty()
    }

    /// Formats the header value (may be empty when nothing is set). Always a valid HTTP header
    /// value.
    pub fn to_header_value(&self) -> String {
        let mut out = String::new();
        let mut push = |key: &str, value: &Option<String>| {
            if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
                if !out.is_empty() {
                    out.push(',');
                }
                out.push_str(key);
                out.push('=');
                percent_encode_into(v, &mut out);
            }
        };
        push(CLUSTER, &self.cluster_id);
        push(NAMESPACE, &self.namespace);
        if let Some(t) = self
            .workload_type
            .as_deref()
            .filter(|t| is_workload_type(t))
        {
            push(&format!("k8s.{t}.name"), &self.workload_name);
        }
        push(SERVICE_NAME, &self.service_name);
        push(SERVICE_VERSION, &self.service_version);
        push(REGION, &self.region);
        push(ZONE, &self.zone);
        out
    }

    /// Parses one or more `baggage` header lines. Tolerant: unknown keys, W3C properties
    /// (`;k=v`), surrounding spaces, empty values and malformed members are ignored; a later
    /// value for the same key wins. Never fails.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Baggage {
        let mut b = Baggage::default();
        let members = values
            .into_iter()
            .flat_map(|line| line.split(','))
            .take(MAX_MEMBERS);
        for member in members {
            // Drop W3C member properties.
            let kv = member.split(';').next().unwrap_or_default();
            let Some((key, value)) = kv.split_once('=') else {
                continue;
            };
            let key = key.trim();
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            let value = percent_decode(value);
            match key {
                CLUSTER => b.cluster_id = Some(value),
                NAMESPACE => b.namespace = Some(value),
                SERVICE_NAME => b.service_name = Some(value),
                SERVICE_VERSION => b.service_version = Some(value),
                REGION => b.region = Some(value),
                ZONE => b.zone = Some(value),
                _ => {
                    if let Some(t) = key
                        .strip_prefix("k8s.")
                        .and_then(|k| k.strip_suffix(".name"))
                        .filter(|t| is_workload_type(t))
                    {
                        b.workload_type = Some(t.to_string());
                        b.workload_name = Some(value);
                    }
                }
            }
        }
        b
    }
}

/// A workload kind usable inside the key `k8s.<type>.name`: a lower-case token that is not one
/// of the other `k8s.*.name` keys.
fn is_workload_type(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= MAX_TYPE_LEN
        && t.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_')
        && t != "cluster"
        && t != "namespace"
}

/// W3C `baggage-octet`: visible ASCII except `"` `,` `;` `\` (and `%`, which we escape so
/// that decoding round-trips).
fn is_baggage_octet(c: u8) -> bool {
    matches!(c, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E) && c != b'%'
}

fn percent_encode_into(v: &str, out: &mut String) {
    for &c in v.as_bytes() {
        if is_baggage_octet(c) {
            out.push(char::from(c));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{c:02X}");
        }
    }
}

/// Decodes `%XX` escapes; malformed escapes are kept literally, invalid UTF-8 is replaced.
fn percent_decode(v: &str) -> String {
    if !v.contains('%') {
        return v.to_string();
    }
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| {
                let h = std::str::from_utf8(h).ok()?;
                u8::from_str_radix(h, 16)
                    .ok()
                    .filter(|_| h.bytes().all(|c| c.is_ascii_hexdigit()))
            });
            if let Some(byte) = hex {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Baggage {
        Baggage {
            cluster_id: Some("Kubernetes".into()),
            namespace: Some("default".into()),
            workload_type: Some("deployment".into()),
            workload_name: Some("productpage-v1".into()),
            service_name: Some("productpage".into()),
            service_version: Some("v1".into()),
            region: Some("us-east1".into()),
            zone: Some("us-east1-b".into()),
        }
    }

    #[test]
    fn format_order() {
        assert_eq!(
            full().to_header_value(),
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,\
             k8s.deployment.name=productpage-v1,service.name=productpage,service.version=v1,\
             cloud.region=us-east1,cloud.availability_zone=us-east1-b"
        );
    }

    #[test]
    fn empty_values_omitted() {
        let b = Baggage {
            cluster_id: Some("c".into()),
            namespace: Some(String::new()),
            workload_type: Some("pod".into()),
            workload_name: None,
            service_name: Some("s".into()),
            ..Default::default()
        };
        assert_eq!(b.to_header_value(), "k8s.cluster.name=c,service.name=s");
        assert_eq!(Baggage::default().to_header_value(), "");
        assert!(Baggage::default().is_empty());
        assert!(!b.is_empty());
    }

    #[test]
    fn round_trip() {
        let b = full();
        assert_eq!(Baggage::parse([b.to_header_value().as_str()]), b);
    }

    #[test]
    fn tolerant_parse() {
        let b = Baggage::parse([
            " k8s.cluster.name = c1 , junk, =x, k8s.namespace.name=",
            "k8s.job.name=j;prop=1, unknown.key=v, service.name=s,,",
            "service.version=v2,cloud.region=r,cloud.availability_zone=z",
            "k8s..name=bad,k8s.UPPER.name=bad,k8s.a.b.name=bad",
        ]);
        assert_eq!(
            b,
            Baggage {
                cluster_id: Some("c1".into()),
                namespace: None,
                workload_type: Some("job".into()),
                workload_name: Some("j".into()),
                service_name: Some("s".into()),
                service_version: Some("v2".into()),
                region: Some("r".into()),
                zone: Some("z".into()),
            }
        );
        assert_eq!(Baggage::parse([""]), Baggage::default());
        assert_eq!(Baggage::parse(std::iter::empty()), Baggage::default());
        assert_eq!(Baggage::parse([",,,===;;;"]), Baggage::default());
    }

    #[test]
    fn hostile_values_stay_inside_their_member() {
        let b = Baggage {
            cluster_id: Some("a,k8s.namespace.name=evil".into()),
            namespace: Some("ns;x=y \"q\" \\ %20 é\r\n".into()),
            workload_type: Some("pod,service.name=evil".into()),
            workload_name: Some("w".into()),
            service_name: Some("\u{0}".into()),
            ..Default::default()
        };
        let v = b.to_header_value();
        assert!(http::HeaderValue::from_str(&v).is_ok(), "{v}");
        // The bogus workload type is dropped, not injected.
        assert_eq!(v.split(',').count(), 3, "{v}");
        assert!(!v.contains("pod"), "{v}");
        let parsed = Baggage::parse([v.as_str()]);
        assert_eq!(parsed.cluster_id, b.cluster_id);
        assert_eq!(parsed.namespace, b.namespace);
        assert_eq!(parsed.service_name, b.service_name);
        assert_eq!(parsed.workload_type, None);
    }

    #[test]
    fn cluster_and_namespace_are_not_workload_types() {
        let b = Baggage {
            workload_type: Some("cluster".into()),
            workload_name: Some("x".into()),
            ..Default::default()
        };
        assert_eq!(b.to_header_value(), "");
    }

    #[test]
    fn malformed_escapes_kept() {
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("a%zz%41"), "a%zzA");
        assert_eq!(percent_decode("%+1"), "%+1");
        assert_eq!(percent_decode("%FF"), "\u{FFFD}");
        assert_eq!(percent_decode("%"), "%");
    }

    #[test]
    fn huge_input_is_bounded() {
        let line = "x=y,".repeat(100_000) + "service.name=late";
        // Members past the limit are not looked at.
        assert_eq!(Baggage::parse([line.as_str()]).service_name, None);
        let b = Baggage::parse(
            ["service.name=".to_string() + &"v".repeat(100_000)]
                .iter()
                .map(String::as_str),
        );
        assert_eq!(b.service_name.map(|s| s.len()), Some(100_000));
    }
}
