//! Names for endpoints known by hostname only (a ServiceEntry with `resolution: DNS`,
//! the egress waypoint's usual case): resolved with the waypoint's resolv.conf
//! (`AMBIT_RESOLV_CONF`, default `/etc/resolv.conf`), both address families, answers
//! cached for their TTL (at most [`MAX_TTL`]) in a bounded cache, failures cached
//! briefly and counted. Every address an answer holds is an endpoint, as Envoy's
//! `STRICT_DNS` clusters make them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::config::{LookupIpStrategy, ResolveHosts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Names (and their failures) held at most.
pub const CACHE_SIZE: usize = 4096;
/// The longest an answer is kept, whatever its TTL.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// How long a failed lookup is remembered (so a dead name does not cost a query per
/// request).
pub const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// How long one query may take, per attempt.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// The resolver, its answers and its counts.
pub struct HostResolver {
    resolver: TokioResolver,
    /// Each name's last answer (or failure) until it expires: a request pays a map
    /// lookup, not a resolver query (hickory's own cache costs microseconds a request).
    answers: Mutex<HashMap<String, Answer>>,
    /// Lookups sent by `result`: `ok`, `error`.
    lookups: Family<ResultLabel, Counter>,
}

#[derive(Clone)]
struct Answer {
    result: Result<Arc<[IpAddr]>, String>,
    until: Instant,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ResultLabel {
    result: &'static str,
}

impl std::fmt::Debug for HostResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostResolver")
    }
}

impl HostResolver {
    /// A resolver of the nameservers (and search list) `resolv_conf` names.
    pub fn from_resolv_conf(resolv_conf: &Path) -> Result<HostResolver, String> {
        let text = std::fs::read(resolv_conf)
            .map_err(|e| format!("cannot read {}: {e}", resolv_conf.display()))?;
        let (config, mut opts) = hickory_resolver::system_conf::parse_resolv_conf(&text)
            .map_err(|e| format!("{}: {e}", resolv_conf.display()))?;
        if config.name_servers().is_empty() {
            return Err(format!("{}: no nameserver", resolv_conf.display()));
        }
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.cache_size = CACHE_SIZE;
        opts.positive_max_ttl = Some(MAX_TTL);
        opts.negative_max_ttl = Some(NEGATIVE_TTL);
        opts.timeout = QUERY_TIMEOUT;
        opts.attempts = 2;
        // The names are a ServiceEntry's, meant for DNS: not the pod's hosts file.
        opts.use_hosts_file = ResolveHosts::Never;
        let resolver =
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
                .with_options(opts)
                .build();
        Ok(HostResolver {
            resolver,
            answers: Mutex::new(HashMap::new()),
            lookups: Family::default(),
        })
    }

    /// Registers the lookup counts.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "ambit_waypoint_dns_lookups",
            "Lookups of endpoints known by hostname (ServiceEntry resolution DNS), by result",
            self.lookups.clone(),
        );
    }

    /// The addresses of `host` (from the cache while its TTL lasts).
    pub async fn resolve(&self, host: &str) -> Result<Arc<[IpAddr]>, String> {
        let now = Instant::now();
        if let Some(a) = self.answers().get(host).filter(|a| now < a.until) {
            return a.result.clone();
        }
        let (result, until) = self.query(host).await;
        let mut answers = self.answers();
        if answers.len() >= CACHE_SIZE {
            answers.retain(|_, a| now < a.until);
            if answers.len() >= CACHE_SIZE {
                answers.clear();
            }
        }
        answers.insert(
            host.to_string(),
            Answer {
                result: result.clone(),
                until,
            },
        );
        result
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Answer>> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One lookup through the resolver, and until when its answer holds.
    async fn query(&self, host: &str) -> (Result<Arc<[IpAddr]>, String>, Instant) {
        // A fully qualified name: no search list for a ServiceEntry's host.
        let fqdn = if host.ends_with('.') {
            host.to_string()
        } else {
            format!("{host}.")
        };
        let now = Instant::now();
        let (result, until) = match self.resolver.lookup_ip(fqdn).await {
            Ok(answer) => {
                let ips: Arc<[IpAddr]> = answer.iter().collect();
                let until = answer.valid_until().min(now + MAX_TTL);
                if ips.is_empty() {
                    (Err(format!("{host}: no address")), now + NEGATIVE_TTL)
                } else {
                    (Ok(ips), until)
                }
            }
            Err(e) => (Err(format!("{host}: {e}")), now + NEGATIVE_TTL),
        };
        let label = ResultLabel {
            result: if result.is_ok() { "ok" } else { "error" },
        };
        self.lookups.get_or_create(&label).inc();
        (result, until)
    }
}
