//! Which mesh service a name means to a client, and its addresses (reference §10.5).
//! Sans-IO: a pure function of the mesh state, the client and the settings.

use std::net::IpAddr;
use std::sync::Arc;

use ambit_state::{IpFamilies, ProxyState, Service, Workload};
use rand::seq::SliceRandom;

/// How the DNS proxy reads names: the cluster domain and the search list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `CLUSTER_DOMAIN` (default `cluster.local`), lower case, no trailing dot.
    pub cluster_domain: String,
    /// Shared mode: the client's Kubernetes search list; dedicated mode: resolv.conf's.
    pub search: SearchList,
    /// `IPV6_ENABLED`: with it off, AAAA queries for mesh names get no records.
    pub ipv6_enabled: bool,
    /// `PREFERED_SERVICE_NAMESPACE`: breaks ties between namespaces after the client's
    /// own and the canonical service.
    pub preferred_namespace: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cluster_domain: "cluster.local".into(),
            search: SearchList::Kubernetes,
            ipv6_enabled: true,
            preferred_namespace: None,
        }
    }
}

/// The search domains a client's resolver appends, which the proxy strips again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchList {
    /// `<clientns>.svc.<domain>`, `svc.<domain>`, `<domain>` (shared mode: every pod's
    /// resolv.conf as Kubernetes writes it).
    Kubernetes,
    /// A fixed list (dedicated mode: the proxy's own resolv.conf), lower case.
    Fixed(Vec<String>),
}

impl Settings {
    fn search_domains(&self, client_ns: &str) -> Vec<String> {
        match &self.search {
            SearchList::Kubernetes => vec![
                format!("{client_ns}.svc.{}", self.cluster_domain),
                format!("svc.{}", self.cluster_domain),
                self.cluster_domain.clone(),
            ],
            SearchList::Fixed(list) => list.clone(),
        }
    }
}

/// One name the query may stand for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Alias {
    name: String,
    /// The query with a search domain removed, when this alias came from one.
    stripped: Option<String>,
}

/// The Kubernetes completions of a short name, by its number of labels.
fn kube_fqdns(name: &str, client_ns: &str, domain: &str) -> Vec<String> {
    let labels: Vec<&str> = name.split('.').collect();
    let ends_in_svc = labels.last() == Some(&"svc");
    match labels.len() {
        // `svc` ⇒ a service of the client's namespace.
        1 => vec![format!("{name}.{client_ns}.svc.{domain}")],
        // `svc.ns`, or `host.subdomain` in the client's namespace.
        2 => vec![
            format!("{name}.svc.{domain}"),
            format!("{name}.{client_ns}.svc.{domain}"),
        ],
        // `svc.ns.svc`, or `host.subdomain.ns`.
        3 => {
            let mut out = Vec::with_capacity(2);
            if ends_in_svc {
                out.push(format!("{name}.{domain}"));
            }
            out.push(format!("{name}.svc.{domain}"));
            out
        }
        // `host.subdomain.ns.svc`.
        4 if ends_in_svc => vec![format!("{name}.{domain}")],
        _ => Vec::new(),
    }
}

/// Every name `qname` may stand for, in the order they are tried: the name, its
/// Kubernetes completions, then for each search domain it ends in, the name without it
/// and that name's completions.
fn aliases(qname: &str, client_ns: &str, settings: &Settings) -> Vec<Alias> {
    let domain = settings.cluster_domain.as_str();
    let mut out = vec![Alias {
        name: qname.to_string(),
        stripped: None,
    }];
    out.extend(
        kube_fqdns(qname, client_ns, domain)
            .into_iter()
            .map(|name| Alias {
                name,
                stripped: None,
            }),
    );
    for sd in settings.search_domains(client_ns) {
        let Some(rest) = qname.strip_suffix(sd.as_str()) else {
            continue;
        };
        let Some(stripped) = rest.strip_suffix('.').filter(|s| !s.is_empty()) else {
            continue;
        };
        out.push(Alias {
            name: stripped.to_string(),
            stripped: Some(stripped.to_string()),
        });
        out.extend(
            kube_fqdns(stripped, client_ns, domain)
                .into_iter()
                .map(|name| Alias {
                    name,
                    stripped: Some(stripped.to_string()),
                }),
        );
    }
    out
}

/// A mesh service the name was matched to.
#[derive(Debug, Clone)]
pub struct Matched {
    pub service: Arc<Service>,
    /// The hostname that matched (the service's, possibly a wildcard).
    pub host: String,
    pub wildcard: bool,
    /// Set when a search domain was stripped (not for wildcards): answer with a CNAME
    /// from the query to this name, and own the addresses by it.
    pub cname_to: Option<String>,
}

/// Whether the client may get this service from DNS: it has VIPs or is a headless
/// Kubernetes service, and it is visible to the client's namespace.
fn candidate(s: &Service, client_ns: &str, domain: &str) -> bool {
    let headless = s
        .hostname
        .strip_suffix(domain)
        .is_some_and(|h| h.ends_with(".svc."));
    (!s.vips.is_empty() || headless) && s.visible_to(client_ns)
}

/// The best service with this exact hostname: client's namespace, then canonical, then
/// the preferred namespace, then the first by namespace.
fn best_service(
    state: &ProxyState,
    host: &str,
    client_ns: &str,
    settings: &Settings,
) -> Option<Arc<Service>> {
    let preferred = settings.preferred_namespace.as_deref();
    state
        .services_with_hostname(host)
        .filter(|s| candidate(s, client_ns, &settings.cluster_domain))
        // max_by_key keeps the last maximum: reversed, ties go to the first key.
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .max_by_key(|s| {
            (
                s.namespace == client_ns,
                s.canonical,
                Some(s.namespace.as_str()) == preferred,
            )
        })
        .cloned()
}

/// Finds the service `qname` (lower case, no trailing dot) names for `client`.
pub fn find_service(
    state: &ProxyState,
    client: &Workload,
    settings: &Settings,
    qname: &str,
) -> Option<Matched> {
    let client_ns = client.namespace.as_str();
    for alias in aliases(qname, client_ns, settings) {
        if let Some(service) = best_service(state, &alias.name, client_ns, settings) {
            return Some(Matched {
                service,
                host: alias.name.clone(),
                wildcard: false,
                cname_to: alias.stripped,
            });
        }
        let labels: Vec<&str> = alias.name.split('.').collect();
        for i in 1..labels.len() {
            let wildcard = format!("*.{}", labels[i..].join("."));
            if let Some(service) = best_service(state, &wildcard, client_ns, settings) {
                return Some(Matched {
                    service,
                    host: wildcard,
                    wildcard: true,
                    cname_to: None,
                });
            }
        }
    }
    None
}

/// The addresses of a matched service for a client, of one family, shuffled. Empty when
/// the family is off (IPv6 disabled, the service's `ip_families`) or there are none.
pub fn addresses(
    state: &ProxyState,
    client: &Workload,
    settings: &Settings,
    service: &Service,
    want_v6: bool,
) -> Vec<IpAddr> {
    let family_allowed = match service.ip_families {
        IpFamilies::Ipv4Only => !want_v6,
        IpFamilies::Ipv6Only => want_v6,
        IpFamilies::Automatic | IpFamilies::Dual => true,
    };
    if !family_allowed || (want_v6 && !settings.ipv6_enabled) {
        return Vec::new();
    }
    let mut ips: Vec<IpAddr> = if service.vips.is_empty() {
        // Headless: one address of the family per endpoint workload.
        state
            .endpoints(&service.key())
            .filter_map(|e| {
                e.workload
                    .workload_ips
                    .iter()
                    .find(|ip| ip.is_ipv6() == want_v6)
                    .copied()
            })
            .collect()
    } else {
        service
            .vips
            .iter()
            .filter(|v| v.prefix_len.is_none() && v.network == client.network)
            .map(|v| v.address)
            .filter(|ip| ip.is_ipv6() == want_v6)
            .collect()
    };
    ips.dedup();
    ips.shuffle(&mut rand::thread_rng());
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(q: &str, ns: &str, s: &Settings) -> Vec<(String, Option<String>)> {
        aliases(q, ns, s)
            .into_iter()
            .map(|a| (a.name, a.stripped))
            .collect()
    }

    #[test]
    fn kubernetes_completions_by_label_count() {
        let d = "cluster.local";
        assert_eq!(kube_fqdns("echo", "ns1", d), ["echo.ns1.svc.cluster.local"]);
        assert_eq!(
            kube_fqdns("echo.ns2", "ns1", d),
            [
                "echo.ns2.svc.cluster.local",
                "echo.ns2.ns1.svc.cluster.local"
            ]
        );
        assert_eq!(
            kube_fqdns("echo.ns2.svc", "ns1", d),
            [
                "echo.ns2.svc.cluster.local",
                "echo.ns2.svc.svc.cluster.local"
            ]
        );
        assert_eq!(
            kube_fqdns("a.b.ns2", "ns1", d),
            ["a.b.ns2.svc.cluster.local"]
        );
        assert_eq!(
            kube_fqdns("a.b.ns2.svc", "ns1", d),
            ["a.b.ns2.svc.cluster.local"]
        );
        assert!(kube_fqdns("a.b.ns2.x", "ns1", d).is_empty());
        assert!(kube_fqdns("echo.ns1.svc.cluster.local", "ns1", d).is_empty());
    }

    #[test]
    fn search_domains_are_stripped_and_completed() {
        let s = Settings::default();
        let got = names(
            "echo.ns1.svc.cluster.local.ns1.svc.cluster.local",
            "ns1",
            &s,
        );
        assert_eq!(
            got[1],
            (
                "echo.ns1.svc.cluster.local".to_string(),
                Some("echo.ns1.svc.cluster.local".to_string())
            )
        );
        // `echo.ns2` searched in the client's namespace domain.
        let got = names("echo.ns2.ns1.svc.cluster.local", "ns1", &s);
        assert!(got.contains(&(
            "echo.ns2.svc.cluster.local".to_string(),
            Some("echo.ns2".to_string())
        )));
        // A name that is exactly a search domain strips to nothing: no alias.
        let got = names("svc.cluster.local", "ns1", &s);
        assert!(got.iter().all(|(n, _)| !n.is_empty()));
        // Dedicated mode: resolv.conf's list.
        let fixed = Settings {
            search: SearchList::Fixed(vec!["corp.example".into()]),
            ..Settings::default()
        };
        let got = names("echo.corp.example", "ns1", &fixed);
        assert_eq!(
            got,
            [
                ("echo.corp.example".to_string(), None),
                ("echo.corp.example.svc.cluster.local".to_string(), None),
                ("echo".to_string(), Some("echo".to_string())),
                (
                    "echo.ns1.svc.cluster.local".to_string(),
                    Some("echo".to_string())
                ),
            ]
        );
    }
}
