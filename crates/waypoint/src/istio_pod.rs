//! The pod istiod renders for a waypoint Gateway, read in ambit's names: istiod sets
//! `CA_ADDR` (host:port), `PROXY_CONFIG` (ProxyConfig as JSON or YAML, whose
//! `discoveryAddress` is the xDS server), `ISTIO_META_CLUSTER_ID` and `ISTIO_META_NETWORK`,
//! and mounts the pod's labels (the Gateway's name and class among them) at
//! `/etc/istio/pod/labels`. Where ambit's own variable is set too, ambit's wins: it is the
//! more specific setting, and Istio's template never sets it.
//!
//! Sans IO: the labels file's text is handed in.

use std::collections::HashMap;

use ambit_process::env::Env;
use ambit_process::ConfigError;

/// Where Istio mounts the pod's downward-API files (`AMBIT_POD_INFO_DIR` overrides it).
pub const DEFAULT_POD_INFO_DIR: &str = "/etc/istio/pod";
/// The Gateway API's labels on every object istiod makes for a Gateway.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
pub const GATEWAY_CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";

/// The largest `PROXY_CONFIG` read: a ProxyConfig is a few kilobytes.
const MAX_PROXY_CONFIG: usize = 64 * 1024;

/// What Istio's names add: ambit's variable name and its value, for each one that is not
/// set and that Istio's pod gives.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translated {
    pub vars: Vec<(&'static str, String)>,
    /// The pod carries istiod's waypoint settings (`PROXY_CONFIG` or `CA_ADDR`): it is
    /// istiod's pod, so the control server is looked for where the chart installs it.
    pub from_istiod: bool,
}

/// Reads Istio's names from `env` and, when the Gateway's name or class is not set,
/// from `labels` (the text of the pod's labels file, if there is one, and its path for
/// errors).
pub fn translate(env: &Env<'_>, labels: Option<(&str, &str)>) -> Result<Translated, ConfigError> {
    let mut out = Translated::default();
    let unset = |var: &'static str| env.get(var).is_none_or(|v| v.trim().is_empty());
    let discovery = match env.get("PROXY_CONFIG") {
        Some(text) => {
            out.from_istiod = true;
            discovery_address(text)?
        }
        None => None,
    };
    let ca_addr = env
        .get("CA_ADDR")
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string);
    out.from_istiod |= ca_addr.is_some();
    if unset("XDS_ADDRESS") {
        if let Some(address) = discovery.or_else(|| ca_addr.clone()) {
            out.vars.push(("XDS_ADDRESS", address));
        }
    }
    if unset("CA_ADDRESS") {
        if let Some(address) = ca_addr {
            out.vars.push(("CA_ADDRESS", address));
        }
    }
    for (ours, istios) in [
        ("CLUSTER_ID", "ISTIO_META_CLUSTER_ID"),
        ("NETWORK", "ISTIO_META_NETWORK"),
    ] {
        if unset(ours) {
            if let Some(v) = env.get(istios).map(str::trim).filter(|v| !v.is_empty()) {
                out.vars.push((ours, v.to_string()));
            }
        }
    }
    let wanted = [
        ("GATEWAY_NAME", GATEWAY_NAME_LABEL),
        ("GATEWAY_CLASS", GATEWAY_CLASS_LABEL),
    ]
    .into_iter()
    .filter(|(ours, _)| unset(ours))
    .collect::<Vec<_>>();
    if let (false, Some((path, text))) = (wanted.is_empty(), labels) {
        let read = ambit_k8s::downward::parse_downward(text).map_err(|e| ConfigError::Invalid {
            var: "AMBIT_POD_INFO_DIR",
            value: format!("{path}: {e}"),
            expected: "the pod's labels as the kubelet writes them (key=\"value\" lines)",
        })?;
        for (ours, label) in wanted {
            if let Some(v) = read.get(label).filter(|v| !v.is_empty()) {
                out.vars.push((ours, v.clone()));
            }
        }
    }
    Ok(out)
}

/// `env`'s variables with `translated`'s added.
pub fn overlay(env: &Env<'_>, translated: &Translated) -> HashMap<String, String> {
    let mut vars = env.vars.clone();
    for (k, v) in &translated.vars {
        vars.insert(k.to_string(), v.clone());
    }
    vars
}

/// ProxyConfig's `discoveryAddress`, if it names one (`{}` names none).
fn discovery_address(text: &str) -> Result<Option<String>, ConfigError> {
    #[derive(serde::Deserialize)]
    struct ProxyConfig {
        #[serde(rename = "discoveryAddress", default)]
        discovery_address: Option<String>,
    }
    let invalid = |why: String| ConfigError::Invalid {
        var: "PROXY_CONFIG",
        value: why,
        expected: "Istio's ProxyConfig as JSON or YAML (its discoveryAddress names the xDS server)",
    };
    if text.len() > MAX_PROXY_CONFIG {
        return Err(invalid(format!("{} bytes", text.len())));
    }
    if text.trim().is_empty() {
        return Ok(None);
    }
    let parsed: ProxyConfig = yaml_serde::from_str(text).map_err(|e| invalid(e.to_string()))?;
    Ok(parsed
        .discovery_address
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pairs: &[(&str, &str)], labels: Option<&str>) -> Result<Translated, String> {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        translate(
            &Env::new(&vars),
            labels.map(|l| ("/etc/istio/pod/labels", l)),
        )
        .map_err(|e| e.to_string())
    }

    const LABELS: &str = "gateway.istio.io/managed=\"istio.io-mesh-controller\"\n\
        gateway.networking.k8s.io/gateway-class-name=\"istio-waypoint\"\n\
        gateway.networking.k8s.io/gateway-name=\"shop-waypoint\"\n";

    #[test]
    fn istiods_waypoint_pod() {
        let t = run(
            &[
                ("CA_ADDR", "istiod.istio-system.svc:15012"),
                ("PROXY_CONFIG", "{}\n"),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
                ("ISTIO_META_NETWORK", "network-1"),
            ],
            Some(LABELS),
        )
        .unwrap();
        assert!(t.from_istiod);
        assert_eq!(
            t.vars,
            [
                ("XDS_ADDRESS", "istiod.istio-system.svc:15012".to_string()),
                ("CA_ADDRESS", "istiod.istio-system.svc:15012".to_string()),
                ("CLUSTER_ID", "Kubernetes".to_string()),
                ("NETWORK", "network-1".to_string()),
                ("GATEWAY_NAME", "shop-waypoint".to_string()),
                ("GATEWAY_CLASS", "istio-waypoint".to_string()),
            ]
        );
    }

    #[test]
    fn discovery_address_and_ambits_own_names_win() {
        let t = run(
            &[
                ("CA_ADDR", "istiod-canary.istio-system.svc:15012"),
                (
                    "PROXY_CONFIG",
                    "{\"discoveryAddress\": \"istiod-xds.istio-system.svc:15012\", \"concurrency\": 2}",
                ),
                ("CA_ADDRESS", "https://ca.example:15012"),
                ("GATEWAY_NAME", "mine"),
                ("NETWORK", "net-x"),
                ("ISTIO_META_NETWORK", "network-1"),
            ],
            Some(LABELS),
        )
        .unwrap();
        assert_eq!(
            t.vars,
            [
                (
                    "XDS_ADDRESS",
                    "istiod-xds.istio-system.svc:15012".to_string()
                ),
                ("GATEWAY_CLASS", "istio-waypoint".to_string()),
            ]
        );
        // YAML, as Istio accepts it too.
        let t = run(&[("PROXY_CONFIG", "discoveryAddress: a.b:15012\n")], None).unwrap();
        assert_eq!(t.vars, [("XDS_ADDRESS", "a.b:15012".to_string())]);
    }

    #[test]
    fn not_istiods_pod() {
        let t = run(&[("XDS_ADDRESS", "https://control:15012")], Some(LABELS)).unwrap();
        assert!(!t.from_istiod);
        assert_eq!(
            t.vars,
            [
                ("GATEWAY_NAME", "shop-waypoint".to_string()),
                ("GATEWAY_CLASS", "istio-waypoint".to_string()),
            ]
        );
        assert_eq!(run(&[], None).unwrap(), Translated::default());
    }

    #[test]
    fn bad_input_is_named() {
        let e = run(&[("PROXY_CONFIG", "{discoveryAddress: [")], None).unwrap_err();
        assert!(e.starts_with("PROXY_CONFIG="), "{e}");
        let e = run(&[("CA_ADDR", "istiod:15012")], Some("gateway-name\n")).unwrap_err();
        assert!(e.contains("/etc/istio/pod/labels: line 1"), "{e}");
        // With both names set, the labels file is not read at all.
        let ok = run(
            &[("GATEWAY_NAME", "a"), ("GATEWAY_CLASS", "b")],
            Some("gateway-name\n"),
        );
        assert_eq!(ok.unwrap(), Translated::default());
    }
}
