//! The store: every workload, service and policy, indexed for the data path.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use crate::addr::NetworkAddress;
use crate::error::ConfigError;
use crate::local_config::LocalConfig;
use crate::name::Name;
use crate::policy::{Authorization, PolicyScope};
use crate::ports::PortMap;
use crate::service::Service;
use crate::workload::{Workload, DEFAULT_SERVICE_ACCOUNT};

/// The mesh as this proxy knows it. Built from the local configuration or from xDS
/// through the `insert_*`/`remove_*` methods, read by the data path.
///
/// Compact by construction: every string is a [`Name`], so an index holds a reference to
/// the workload's own uid or the service's own key, never a copy; the endpoint indexes
/// hold the workload itself (its port map for the service is in its `services`, read
/// from there).
#[derive(Debug, Default, Clone)]
pub struct ProxyState {
    /// By uid.
    workloads: BTreeMap<Name, Arc<Workload>>,
    /// IP → the workload with that IP in each network (almost always one). Host-network
    /// workloads are not indexed.
    workload_by_addr: HashMap<IpAddr, AtAddress>,
    /// By `namespace/hostname`.
    services: BTreeMap<Name, Arc<Service>>,
    /// Exact VIPs: IP → (network, service key), in key order.
    service_by_vip: HashMap<IpAddr, SmallVec<[(Name, Name); 1]>>,
    /// CIDR VIPs with their service key.
    cidr_vips: Vec<(NetworkAddress, Name)>,
    /// hostname → service keys.
    service_by_hostname: HashMap<Name, BTreeSet<Name>>,
    /// Service key → its endpoint workloads by uid. Kept for services not (yet) known
    /// too: such entries are the staged services.
    endpoints: BTreeMap<Name, BTreeMap<Name, Arc<Workload>>>,
    /// By `namespace/name`.
    policies: BTreeMap<String, Arc<Authorization>>,
    /// Namespace ("" for GLOBAL policies) → policy key → policy.
    policies_by_namespace: HashMap<String, BTreeMap<String, Arc<Authorization>>>,
    /// Bumped whenever a policy is added, replaced or removed, so that decisions taken
    /// before can tell whether the policies they were taken on are still the same.
    policy_generation: u64,
    /// Service key → its endpoints prepared for weighted choice, built on first use after
    /// each change of that service's endpoints (so a batch of changes costs one build).
    endpoint_index: HashMap<Name, Arc<OnceLock<EndpointIndex>>>,
}

/// The workloads at one IP: (network, workload), almost always just one.
type AtAddress = SmallVec<[(Name, Arc<Workload>); 1]>;

/// The endpoints of one service, in uid order, with the running sum of their capacities
/// for an O(log n) weighted choice.
#[derive(Debug, Default)]
pub(crate) struct EndpointIndex {
    pub(crate) endpoints: Vec<Arc<Workload>>,
    /// Those known by a hostname only (a ServiceEntry's, `resolution: DNS`).
    pub(crate) hostname_only: Vec<Arc<Workload>>,
    /// `cumulative[i]`: the capacities of endpoints `0..=i` added up.
    cumulative: Vec<u64>,
}

impl EndpointIndex {
    /// One endpoint at random, weighted by capacity (uniformly when all are 0).
    pub(crate) fn pick(&self, rng: &mut impl rand::Rng) -> Option<usize> {
        let total = *self.cumulative.last()?;
        if total == 0 {
            return Some(rng.gen_range(0..self.endpoints.len()));
        }
        let r = rng.gen_range(0..total);
        Some(self.cumulative.partition_point(|c| *c <= r))
    }
}

/// What an address names (see [`ProxyState::lookup_address`]).
#[derive(Debug, Clone)]
pub enum AddressTarget {
    Service(Arc<Service>),
    Workload(Arc<Workload>),
}

/// A service endpoint: a workload and its port map for that service.
#[derive(Debug, Clone)]
pub struct Endpoint<'a> {
    pub workload: &'a Arc<Workload>,
    pub ports: &'a PortMap,
}

/// The port map `w` declares for the service `key`: present for every endpoint of it.
fn ports_for<'a>(w: &'a Workload, key: &str) -> Option<&'a PortMap> {
    w.services.get(key)
}

/// The namespace a policy is indexed under: "" for GLOBAL, its own for NAMESPACE, none
/// for WORKLOAD_SELECTOR (those are found through the workload's list).
fn attached_namespace(p: &Authorization) -> Option<&str> {
    match p.scope {
        PolicyScope::Global => Some(""),
        PolicyScope::Namespace => Some(&p.namespace),
        PolicyScope::WorkloadSelector => None,
    }
}

/// The items a configuration put in the store, in its order.
#[derive(Debug, Default)]
pub(crate) struct ConfigItems {
    pub(crate) workloads: Vec<Arc<Workload>>,
    pub(crate) services: Vec<Arc<Service>>,
}

fn duplicate_workload(i: usize, uid: &str, first: usize) -> ConfigError {
    ConfigError::invalid(
        format!("workloads[{i}] (uid {uid})"),
        format!("uid: duplicate of workloads[{first}]"),
    )
}

fn duplicate(item: String, list: &str, first: usize) -> ConfigError {
    ConfigError::invalid(item, format!("duplicate of {list}[{first}]"))
}

fn workload_label(w: &Workload) -> String {
    if w.uid.is_empty() {
        format!("{}/{}", w.namespace, w.name)
    } else {
        format!("uid {}", w.uid)
    }
}

impl ProxyState {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds the store from a local configuration, applying defaults and checking every
    /// item. Duplicate workload uids, service keys or policy keys are errors.
    pub fn from_config(cfg: LocalConfig) -> Result<ProxyState, ConfigError> {
        Ok(ProxyState::from_config_recorded(cfg)?.0)
    }

    /// [`ProxyState::from_config`], with the items as the store holds them, in the
    /// configuration's order.
    pub(crate) fn from_config_recorded(
        cfg: LocalConfig,
    ) -> Result<(ProxyState, ConfigItems), ConfigError> {
        let mut state = ProxyState::new();
        let mut items = ConfigItems::default();
        let mut seen: HashMap<Name, usize> = HashMap::new();
        for (i, w) in cfg.workloads.into_iter().enumerate() {
            let item = format!("workloads[{i}] ({})", workload_label(&w));
            let w = state
                .insert_workload(w)
                .map_err(|m| ConfigError::invalid(&item, m))?;
            if let Some(first) = seen.insert(w.uid.clone(), i) {
                return Err(duplicate_workload(i, &w.uid, first));
            }
            items.workloads.push(w);
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, s) in cfg.services.into_iter().enumerate() {
            let item = format!("services[{i}] ({})", s.key());
            let key = s.key();
            let s = state
                .insert_service(s)
                .map_err(|m| ConfigError::invalid(&item, m))?;
            if let Some(first) = seen.insert(key, i) {
                return Err(duplicate(item, "services", first));
            }
            items.services.push(s);
        }
        seen.clear();
        for (i, p) in cfg.policies.into_iter().enumerate() {
            let item = format!("policies[{i}] ({})", p.key());
            let key = p.key();
            state
                .insert_policy(p)
                .map_err(|m| ConfigError::invalid(&item, m))?;
            if let Some(first) = seen.insert(key, i) {
                return Err(duplicate(item, "policies", first));
            }
        }
        Ok((state, items))
    }

    /// Checks the workloads and services of a configuration as
    /// [`ProxyState::from_config`] does, with the same errors, without building a store:
    /// each item is checked on a copy of its own, so the configuration is never held twice.
    pub(crate) fn check_config(cfg: &LocalConfig) -> Result<(), ConfigError> {
        let mut seen: HashMap<Name, usize> = HashMap::new();
        for (i, w) in cfg.workloads.iter().enumerate() {
            let item = format!("workloads[{i}] ({})", workload_label(w));
            let mut w = w.clone();
            w.normalize().map_err(|m| ConfigError::invalid(&item, m))?;
            if let Some(first) = seen.insert(w.uid.clone(), i) {
                return Err(duplicate_workload(i, &w.uid, first));
            }
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, s) in cfg.services.iter().enumerate() {
            let item = format!("services[{i}] ({})", s.key());
            s.clone()
                .normalize()
                .map_err(|m| ConfigError::invalid(&item, m))?;
            if let Some(first) = seen.insert(s.key(), i) {
                return Err(duplicate(item, "services", first));
            }
        }
        Ok(())
    }

    // ----- updates -------------------------------------------------------------------

    /// Adds a workload, or replaces the one with the same uid. Applies defaults and checks
    /// it first ([`Workload::normalize`]); the error names the field at fault. Costs what
    /// the workload touches: its addresses and its services' endpoint maps.
    pub fn insert_workload(&mut self, mut w: Workload) -> Result<Arc<Workload>, String> {
        w.normalize()?;
        Ok(self.insert_normalized_workload(Arc::new(w)))
    }

    /// [`ProxyState::insert_workload`] of a workload normalized already (one another store
    /// holds), shared rather than copied.
    pub(crate) fn insert_normalized_workload(&mut self, w: Arc<Workload>) -> Arc<Workload> {
        self.remove_workload(&w.uid);
        if !w.is_host_network() {
            for ip in &w.workload_ips {
                let slot = self.workload_by_addr.entry(*ip).or_default();
                match slot.iter_mut().find(|(net, _)| *net == w.network) {
                    Some(held) => {
                        tracing::warn!(
                            ip = %ip, network = %w.network, replaced = %held.1.uid, by = %w.uid,
                            "two workloads share an address; the later one wins"
                        );
                        held.1 = w.clone();
                    }
                    None => slot.push((w.network.clone(), w.clone())),
                }
            }
        }
        for svc in w.services.keys() {
            self.endpoints
                .entry(svc.clone())
                .or_default()
                .insert(w.uid.clone(), w.clone());
            self.endpoint_index
                .insert(svc.clone(), Arc::new(OnceLock::new()));
        }
        self.workloads.insert(w.uid.clone(), w.clone());
        w
    }

    /// Removes a workload (and its endpoints). Returns it if it was known.
    pub fn remove_workload(&mut self, uid: &str) -> Option<Arc<Workload>> {
        let w = self.workloads.remove(uid)?;
        for ip in &w.workload_ips {
            if let Some(slot) = self.workload_by_addr.get_mut(ip) {
                // Only this workload's own entry: a later one sharing the address stays.
                slot.retain(|(_, held)| !Arc::ptr_eq(held, &w));
                if slot.is_empty() {
                    self.workload_by_addr.remove(ip);
                }
            }
        }
        for svc in w.services.keys() {
            if let Some(eps) = self.endpoints.get_mut(svc) {
                eps.remove(uid);
                if eps.is_empty() {
                    self.endpoints.remove(svc);
                    self.endpoint_index.remove(svc);
                } else {
                    self.endpoint_index
                        .insert(svc.clone(), Arc::new(OnceLock::new()));
                }
            }
        }
        Some(w)
    }

    /// Adds a service, or replaces the one with the same `namespace/hostname`.
    pub fn insert_service(&mut self, mut s: Service) -> Result<Arc<Service>, String> {
        s.normalize()?;
        Ok(self.insert_normalized_service(Arc::new(s)))
    }

    /// [`ProxyState::insert_service`] of a service checked already, shared.
    pub(crate) fn insert_normalized_service(&mut self, s: Arc<Service>) -> Arc<Service> {
        let key = Name::from(s.key());
        self.remove_service(&key);
        for vip in &s.vips {
            if vip.prefix_len.is_some() {
                self.cidr_vips.push((vip.clone(), key.clone()));
            } else {
                let slot = self.service_by_vip.entry(vip.address).or_default();
                let entry = (vip.network.clone(), key.clone());
                // Kept in key order: the lookups rank ties by it.
                if let Err(at) =
                    slot.binary_search_by(|(net, k)| (k, net).cmp(&(&entry.1, &entry.0)))
                {
                    slot.insert(at, entry);
                }
            }
        }
        self.service_by_hostname
            .entry(s.hostname.clone())
            .or_default()
            .insert(key.clone());
        self.services.insert(key, s.clone());
        s
    }

    /// Removes a service by `namespace/hostname`. Its endpoints stay (staged) until the
    /// workloads go.
    pub fn remove_service(&mut self, key: &str) -> Option<Arc<Service>> {
        let s = self.services.remove(key)?;
        for vip in &s.vips {
            if let Some(slot) = self.service_by_vip.get_mut(&vip.address) {
                slot.retain(|(net, k)| !(*net == vip.network && *k == key));
                if slot.is_empty() {
                    self.service_by_vip.remove(&vip.address);
                }
            }
        }
        self.cidr_vips.retain(|(_, k)| k != key);
        if let Some(set) = self.service_by_hostname.get_mut(s.hostname.as_str()) {
            set.remove(key);
            if set.is_empty() {
                self.service_by_hostname.remove(s.hostname.as_str());
            }
        }
        Some(s)
    }

    /// Adds a policy, or replaces the one with the same `namespace/name`.
    pub fn insert_policy(&mut self, mut p: Authorization) -> Result<Arc<Authorization>, String> {
        p.normalize()?;
        let key = p.key();
        let l7 = p.l7_attributes();
        if !l7.is_empty() {
            let effect = match p.action {
                crate::policy::PolicyAction::Allow => {
                    "its rules that use them never match (allow less)"
                }
                crate::policy::PolicyAction::Deny => "they are ignored (deny more)",
            };
            tracing::warn!(
                policy = %key,
                attributes = ?l7,
                "policy uses attributes an L4 proxy cannot see: {effect}"
            );
        }
        self.remove_policy(&key);
        let p = Arc::new(p);
        if let Some(ns) = attached_namespace(&p) {
            self.policies_by_namespace
                .entry(ns.to_string())
                .or_default()
                .insert(key.clone(), p.clone());
        }
        self.policies.insert(key, p.clone());
        self.policy_generation += 1;
        Ok(p)
    }

    /// Removes a policy by `namespace/name`.
    pub fn remove_policy(&mut self, key: &str) -> Option<Arc<Authorization>> {
        let p = self.policies.remove(key)?;
        if let Some(ns) = attached_namespace(&p) {
            if let Some(set) = self.policies_by_namespace.get_mut(ns) {
                set.remove(key);
                if set.is_empty() {
                    self.policies_by_namespace.remove(ns);
                }
            }
        }
        self.policy_generation += 1;
        Some(p)
    }

    /// Changes whenever a policy is added, replaced or removed.
    pub fn policy_generation(&self) -> u64 {
        self.policy_generation
    }

    // ----- lookups -------------------------------------------------------------------

    /// The workload with this IP in this network (host-network workloads are never found).
    pub fn workload_by_ip(&self, network: &str, ip: IpAddr) -> Option<Arc<Workload>> {
        self.workload_by_addr
            .get(&ip)?
            .iter()
            .find(|(net, _)| *net == network)
            .map(|(_, w)| w.clone())
    }

    pub fn workload_by_uid(&self, uid: &str) -> Option<Arc<Workload>> {
        self.workloads.get(uid).cloned()
    }

    /// The workload this proxy acts for (from `PROXY_WORKLOAD_INFO` or ZDS): same name,
    /// namespace and service account ("" means `default`). When `node` is given only a
    /// workload on that node qualifies: a pod is never served with another node's copy of
    /// its identity and addresses. Ties go to the smallest uid.
    pub fn find_local_workload(
        &self,
        namespace: &str,
        name: &str,
        service_account: &str,
        node: Option<&str>,
    ) -> Option<Arc<Workload>> {
        let sa = if service_account.is_empty() {
            DEFAULT_SERVICE_ACCOUNT
        } else {
            service_account
        };
        self.workloads
            .values()
            .filter(|w| {
                let configured = if w.service_account.is_empty() {
                    DEFAULT_SERVICE_ACCOUNT
                } else {
                    &w.service_account
                };
                w.namespace == namespace && w.name == name && configured == sa
            })
            .find(|w| node.is_none_or(|node| w.node == node))
            .cloned()
    }

    /// The service with this VIP in this network that a workload in `src_namespace` may
    /// reach. Exact VIPs first, ranked: same namespace, then canonical, then key order;
    /// then CIDR VIPs, ranked: same namespace, longest prefix, canonical. (To decide what
    /// an address names, use [`ProxyState::lookup_address`]: a workload's own IP comes
    /// before a CIDR VIP.)
    pub fn service_by_vip(
        &self,
        network: &str,
        ip: IpAddr,
        src_namespace: &str,
    ) -> Option<Arc<Service>> {
        self.service_by_exact_vip(network, ip, src_namespace)
            .or_else(|| self.service_by_cidr_vip(network, ip, src_namespace))
    }

    /// What an address in `network` names for a workload in `src_namespace`, in ztunnel's
    /// order: a service's exact VIP, then a workload's own IP, and only then a CIDR VIP (so
    /// a pod inside a CIDR ServiceEntry's range is still that pod, with its waypoint).
    pub fn lookup_address(
        &self,
        network: &str,
        ip: IpAddr,
        src_namespace: &str,
    ) -> Option<AddressTarget> {
        if let Some(s) = self.service_by_exact_vip(network, ip, src_namespace) {
            return Some(AddressTarget::Service(s));
        }
        if let Some(w) = self.workload_by_ip(network, ip) {
            return Some(AddressTarget::Workload(w));
        }
        self.service_by_cidr_vip(network, ip, src_namespace)
            .map(AddressTarget::Service)
    }

    /// Every service with exactly this VIP in `network`, whoever may see it.
    pub fn services_at_vip<'a>(
        &'a self,
        network: &'a str,
        ip: IpAddr,
    ) -> impl Iterator<Item = &'a Arc<Service>> + 'a {
        self.service_by_vip
            .get(&ip)
            .into_iter()
            .flatten()
            .filter(move |(net, _)| *net == network)
            .filter_map(|(_, k)| self.services.get(k))
    }

    fn service_by_exact_vip(
        &self,
        network: &str,
        ip: IpAddr,
        src_namespace: &str,
    ) -> Option<Arc<Service>> {
        let keys = self.service_by_vip.get(&ip)?;
        keys.iter()
            .filter(|(net, _)| *net == network)
            .filter_map(|(_, k)| self.services.get(k))
            .filter(|s| s.visible_to(src_namespace))
            // max_by_key keeps the last maximum: iterate in reverse for key order.
            .rev()
            .max_by_key(|s| (s.namespace == src_namespace, s.canonical))
            .cloned()
    }

    fn service_by_cidr_vip(
        &self,
        network: &str,
        ip: IpAddr,
        src_namespace: &str,
    ) -> Option<Arc<Service>> {
        self.cidr_vips
            .iter()
            .filter(|(vip, _)| vip.network == network && vip.contains(ip))
            .filter_map(|(vip, k)| Some((vip, self.services.get(k)?)))
            .filter(|(_, s)| s.visible_to(src_namespace))
            .rev()
            .max_by_key(|(vip, s)| {
                (
                    s.namespace == src_namespace,
                    vip.prefix_len.unwrap_or(128),
                    s.canonical,
                )
            })
            .map(|(_, s)| s.clone())
    }

    /// The service with this hostname: the canonical one if several namespaces have it,
    /// else the first by namespace.
    pub fn service_by_hostname(&self, hostname: &str) -> Option<Arc<Service>> {
        self.service_by_hostname
            .get(hostname)?
            .iter()
            .filter_map(|k| self.services.get(k))
            .rev()
            .max_by_key(|s| s.canonical)
            .cloned()
    }

    /// Every service with this hostname (one per namespace that has it), in key order.
    pub fn services_with_hostname(&self, hostname: &str) -> impl Iterator<Item = &Arc<Service>> {
        self.service_by_hostname
            .get(hostname)
            .into_iter()
            .flatten()
            .filter_map(|k| self.services.get(k))
    }

    /// The service with this hostname that `workload` backs (a hostname several
    /// namespaces use names the one the workload is an endpoint of), with its key.
    pub fn workload_service_by_hostname(
        &self,
        workload: &Workload,
        hostname: &str,
    ) -> Option<(&str, Arc<Service>)> {
        self.service_by_hostname
            .get(hostname)?
            .iter()
            .filter(|k| workload.services.contains_key(k.as_str()))
            .find_map(|k| Some((k.as_str(), self.services.get(k)?.clone())))
    }

    /// The service `namespace/hostname`.
    pub fn service_by_key(&self, key: &str) -> Option<Arc<Service>> {
        self.services.get(key).cloned()
    }

    /// The endpoints of a service (by `namespace/hostname`), in uid order.
    pub fn endpoints(&self, service_key: &str) -> impl Iterator<Item = Endpoint<'_>> {
        self.endpoints
            .get_key_value(service_key)
            .into_iter()
            .flat_map(|(key, eps)| {
                eps.values().filter_map(move |w| {
                    Some(Endpoint {
                        workload: w,
                        ports: ports_for(w, key)?,
                    })
                })
            })
    }

    /// The endpoints of a service prepared for weighted choice (none without endpoints).
    pub(crate) fn endpoint_index(&self, service_key: &str) -> Option<&EndpointIndex> {
        let cell = self.endpoint_index.get(service_key)?;
        Some(cell.get_or_init(|| {
            let endpoints: Vec<Arc<Workload>> = self
                .endpoints
                .get(service_key)
                .into_iter()
                .flat_map(|eps| eps.values().cloned())
                .collect();
            let mut sum = 0u64;
            let cumulative = endpoints
                .iter()
                .map(|w| {
                    sum += u64::from(w.capacity);
                    sum
                })
                .collect();
            let hostname_only = endpoints
                .iter()
                .filter(|w| w.workload_ips.is_empty() && !w.hostname.is_empty())
                .cloned()
                .collect();
            EndpointIndex {
                endpoints,
                hostname_only,
                cumulative,
            }
        }))
    }

    /// The policies that apply to a workload: GLOBAL ones, NAMESPACE ones of its
    /// namespace, and those it selects by name (unknown names skipped); in key order.
    pub fn policies_for(&self, w: &Workload) -> Vec<Arc<Authorization>> {
        let mut out: Vec<Arc<Authorization>> = Vec::new();
        self.each_policy_for(w, |p| out.push(p.clone()));
        // One policy may be both attached and named: keep it once.
        out.sort_unstable_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out.dedup_by(|a, b| Arc::ptr_eq(a, b));
        out
    }

    /// The policies of [`ProxyState::policies_for`], without collecting them: the GLOBAL
    /// ones, then those of the workload's namespace (each in key order), then those it
    /// names that are not among them already. Cost: the policies that apply, not all.
    pub(crate) fn each_policy_for<'a>(
        &'a self,
        w: &Workload,
        mut f: impl FnMut(&'a Arc<Authorization>),
    ) {
        let global = self.policies_by_namespace.get("");
        let own = self.policies_by_namespace.get(w.namespace.as_str());
        global
            .into_iter()
            .chain(own)
            .flat_map(|m| m.values())
            .for_each(&mut f);
        for (i, key) in w.authorization_policies.iter().enumerate() {
            let Some(p) = self.policies.get(key.as_str()) else {
                continue;
            };
            if w.authorization_policies[..i].contains(key) {
                continue;
            }
            let attached = match attached_namespace(p) {
                Some("") => true,
                Some(ns) => ns == w.namespace,
                None => false,
            };
            if !attached {
                f(p);
            }
        }
    }

    /// All workloads, in uid order.
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    /// All services, in `namespace/hostname` order.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    /// The policy `namespace/name`.
    pub fn policy_by_key(&self, key: &str) -> Option<Arc<Authorization>> {
        self.policies.get(key).cloned()
    }

    /// All policies, in `namespace/name` order.
    pub fn policies(&self) -> impl Iterator<Item = &Arc<Authorization>> {
        self.policies.values()
    }

    /// Services that workloads name but that are not known (yet): service key → its
    /// endpoint workloads by uid.
    pub fn staged_services(&self) -> impl Iterator<Item = (&Name, &BTreeMap<Name, Arc<Workload>>)> {
        self.endpoints
            .iter()
            .filter(|(k, _)| !self.services.contains_key(*k))
    }

    /// The endpoint workloads of a service, by uid.
    pub(crate) fn endpoint_map(&self, service_key: &str) -> Option<&BTreeMap<Name, Arc<Workload>>> {
        self.endpoints.get(service_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::Visibility;

    fn state(yaml: &str) -> ProxyState {
        ProxyState::from_yaml("test", yaml).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const MESH: &str = r#"
workloads:
- name: a
  namespace: ns1
  serviceAccount: sa-a
  node: node1
  workloadIps: ["10.0.0.1", "fd00::1"]
  services: {ns1/svc.ns1: {80: 8080}}
- name: a
  namespace: ns1
  serviceAccount: sa-a
  uid: other-a
  node: node2
  workloadIps: ["10.0.1.1"]
- name: host
  namespace: ns1
  networkMode: HostNetwork
  workloadIps: ["192.168.0.1"]
- name: remote
  namespace: ns1
  network: net2
  workloadIps: ["10.0.0.1"]
  services: {ns1/staged.ns1: {80: 80}}
services:
- {name: svc, namespace: ns1, hostname: svc.ns1, vips: ["/10.96.0.1", "net2/10.96.0.1"], ports: {80: 8080}}
- {name: shared, namespace: ns1, hostname: shared, vips: ["/10.96.0.2"]}
- {name: shared, namespace: ns2, hostname: shared, vips: ["/10.96.0.2"], canonical: true}
- {name: private, namespace: ns3, hostname: private, vips: ["/10.96.0.3"], visibility: Namespace}
- {name: range, namespace: ns1, hostname: range, vips: ["/10.97.0.0/16"]}
- {name: range2, namespace: ns1, hostname: range2, vips: ["/10.97.1.0/24"]}
policies:
- {name: g, namespace: istio-system, scope: Global, action: Deny}
- {name: n, namespace: ns1, scope: Namespace, action: Allow}
- {name: n2, namespace: ns2, scope: Namespace, action: Allow}
- {name: sel, namespace: ns1, scope: WorkloadSelector, action: Allow}
"#;

    #[test]
    fn workload_lookups() {
        let s = state(MESH);
        let a = s.workload_by_ip("", ip("10.0.0.1")).unwrap();
        assert_eq!(a.uid, "Kubernetes//v1/Pod/ns1/a");
        assert_eq!(s.workload_by_ip("", ip("fd00::1")).unwrap().uid, a.uid);
        assert_eq!(
            s.workload_by_ip("net2", ip("10.0.0.1")).unwrap().name,
            "remote"
        );
        assert!(
            s.workload_by_ip("", ip("192.168.0.1")).is_none(),
            "host network"
        );
        assert!(s.workload_by_uid("Kubernetes//v1/Pod/ns1/host").is_some());
        assert!(s.workload_by_ip("", ip("10.9.9.9")).is_none());
    }

    #[test]
    fn local_workload() {
        let s = state(MESH);
        let w = s
            .find_local_workload("ns1", "a", "sa-a", Some("node2"))
            .unwrap();
        assert_eq!(w.uid, "other-a");
        let w = s
            .find_local_workload("ns1", "a", "sa-a", Some("node1"))
            .unwrap();
        assert_eq!(w.uid, "Kubernetes//v1/Pod/ns1/a");
        // Not on this node: no workload, rather than another node's copy.
        assert!(s
            .find_local_workload("ns1", "a", "sa-a", Some("node9"))
            .is_none());
        assert!(s.find_local_workload("ns1", "a", "other", None).is_none());
        assert!(s.find_local_workload("ns1", "host", "", None).is_some());
    }

    #[test]
    fn vip_lookups() {
        let s = state(MESH);
        assert_eq!(
            s.service_by_vip("", ip("10.96.0.1"), "x").unwrap().name,
            "svc"
        );
        assert_eq!(
            s.service_by_vip("net2", ip("10.96.0.1"), "x").unwrap().name,
            "svc"
        );
        assert!(s.service_by_vip("net3", ip("10.96.0.1"), "x").is_none());
        // Same namespace beats canonical; canonical beats key order.
        assert_eq!(
            s.service_by_vip("", ip("10.96.0.2"), "ns1")
                .unwrap()
                .namespace,
            "ns1"
        );
        assert_eq!(
            s.service_by_vip("", ip("10.96.0.2"), "ns9")
                .unwrap()
                .namespace,
            "ns2"
        );
        // Visibility.
        assert!(s.service_by_vip("", ip("10.96.0.3"), "ns1").is_none());
        let p = s.service_by_vip("", ip("10.96.0.3"), "ns3").unwrap();
        assert_eq!(p.visibility, Visibility::Namespace);
        // CIDR VIPs, longest prefix.
        assert_eq!(
            s.service_by_vip("", ip("10.97.1.5"), "x").unwrap().name,
            "range2"
        );
        assert_eq!(
            s.service_by_vip("", ip("10.97.2.5"), "x").unwrap().name,
            "range"
        );
        // Hostname.
        assert_eq!(s.service_by_hostname("shared").unwrap().namespace, "ns2");
        assert!(s.service_by_hostname("nope").is_none());
    }

    #[test]
    fn endpoints_and_staging() {
        let mut s = state(MESH);
        let eps: Vec<_> = s
            .endpoints("ns1/svc.ns1")
            .map(|e| e.workload.name.clone())
            .collect();
        assert_eq!(eps, ["a"]);
        let staged: Vec<_> = s.staged_services().map(|(k, _)| k.clone()).collect();
        assert_eq!(staged, ["ns1/staged.ns1"]);
        s.insert_service(Service::new("staged", "ns1", "staged.ns1"))
            .unwrap();
        assert_eq!(s.staged_services().count(), 0);
        assert_eq!(s.endpoints("ns1/staged.ns1").count(), 1);
        s.remove_workload("Kubernetes//v1/Pod/ns1/remote").unwrap();
        assert_eq!(s.endpoints("ns1/staged.ns1").count(), 0);
        assert!(s.workload_by_ip("net2", ip("10.0.0.1")).is_none());
        assert!(s.workload_by_ip("", ip("10.0.0.1")).is_some());
    }

    #[test]
    fn replace_workload_reindexes() {
        let mut s = state(MESH);
        let mut a = (*s.workload_by_uid("other-a").unwrap()).clone();
        a.workload_ips = vec![ip("10.0.2.2")];
        s.insert_workload(a).unwrap();
        assert!(s.workload_by_ip("", ip("10.0.1.1")).is_none());
        assert_eq!(s.workload_by_ip("", ip("10.0.2.2")).unwrap().uid, "other-a");
    }

    #[test]
    fn policy_attachment() {
        let s = state(MESH);
        let mut w = (*s.workload_by_uid("other-a").unwrap()).clone();
        let keys =
            |w: &Workload| -> Vec<String> { s.policies_for(w).iter().map(|p| p.key()).collect() };
        assert_eq!(keys(&w), ["istio-system/g", "ns1/n"]);
        w.authorization_policies = vec!["ns1/sel".into(), "ns1/missing".into()];
        assert_eq!(keys(&w), ["istio-system/g", "ns1/n", "ns1/sel"]);
        w.namespace = "ns2".into();
        w.authorization_policies.clear();
        assert_eq!(keys(&w), ["istio-system/g", "ns2/n2"]);
    }

    #[test]
    fn remove_service_and_policy() {
        let mut s = state(MESH);
        assert!(s.remove_service("ns1/svc.ns1").is_some());
        assert!(s.service_by_vip("", ip("10.96.0.1"), "x").is_none());
        assert!(s.remove_service("ns1/range2").is_some());
        assert_eq!(
            s.service_by_vip("", ip("10.97.1.5"), "x").unwrap().name,
            "range"
        );
        assert!(s.remove_policy("istio-system/g").is_some());
        let w = s.workload_by_uid("other-a").unwrap();
        assert_eq!(s.policies_for(&w).len(), 1);
    }
}
