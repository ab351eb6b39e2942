//! What a loaded local configuration file put in the store, kept for as long as the file
//! applies: to show it (`/config_dump`'s `staticConfig`), to move the store to the file's
//! next version, and to keep a rejected policy's last good version. It shares the store's
//! workloads and services instead of holding a second copy of the mesh: a reference per
//! item, and a note of what the store filled in (the uid) so the file shows as written.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::error::ConfigError;
use crate::local::LocalLoad;
use crate::local_config::LocalConfig;
use crate::policy::Authorization;
use crate::service::Service;
use crate::store::ProxyState;
use crate::workload::Workload;

/// A workload of the file: the store's, and whether the file left its uid out.
#[derive(Debug, Clone)]
struct FileWorkload {
    workload: Arc<Workload>,
    uid_written: bool,
    /// `applicationTunnel.port: 0` as written (the store reads it as "none").
    zero_tunnel_port: bool,
}

/// The items of a loaded local configuration file, in file order (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct LocalFile {
    workloads: Vec<FileWorkload>,
    services: Vec<Arc<Service>>,
    /// As loaded (rejected ones replaced by what stands in their place): few, and the
    /// last good versions a reload falls back to.
    policies: Vec<Authorization>,
}

impl LocalFile {
    /// Builds the store of a loaded file, and what the file contributed to it.
    pub fn build(load: LocalLoad) -> Result<(LocalFile, ProxyState), ConfigError> {
        let config = load.config;
        let written: Vec<(bool, bool)> = config
            .workloads
            .iter()
            .map(|w| {
                let zero_port = w.application_tunnel.as_ref().and_then(|t| t.port) == Some(0);
                (!w.uid.is_empty(), zero_port)
            })
            .collect();
        let policies = config.policies.clone();
        let (state, items) = ProxyState::from_config_recorded(config)?;
        let workloads = items
            .workloads
            .into_iter()
            .zip(written)
            .map(|(workload, (uid_written, zero_tunnel_port))| FileWorkload {
                workload,
                uid_written,
                zero_tunnel_port,
            })
            .collect();
        let file = LocalFile {
            workloads,
            services: items.services,
            policies,
        };
        Ok((file, state))
    }

    /// What a reload passes to [`crate::load_local_config`] as the previous load: its
    /// policies are all that is read of it.
    pub fn previous(&self) -> LocalConfig {
        LocalConfig {
            policies: self.policies.clone(),
            ..LocalConfig::default()
        }
    }

    /// True if both files put the same items in the same order.
    pub fn same_as(&self, other: &LocalFile) -> bool {
        self.policies == other.policies
            && self.workloads.len() == other.workloads.len()
            && self.services.len() == other.services.len()
            && self.workloads.iter().zip(&other.workloads).all(|(a, b)| {
                a.uid_written == b.uid_written
                    && a.zero_tunnel_port == b.zero_tunnel_port
                    && a.workload == b.workload
            })
            && self
                .services
                .iter()
                .zip(&other.services)
                .all(|(a, b)| a == b)
    }

    /// The file as loaded, as the configuration's JSON (`workloads`, `services`,
    /// `policies`): what serializing the parsed [`LocalConfig`] gives.
    pub fn to_json(&self) -> Value {
        let workloads = self
            .workloads
            .iter()
            .map(|f| {
                if f.uid_written && !f.zero_tunnel_port {
                    return to_value(&*f.workload);
                }
                // Rare (a file without uids): shown as written, on a copy made only now.
                let mut w = (*f.workload).clone();
                if !f.uid_written {
                    w.uid = crate::Name::empty();
                }
                if let (true, Some(t)) = (f.zero_tunnel_port, &mut w.application_tunnel) {
                    t.port = Some(0);
                }
                to_value(&w)
            })
            .collect();
        let services = self.services.iter().map(|s| to_value(&**s)).collect();
        let policies = self.policies.iter().map(to_value).collect();
        let mut m = Map::new();
        m.insert("workloads".into(), Value::Array(workloads));
        m.insert("services".into(), Value::Array(services));
        m.insert("policies".into(), Value::Array(policies));
        Value::Object(m)
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    // The model's types serialize to JSON without failure; null rather than a panic.
    serde_json::to_value(v).unwrap_or(Value::Null)
}

impl ProxyState {
    /// Moves this store from the local file `old` to `new`: items gone from the file are
    /// removed, new and changed ones inserted (the very items `new` holds, not copies),
    /// unchanged ones left alone, so open connections are re-checked only when a policy
    /// really changed. Items of other sources (xDS) are not touched unless the file names
    /// them too.
    pub fn apply_local_change(&mut self, old: &LocalFile, new: &LocalFile) {
        // Sets, not lists: a file of thousands of policies is diffed in linear time.
        let new_policies: std::collections::HashSet<String> =
            new.policies.iter().map(|p| p.key()).collect();
        for p in &old.policies {
            let key = p.key();
            if !new_policies.contains(&key) {
                self.remove_policy(&key);
            }
        }
        let new_services: std::collections::HashSet<String> =
            new.services.iter().map(|s| s.key()).collect();
        for s in &old.services {
            if !new_services.contains(&s.key()) {
                self.remove_service(&s.key());
            }
        }
        let new_uids: std::collections::HashSet<&str> = new
            .workloads
            .iter()
            .map(|f| f.workload.uid.as_str())
            .collect();
        for f in &old.workloads {
            if !new_uids.contains(f.workload.uid.as_str()) {
                self.remove_workload(&f.workload.uid);
            }
        }
        // Changed against the old file, not the live store: an item the file left as it
        // was stays as it is, whoever changed it since.
        let old_workloads: std::collections::HashMap<&str, &Arc<Workload>> = old
            .workloads
            .iter()
            .map(|f| (f.workload.uid.as_str(), &f.workload))
            .collect();
        for f in &new.workloads {
            if old_workloads.get(f.workload.uid.as_str()).map(|w| &***w) != Some(&*f.workload) {
                self.insert_normalized_workload(f.workload.clone());
            }
        }
        let old_services: std::collections::HashMap<String, &Arc<Service>> =
            old.services.iter().map(|s| (s.key(), s)).collect();
        for s in &new.services {
            if old_services.get(&s.key()).map(|o| &***o) != Some(&**s) {
                self.insert_normalized_service(s.clone());
            }
        }
        let old_policies: std::collections::HashMap<String, &Authorization> =
            old.policies.iter().map(|p| (p.key(), p)).collect();
        for p in &new.policies {
            if old_policies.get(&p.key()) != Some(&p) {
                // Checked when `new` was built.
                let _ = self.insert_policy(p.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_local_config;

    const FILE: &str = r#"
workloads:
- {name: a, namespace: ns, workloadIps: ["10.0.0.1"], services: {ns/s.ns: {80: 8080}}}
- {uid: given-b, name: b, namespace: ns, applicationTunnel: {protocol: PROXY, port: 0}}
- {uid: given-c, name: c, namespace: ns, serviceAccount: sa}
services:
- {name: s, namespace: ns, hostname: s.ns, vips: ["/10.96.0.1"], ports: {80: 8080}}
policies:
- {name: p, namespace: ns, scope: Namespace, action: Deny, rules: [[{principals: [{exact: x}]}]]}
"#;

    #[test]
    fn shows_the_file_as_the_parsed_config_serializes() {
        let load = load_local_config("f", FILE, None).unwrap();
        let want = serde_json::to_value(&load.config).unwrap();
        let (file, state) = LocalFile::build(load).unwrap();
        assert_eq!(file.to_json(), want);
        // The store filled in the uid the file left out, and shares its items.
        let a = state.workload_by_uid("Kubernetes//v1/Pod/ns/a").unwrap();
        assert!(Arc::ptr_eq(&a, &file.workloads[0].workload));
        assert_eq!(file.previous().policies, file.policies);
    }

    #[test]
    fn a_reload_shares_the_new_items_and_leaves_unchanged_ones() {
        let (old, mut live) =
            LocalFile::build(load_local_config("f", FILE, None).unwrap()).unwrap();
        let (same, _) = LocalFile::build(load_local_config("f", FILE, None).unwrap()).unwrap();
        assert!(old.same_as(&same));
        let kept_c = live.workload_by_uid("given-c").unwrap();
        let changed = FILE.replace("serviceAccount: sa", "serviceAccount: sb").replace(
            "- {name: a, namespace: ns, workloadIps: [\"10.0.0.1\"], services: {ns/s.ns: {80: 8080}}}\n",
            "",
        );
        let (new, _) = LocalFile::build(load_local_config("f", &changed, None).unwrap()).unwrap();
        assert!(!old.same_as(&new));
        live.apply_local_change(&old, &new);
        assert!(
            live.workload_by_uid("Kubernetes//v1/Pod/ns/a").is_none(),
            "gone from the file"
        );
        let c = live.workload_by_uid("given-c").unwrap();
        assert_eq!(c.service_account, "sb");
        assert!(!Arc::ptr_eq(&c, &kept_c));
        assert!(
            Arc::ptr_eq(&c, &new.workloads[1].workload),
            "the new file's item, shared"
        );
        assert!(
            Arc::ptr_eq(
                &live.workload_by_uid("given-b").unwrap(),
                &old.workloads[1].workload
            ),
            "unchanged: left alone"
        );
        // The service lost its only endpoint but stays, as the file still has it.
        assert!(live.service_by_key("ns/s.ns").is_some());
        assert_eq!(live.endpoints("ns/s.ns").count(), 0);
    }
}
