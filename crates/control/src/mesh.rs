//! The mesh served: every `*.yaml`/`*.yml` file of a directory in the local-config schema,
//! merged, turned into xDS resources.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ambit_state::{parse_local_config, ConfigError, LocalConfig, ProxyState};

use crate::convert;
use crate::session::Snapshot;

/// Files of the mesh directory read at most.
pub const MAX_FILES: usize = 1000;
/// Bytes of one mesh file read at most.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Why the mesh directory could not be loaded. Each names the file at fault; the operator's
/// to fix (the last good mesh keeps being served meanwhile).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MeshError {
    #[error("cannot list the mesh directory {dir}: {source}")]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read mesh file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mesh file {path} is larger than {MAX_FILE_BYTES} bytes; split it")]
    FileTooLarge { path: PathBuf },
    #[error("the mesh directory {dir} holds more than {MAX_FILES} YAML files")]
    TooManyFiles { dir: PathBuf },
    /// The file's own problem, with line, column and field.
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{kind} {name:?} is defined in both {first} and {second}; keep one")]
    Duplicate {
        kind: &'static str,
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{path}: workload {workload} names policy {policy:?}, which no mesh file defines")]
    UnknownPolicy {
        path: PathBuf,
        workload: String,
        policy: String,
    },
    /// A check across files failed (for instance two workloads with one IP in different
    /// files).
    #[error("the mesh files together are not valid: {0}")]
    Merged(ConfigError),
}

/// The mesh as loaded.
#[derive(Debug, Clone, Default)]
pub struct Mesh {
    /// The merged configuration (workload uids filled in).
    pub config: LocalConfig,
    /// The files read, in order.
    pub files: Vec<PathBuf>,
    /// node → SPIFFE ids of the workloads configured on it (node authorization of the CA).
    pub node_identities: BTreeMap<String, BTreeSet<String>>,
}

impl Mesh {
    /// The resources of this mesh.
    pub fn snapshot(&self, generation: u64) -> Snapshot {
        let mut s = Snapshot::new(generation);
        for w in &self.config.workloads {
            s.insert(ambit_proto::ADDRESS_TYPE, convert::workload_resource(w));
        }
        for svc in &self.config.services {
            s.insert(ambit_proto::ADDRESS_TYPE, convert::service_resource(svc));
        }
        for p in &self.config.policies {
            s.insert(ambit_proto::AUTHORIZATION_TYPE, convert::policy_resource(p));
        }
        s
    }
}

/// The YAML files of `dir`, sorted by name, with their contents. Hidden files (editors'
/// temporaries) are skipped.
pub fn read_dir(dir: &Path) -> Result<Vec<(PathBuf, String)>, MeshError> {
    let entries = std::fs::read_dir(dir).map_err(|source| MeshError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| MeshError::ReadDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if !yaml || name.starts_with('.') || !path.is_file() {
            continue;
        }
        paths.push(path);
        if paths.len() > MAX_FILES {
            return Err(MeshError::TooManyFiles {
                dir: dir.to_path_buf(),
            });
        }
    }
    paths.sort();
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        let read_err = |source| MeshError::ReadFile {
            path: path.clone(),
            source,
        };
        let len = std::fs::metadata(&path).map_err(read_err)?.len();
        if len > MAX_FILE_BYTES {
            return Err(MeshError::FileTooLarge { path });
        }
        let text = std::fs::read_to_string(&path).map_err(read_err)?;
        out.push((path, text));
    }
    Ok(out)
}

/// Parses and merges mesh files (as [`read_dir`] returns them).
pub fn build(files: &[(PathBuf, String)]) -> Result<Mesh, MeshError> {
    let mut merged = LocalConfig::default();
    let mut workload_at: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut service_at: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut policy_at: BTreeMap<String, PathBuf> = BTreeMap::new();
    // A file may name a policy another file defines: checked once all are merged.
    let mut deferred = Vec::new();
    for (path, text) in files {
        let origin = path.display().to_string();
        let cfg = match parse_local_config(&origin, text) {
            Ok(cfg) => cfg,
            Err(ConfigError::UnknownPolicy(u)) => {
                // Every other check passed (references are checked last), so the plain
                // schema parse succeeds.
                let cfg = yaml_serde::from_str::<LocalConfig>(text)
                    .map_err(|_| MeshError::Config(ConfigError::UnknownPolicy(u.clone())))?;
                deferred.push((path.clone(), *u));
                cfg
            }
            Err(e) => return Err(e.into()),
        };
        let dup = |kind, name: &str, first: &PathBuf| MeshError::Duplicate {
            kind,
            name: name.to_string(),
            first: first.clone(),
            second: path.clone(),
        };
        for mut w in cfg.workloads {
            w.normalize().map_err(|message| {
                MeshError::Merged(invalid(&origin, &format!("workload {}", w.name), message))
            })?;
            if let Some(first) = workload_at.insert(w.uid.clone(), path.clone()) {
                return Err(dup("workload", &w.uid, &first));
            }
            merged.workloads.push(w);
        }
        for s in cfg.services {
            let key = format!("{}/{}", s.namespace, s.hostname);
            if let Some(first) = service_at.insert(key.clone(), path.clone()) {
                return Err(dup("service", &key, &first));
            }
            merged.services.push(s);
        }
        for p in cfg.policies {
            let key = p.key();
            if let Some(first) = policy_at.insert(key.clone(), path.clone()) {
                return Err(dup("policy", &key, &first));
            }
            merged.policies.push(p);
        }
    }
    for w in &merged.workloads {
        for name in &w.authorization_policies {
            if policy_at.contains_key(name) {
                continue;
            }
            let path = workload_at.get(&w.uid).cloned().unwrap_or_default();
            // The file's own report has the line and a suggestion; use it when it is this one.
            if let Some((_, u)) = deferred
                .iter()
                .find(|(p, u)| *p == path && u.policy == *name)
            {
                return Err(MeshError::Config(ConfigError::UnknownPolicy(Box::new(
                    u.clone(),
                ))));
            }
            return Err(MeshError::UnknownPolicy {
                path,
                workload: format!("{}/{}", w.namespace, w.name),
                policy: name.clone(),
            });
        }
    }
    ProxyState::from_config(merged.clone()).map_err(MeshError::Merged)?;
    let mut node_identities: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for w in &merged.workloads {
        if !w.node.is_empty() {
            node_identities
                .entry(w.node.clone())
                .or_default()
                .insert(w.identity().to_string());
        }
    }
    Ok(Mesh {
        config: merged,
        files: files.iter().map(|(p, _)| p.clone()).collect(),
        node_identities,
    })
}

fn invalid(origin: &str, item: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.to_string(),
        line: None,
        column: None,
        item: item.to_string(),
        message,
    }
}

/// Reads and builds the mesh of `dir`.
pub fn load(dir: &Path) -> Result<Mesh, MeshError> {
    build(&read_dir(dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
        list.iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect()
    }

    const A: &str = "workloads:\n- name: a\n  namespace: ns\n  node: n1\n  serviceAccount: sa-a\n  workloadIps: [\"10.0.0.1\"]\n  authorizationPolicies: [\"ns/deny\"]\n";
    const B: &str = "policies:\n- name: deny\n  namespace: ns\n  scope: WorkloadSelector\n  action: Deny\nservices:\n- name: s\n  namespace: ns\n  hostname: s.ns.svc.cluster.local\n  vips: [\"/10.96.0.1\"]\n";

    #[test]
    fn files_merge_and_may_refer_to_each_other() {
        let mesh = build(&files(&[("/m/a.yaml", A), ("/m/b.yaml", B)])).unwrap();
        assert_eq!(mesh.config.workloads.len(), 1);
        assert_eq!(mesh.config.workloads[0].uid, "Kubernetes//v1/Pod/ns/a");
        assert_eq!(
            mesh.node_identities["n1"],
            BTreeSet::from(["spiffe://cluster.local/ns/ns/sa/sa-a".to_string()])
        );
        let snap = mesh.snapshot(1);
        let addrs = snap.resources(ambit_proto::ADDRESS_TYPE).unwrap();
        assert!(addrs.contains_key("Kubernetes//v1/Pod/ns/a"));
        assert!(addrs.contains_key("ns/s.ns.svc.cluster.local"));
        let pols = snap.resources(ambit_proto::AUTHORIZATION_TYPE).unwrap();
        assert!(pols.contains_key("ns/deny"));
    }

    #[test]
    fn a_policy_defined_nowhere_is_reported_with_the_file_and_line() {
        let err = build(&files(&[("/m/a.yaml", A)])).unwrap_err().to_string();
        assert!(err.contains("/m/a.yaml: line 7"), "{err}");
        assert!(err.contains("ns/deny"), "{err}");
    }

    #[test]
    fn duplicates_across_files_name_both_files() {
        let err = build(&files(&[
            ("/m/a.yaml", A),
            ("/m/b.yaml", B),
            ("/m/c.yaml", B),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("/m/b.yaml") && err.contains("/m/c.yaml"),
            "{err}"
        );
        let err = build(&files(&[
            ("/m/a.yaml", A),
            ("/m/a2.yml", A),
            ("/m/b.yaml", B),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("workload \"Kubernetes//v1/Pod/ns/a\"") && err.contains("/m/a2.yml"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_field_is_reported_with_file_line_and_field() {
        let bad = "workloads:\n- name: a\n  namespace: ns\n  protocol: HBONEE\n";
        let err = build(&files(&[("/m/bad.yaml", bad)]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/m/bad.yaml: line 4"), "{err}");
        assert!(err.contains("workloads[0].protocol"), "{err}");
    }

    #[test]
    fn the_directory_is_read_in_order_skipping_hidden_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.yaml"), B).unwrap();
        std::fs::write(dir.path().join("a.yml"), A).unwrap();
        std::fs::write(dir.path().join(".a.yaml.swp"), "garbage: [").unwrap();
        std::fs::write(dir.path().join("README"), "not yaml").unwrap();
        let read = read_dir(dir.path()).unwrap();
        let names: Vec<_> = read
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.yml", "b.yaml"]);
        load(dir.path()).unwrap();
        assert!(matches!(
            load(&dir.path().join("missing")),
            Err(MeshError::ReadDir { .. })
        ));
    }
}
