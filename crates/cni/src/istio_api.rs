//! The request Istio's CNI plugin sends its node agent, as ambit's agent serves it in
//! Kubernetes mode (reference §4.2). Types, encoding and parsing only: the plugin and the
//! agent bring their own transport.
//!
//! `POST http://unix/cmdadd` over `<CNI_AGENT_RUN_DIR>/pluginevent.sock`, JSON with Go's
//! default field names:
//!
//! ```text
//! {"Netns":"/var/run/netns/cni-…","PodName":"web-0","PodNamespace":"shop",
//!  "IPs":[{"Interface":0,"Address":{"IP":"10.1.0.5","Mask":"////AA=="},"Gateway":"10.1.0.1"}]}
//! ```
//!
//! `Mask` is the mask's bytes in base64 (Go's `[]byte`); the agent ignores it. The answer is
//! 200 (enrolled), 400 (the body is not such a request) or 500 (not eligible or the
//! enrollment failed), with the error text as the body.

use std::net::IpAddr;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The socket's file name under the agent's run directory.
pub const SOCKET_NAME: &str = "pluginevent.sock";
/// The request path.
pub const CMDADD_PATH: &str = "/cmdadd";
/// The largest body the agent reads (a pod has a handful of IPs; this is generous).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most IPs one request may carry.
pub const MAX_IPS: usize = 64;

/// The body of `POST /cmdadd`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CmdAddRequest {
    /// The CNI netns path as the runtime gave it (`CNI_NETNS`, e.g. `/var/run/netns/cni-…`).
    #[serde(rename = "Netns", default)]
    pub netns: String,
    #[serde(rename = "PodName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// `prevResult.ips`.
    #[serde(rename = "IPs", default, deserialize_with = "null_as_empty")]
    pub ips: Vec<IpConfig>,
}

/// One entry of `IPs` (the CNI result's `ips[]`, in Go's field names).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Index into the result's interfaces, if given.
    #[serde(rename = "Interface", default)]
    pub interface: Option<i64>,
    #[serde(rename = "Address")]
    pub address: IpNet,
    /// The gateway, `""` when none.
    #[serde(rename = "Gateway", default, deserialize_with = "null_as_empty")]
    pub gateway: String,
}

/// Go's `net.IPNet` as JSON: the address as text, the mask's bytes in base64.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IpNet {
    #[serde(rename = "IP")]
    pub ip: String,
    #[serde(rename = "Mask", default, deserialize_with = "null_as_empty")]
    pub mask: String,
}

fn null_as_empty<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Why a body is not a cmdadd request (a 400: the plugin's fault).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("empty cmdadd request body")]
    Empty,
    #[error("cmdadd request body larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("cmdadd request is not valid JSON of the expected shape: {0}")]
    Json(String),
    #[error("cmdadd request field {field} is empty")]
    EmptyField { field: &'static str },
    #[error("cmdadd request field IPs[{index}].Address.IP is not an IP address: {value:?}")]
    BadIp { index: usize, value: String },
    #[error("cmdadd request carries {0} IPs, more than {MAX_IPS}")]
    TooManyIps(usize),
}

impl IpConfig {
    /// An entry for `ip/prefix_len` with no interface index and no gateway.
    pub fn new(ip: IpAddr, prefix_len: u8) -> IpConfig {
        IpConfig {
            interface: None,
            address: IpNet {
                ip: ip.to_string(),
                mask: encode_mask(ip, prefix_len),
            },
            gateway: String::new(),
        }
    }
}

/// The mask's bytes in base64, as Go encodes a `net.IPMask` (4 bytes for IPv4, 16 for IPv6).
pub fn encode_mask(ip: IpAddr, prefix_len: u8) -> String {
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = u32::from(prefix_len).min(bits);
    let mask: u128 = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    let bytes = mask.to_be_bytes();
    let bytes = &bytes[..(bits / 8) as usize];
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl CmdAddRequest {
    /// The JSON body.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings and integers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The pod's addresses (masks ignored, IPv4-mapped IPv6 unmapped), in request order,
    /// without duplicates. Call [`parse`] first: unparsable entries are skipped here.
    pub fn addresses(&self) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for c in &self.ips {
            if let Ok(ip) = c.address.ip.parse::<IpAddr>() {
                let ip = ip.to_canonical();
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
        out
    }
}

/// Parses and checks a body: valid JSON, `PodName` and `PodNamespace` set, every
/// `IPs[].Address.IP` an address.
pub fn parse(body: &[u8]) -> Result<CmdAddRequest, ParseError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(ParseError::TooLarge);
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ParseError::Empty);
    }
    let req: CmdAddRequest =
        serde_json::from_slice(body).map_err(|e| ParseError::Json(e.to_string()))?;
    if req.pod_name.is_empty() {
        return Err(ParseError::EmptyField { field: "PodName" });
    }
    if req.pod_namespace.is_empty() {
        return Err(ParseError::EmptyField {
            field: "PodNamespace",
        });
    }
    if req.ips.len() > MAX_IPS {
        return Err(ParseError::TooManyIps(req.ips.len()));
    }
    for (index, c) in req.ips.iter().enumerate() {
        if c.address.ip.parse::<IpAddr>().is_err() {
            return Err(ParseError::BadIp {
                index,
                value: c.address.ip.clone(),
            });
        }
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_as_istios_plugin_writes_it() {
        let body = br#"{"Netns":"/var/run/netns/cni-1","PodName":"web-0","PodNamespace":"shop","IPs":[{"Interface":0,"Address":{"IP":"10.1.0.5","Mask":"////AA=="},"Gateway":"10.1.0.1"},{"Interface":null,"Address":{"IP":"::ffff:10.1.0.5","Mask":null},"Gateway":""},{"Address":{"IP":"fd00::5","Mask":"//////////////////////8="}}]}"#;
        let req = parse(body).unwrap();
        assert_eq!(req.netns, "/var/run/netns/cni-1");
        assert_eq!(
            (req.pod_name.as_str(), req.pod_namespace.as_str()),
            ("web-0", "shop")
        );
        assert_eq!(req.ips[0].interface, Some(0));
        assert_eq!(req.ips[0].gateway, "10.1.0.1");
        let want: Vec<IpAddr> = vec!["10.1.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        assert_eq!(req.addresses(), want);
    }

    #[test]
    fn encode_round_trips_with_gos_field_names_and_masks() {
        let req = CmdAddRequest {
            netns: "/var/run/netns/x".into(),
            pod_name: "a".into(),
            pod_namespace: "b".into(),
            ips: vec![
                IpConfig::new("10.0.0.1".parse().unwrap(), 24),
                IpConfig::new("fd00::1".parse().unwrap(), 64),
            ],
        };
        let text = String::from_utf8(req.encode()).unwrap();
        assert_eq!(
            text,
            r#"{"Netns":"/var/run/netns/x","PodName":"a","PodNamespace":"b","IPs":[{"Interface":null,"Address":{"IP":"10.0.0.1","Mask":"////AA=="},"Gateway":""},{"Interface":null,"Address":{"IP":"fd00::1","Mask":"//////////8AAAAAAAAAAA=="},"Gateway":""}]}"#
        );
        assert_eq!(parse(text.as_bytes()).unwrap(), req);
        assert_eq!(encode_mask("1.2.3.4".parse().unwrap(), 0), "AAAAAA==");
        assert_eq!(encode_mask("1.2.3.4".parse().unwrap(), 40), "/////w==");
    }

    #[test]
    fn bad_bodies_say_what_is_wrong() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"  \n", "empty"),
            (b"{", "not valid JSON"),
            (br#"{"PodNamespace":"b"}"#, "PodName"),
            (br#"{"PodName":"","PodNamespace":"b"}"#, "PodName is empty"),
            (br#"{"PodName":"a","PodNamespace":""}"#, "PodNamespace is empty"),
            (
                br#"{"PodName":"a","PodNamespace":"b","IPs":[{"Address":{"IP":"10.0.0.1"}},{"Address":{"IP":"nope"}}]}"#,
                "IPs[1].Address.IP",
            ),
            (br#"{"PodName":"a","PodNamespace":"b","IPs":[{}]}"#, "Address"),
            (br#"{"PodName":1,"PodNamespace":"b"}"#, "invalid type"),
        ];
        for (body, want) in cases {
            let err = parse(body).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{:?}: {err}",
                String::from_utf8_lossy(body)
            );
        }
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        assert_eq!(parse(&big), Err(ParseError::TooLarge));
        let many = format!(
            r#"{{"PodName":"a","PodNamespace":"b","IPs":[{}]}}"#,
            vec![r#"{"Address":{"IP":"10.0.0.1"}}"#; MAX_IPS + 1].join(",")
        );
        assert_eq!(
            parse(many.as_bytes()),
            Err(ParseError::TooManyIps(MAX_IPS + 1))
        );
    }

    #[test]
    fn null_ips_and_missing_netns_are_accepted() {
        let req = parse(br#"{"PodName":"a","PodNamespace":"b","IPs":null}"#).unwrap();
        assert!(req.ips.is_empty() && req.netns.is_empty());
    }
}
