//! The leaf values of an AuthorizationPolicy, each read by its own parser *inside* the YAML
//! deserializer, so that a refusal carries the value's line and column. Those the local
//! config shares (paths, methods, hosts, request principals, remote IPs, patterns) are the
//! state crate's own readers (`ambit_state::values`); the rest use its parsers too, so a
//! value is checked the same way wherever it is read.
//!
//! A value is a string, only a string: a YAML number, boolean or null is refused (the
//! Kubernetes API server refuses them in these fields too), so `ports: ["8080"]`.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use ambit_state::{Condition, IpBlock, StringMatch, Values};
use ipnet::IpNet;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

pub(crate) use ambit_state::values::{
    text_with, Host, Method, Path, Pattern, RemoteIp, RequestPrincipal,
};

/// A leaf type read with one of the parsers.
macro_rules! leaf {
    ($(#[$m:meta])* $name:ident, $out:ty, $expecting:literal, $parse:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub(crate) struct $name(pub $out);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                text_with(d, $expecting, $parse).map($name)
            }
        }
    };
}

leaf!(
    /// Any string.
    Text,
    String,
    "a string",
    |s| Ok(s.to_string())
);
leaf!(
    /// A peer principal (`cluster.local/ns/a/sa/b`, `*/sa/b`), without `spiffe://`.
    Principal,
    StringMatch,
    "a principal",
    principal
);
leaf!(
    /// `ns/sa`, or `sa` for the policy's namespace (not known yet).
    ServiceAccount,
    ServiceAccountRef,
    "a service account (namespace/name, or name)",
    service_account
);
leaf!(
    /// `ipBlocks`: an address or CIDR of the peer, as the L4 fields hold it.
    SourceIp,
    IpNet,
    "an IP address or CIDR",
    |s| IpBlock::parse(s).map(|b| b.net())
);
leaf!(Port, u16, "a port number", port);
leaf!(
    /// `spec.action`.
    ActionName,
    Action,
    "an action",
    action
);

/// `spec.action`, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Allow,
    Deny,
    Audit,
    Custom,
}

fn action(s: &str) -> Result<Action, String> {
    match s {
        "ALLOW" => Ok(Action::Allow),
        "DENY" => Ok(Action::Deny),
        "AUDIT" => Ok(Action::Audit),
        "CUSTOM" => Ok(Action::Custom),
        _ => Err(format!(
            "unknown action {s:?}; one of ALLOW, DENY, AUDIT, CUSTOM"
        )),
    }
}

/// A `serviceAccounts` entry before the policy's namespace is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceAccountRef {
    pub namespace: Option<String>,
    pub name: String,
}

/// The longest service account entry Istio's schema accepts.
const MAX_SERVICE_ACCOUNT: usize = 320;

/// `ns/sa` or `sa`: exact names only (Istio refuses wildcards here, and a third part).
fn service_account(s: &str) -> Result<ServiceAccountRef, String> {
    if s.chars().count() > MAX_SERVICE_ACCOUNT {
        return Err(format!(
            "a service account is at most {MAX_SERVICE_ACCOUNT} characters"
        ));
    }
    if s.contains('*') {
        return Err(format!(
            "service account {s:?} has a '*'; service accounts are exact names (use principals for patterns)"
        ));
    }
    let (namespace, name) = match s.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, s),
    };
    let ok = |part: &str| !part.is_empty() && !part.contains(['/', ' ']);
    if !ok(name) || !namespace.is_none_or(ok) {
        return Err(format!(
            "service account {s:?} must be <namespace>/<name>, or <name> for the policy's namespace"
        ));
    }
    Ok(ServiceAccountRef {
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    })
}

/// Reads a value as the state crate's condition reader reads the values of `key`, and
/// returns the typed value (the condition's one value). That reader is where `principals`
/// (no `spiffe://`) and ports (1-65535, as written) are checked.
fn via_condition(key: &str, s: &str) -> Result<Condition, String> {
    let json = serde_json::json!({ "key": key, "values": [s] });
    Condition::deserialize(json).map_err(|e| e.to_string())
}

fn principal(s: &str) -> Result<StringMatch, String> {
    match via_condition("source.principal", s)? {
        Condition::Text(
            _,
            Values {
                values: Some(mut v),
                ..
            },
        ) if v.len() == 1 => Ok(v.remove(0)),
        other => Err(format!("unexpected principal reading {other:?}")),
    }
}

fn port(s: &str) -> Result<u16, String> {
    match via_condition("destination.port", s)? {
        Condition::DestinationPort(Values {
            values: Some(v), ..
        }) if v.len() == 1 => Ok(v[0]),
        other => Err(format!("unexpected port reading {other:?}")),
    }
}

/// A map of strings (labels, annotations) that refuses a key written twice (Kubernetes
/// refuses it; which value was meant is unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StringMap(pub BTreeMap<String, String>);

impl<'de> Deserialize<'de> for StringMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V(PhantomData<()>);
        impl<'de> Visitor<'de> for V {
            type Value = StringMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StringMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(Text(key)) = map.next_key()? {
                    let Text(value) = map.next_value()?;
                    if out.contains_key(&key) {
                        return Err(de::Error::custom(format!("{key:?} is written twice")));
                    }
                    out.insert(key, value);
                }
                Ok(StringMap(out))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_accounts() {
        let sa = |ns: Option<&str>, name: &str| ServiceAccountRef {
            namespace: ns.map(str::to_string),
            name: name.to_string(),
        };
        assert_eq!(service_account("shop/web"), Ok(sa(Some("shop"), "web")));
        assert_eq!(service_account("web"), Ok(sa(None, "web")));
        for bad in [
            "",
            "/web",
            "shop/",
            "a/b/c",
            "web*",
            "*",
            "a b",
            &"x".repeat(321),
        ] {
            assert!(service_account(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn principals_and_ports_are_read_as_the_state_reads_them() {
        assert_eq!(
            principal("cluster.local/ns/a/sa/b"),
            Ok(StringMatch::Exact("cluster.local/ns/a/sa/b".into()))
        );
        assert_eq!(principal("*/sa/b"), Ok(StringMatch::Suffix("/sa/b".into())));
        let e = principal("spiffe://cluster.local/ns/a/sa/b").unwrap_err();
        assert!(e.contains("starts with \"spiffe://\""), "{e}");
        assert_eq!(port("8080"), Ok(8080));
        for bad in ["0", "65536", "080", "", "http", "-1"] {
            assert!(port(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn leaves_are_strings_only() {
        let e = yaml_serde::from_str::<Port>("8080")
            .unwrap_err()
            .to_string();
        assert!(e.contains("quote numbers"), "{e}");
        assert_eq!(
            yaml_serde::from_str::<Port>("\"8080\"").unwrap(),
            Port(8080)
        );
        let e = yaml_serde::from_str::<StringMap>("{a: x, a: y}").unwrap_err();
        assert!(e.to_string().contains("written twice"), "{e}");
    }
}
