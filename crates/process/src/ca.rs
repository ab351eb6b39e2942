//! Where workload certificates come from (`CA_ADDRESS`, `LOCAL_CA_DIR`, an ephemeral root)
//! and how to reach a remote CA.

use std::path::PathBuf;

use crate::env::Env;
use crate::ConfigError;

/// Where workload certificates come from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CaSource {
    /// An Istio CA (istiod, `ambit control`) at `CA_ADDRESS`.
    Remote(RemoteCa),
    /// ambit's local CA from a plug-in CA directory (`LOCAL_CA_DIR`).
    LocalDir(PathBuf),
    /// A root made up at start-up (local config without `LOCAL_CA_DIR`).
    Ephemeral,
}

/// How to reach the remote CA, as the variables gave it (interpreted by `ambit-grpc`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteCa {
    /// `https://host:port`.
    pub address: String,
    /// `CA_ROOT_CA` as given: a file path, `SYSTEM` or PEM (unset: the chart's path).
    pub root: Option<String>,
    /// `ALT_CA_HOSTNAME`.
    pub alt_hostname: Option<String>,
    /// `AUTH_TOKEN` as given: a file path or the token itself (unset: the default
    /// token file if present). Never shown in `/config_dump`.
    #[serde(skip)]
    pub token: Option<String>,
    /// `CA_HEADER_<NAME>=v` as (`<NAME>`, v), sorted.
    pub headers: Vec<(String, String)>,
}

/// ztunnel's default CA (and xDS) address.
pub fn default_istiod_address(in_kubernetes: bool) -> &'static str {
    if in_kubernetes {
        "https://istiod.istio-system.svc:15012"
    } else {
        "https://localhost:15012"
    }
}

/// `SECRET_TTL`: the workload certificates' lifetime (default 24 h, at least 10 s: a
/// renewal storm is never what was meant).
pub fn secret_ttl(env: &Env<'_>) -> Result<std::time::Duration, ConfigError> {
    use std::time::Duration;
    match env.duration("SECRET_TTL")? {
        None => Ok(Duration::from_secs(86400)),
        Some(ttl) if ttl >= Duration::from_secs(10) => Ok(ttl),
        Some(_) => Err(ConfigError::Invalid {
            var: "SECRET_TTL",
            value: env.get("SECRET_TTL").unwrap_or_default().to_string(),
            expected: "a certificate lifetime of at least 10s, such as 24h",
        }),
    }
}

/// The certificate issuer: `CA_ADDRESS` ⇒ that CA; else `LOCAL_CA_DIR` ⇒ the local CA;
/// else, with no local config (the mesh comes over xDS), ztunnel's default CA address;
/// else an ephemeral root.
pub fn ca_source(
    env: &Env<'_>,
    local_ca_dir: Option<&PathBuf>,
    has_local_config: bool,
) -> Result<CaSource, ConfigError> {
    let address = match env.get("CA_ADDRESS") {
        Some(a) if a.trim().is_empty() => {
            return Err(ConfigError::Invalid {
                var: "CA_ADDRESS",
                value: a.to_string(),
                expected: "the CA's address, such as https://istiod.istio-system.svc:15012 (unset it to use LOCAL_CA_DIR)",
            })
        }
        Some(a) => Some(ambit_grpc::with_scheme(a.trim())),
        None => match local_ca_dir {
            Some(dir) => return Ok(CaSource::LocalDir(dir.clone())),
            None if !has_local_config => Some(
                default_istiod_address(env.get("KUBERNETES_SERVICE_HOST").is_some()).to_string(),
            ),
            None => None,
        },
    };
    let Some(address) = address else {
        return Ok(CaSource::Ephemeral);
    };
    let mut headers: Vec<(String, String)> = env
        .vars
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("CA_HEADER_")?.to_string(), v.clone())))
        .filter(|(k, _)| !k.is_empty())
        .collect();
    headers.sort();
    Ok(CaSource::Remote(RemoteCa {
        address,
        root: env.get("CA_ROOT_CA").map(str::to_string),
        alt_hostname: env
            .get("ALT_CA_HOSTNAME")
            .filter(|h| !h.is_empty())
            .map(str::to_string),
        token: env.get("AUTH_TOKEN").map(str::to_string),
        headers,
    }))
}

#[cfg(test)]
mod ca_tests {
    use super::*;
    use std::collections::HashMap;

    fn source(pairs: &[(&str, &str)], has_local_config: bool) -> Result<CaSource, ConfigError> {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = Env::new(&vars);
        let dir = env.get("LOCAL_CA_DIR").map(PathBuf::from);
        ca_source(&env, dir.as_ref(), has_local_config)
    }

    fn remote(pairs: &[(&str, &str)], has_local_config: bool) -> RemoteCa {
        match source(pairs, has_local_config).unwrap() {
            CaSource::Remote(r) => r,
            other => panic!("not remote: {other:?}"),
        }
    }

    #[test]
    fn ca_address_wins_and_gets_a_scheme() {
        let r = remote(
            &[
                ("CA_ADDRESS", "istiod.example:15012"),
                ("LOCAL_CA_DIR", "/ca"),
                ("CA_ROOT_CA", "SYSTEM"),
                ("ALT_CA_HOSTNAME", "istiod.istio-system.svc"),
                ("AUTH_TOKEN", "/var/run/token"),
                ("CA_HEADER_X-B", "2"),
                ("CA_HEADER_X-A", "1"),
                ("XDS_HEADER_X-C", "3"),
            ],
            true,
        );
        assert_eq!(r.address, "https://istiod.example:15012");
        assert_eq!(r.root.as_deref(), Some("SYSTEM"));
        assert_eq!(r.alt_hostname.as_deref(), Some("istiod.istio-system.svc"));
        assert_eq!(r.token.as_deref(), Some("/var/run/token"));
        assert_eq!(
            r.headers,
            [
                ("X-A".to_string(), "1".to_string()),
                ("X-B".into(), "2".into())
            ]
        );
        // The token never appears in the config dump.
        let shown = serde_json::to_string(&CaSource::Remote(r)).unwrap();
        assert!(!shown.contains("/var/run/token"), "{shown}");
        assert_eq!(
            remote(&[("CA_ADDRESS", "https://ca:1")], true).address,
            "https://ca:1"
        );
    }

    #[test]
    fn without_ca_address_the_local_ca_or_istiod_or_an_ephemeral_root() {
        assert_eq!(
            source(&[("LOCAL_CA_DIR", "/ca")], true).unwrap(),
            CaSource::LocalDir("/ca".into())
        );
        assert_eq!(
            source(&[("LOCAL_CA_DIR", "/ca")], false).unwrap(),
            CaSource::LocalDir("/ca".into())
        );
        assert_eq!(source(&[], true).unwrap(), CaSource::Ephemeral);
        // On xDS without a local CA: ztunnel's default istiod address.
        let r = remote(&[], false);
        assert_eq!(r.address, "https://localhost:15012");
        assert_eq!(r.root, None);
        assert_eq!(
            remote(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")], false).address,
            "https://istiod.istio-system.svc:15012"
        );
    }

    #[test]
    fn an_empty_ca_address_is_refused() {
        let e = source(&[("CA_ADDRESS", "")], true).unwrap_err().to_string();
        assert!(e.contains("CA_ADDRESS"), "{e}");
    }
}
