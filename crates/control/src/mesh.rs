//! The mesh served: every `*.yaml`/`*.yml` file of a directory, merged, turned into xDS
//! resources.
//!
//! A file is one of two kinds, told apart by its text:
//! - Kubernetes-shaped manifests (many documents, each with `apiVersion` and `kind`): a
//!   file with a line that starts, at its first column, with `apiVersion:` or `kind:`
//!   (a top-level key in block style). Read by `ambit_manifests` as the waypoint reads
//!   its files: each AuthorizationPolicy that attaches by `targetRefs` is translated once
//!   and served as `ambit.waypoint.v1.AuthorizationPolicy` (named `namespace/name`), to
//!   the clients that ask for that type only (waypoints). A policy that attaches by
//!   `selector` or to a whole namespace, and other kinds, are skipped and listed (they
//!   are not served: write ztunnel's policies in the local-config schema).
//! - Every other file: the local-config schema (`LOCAL_XDS_PATH`'s): workloads and
//!   services (`istio.workload.Address`) and L4 policies (`istio.security.Authorization`).
//!
//! The bad-file rule is the same for both: a refused document (with its file, line,
//! column and field) refuses the whole change, and the last good mesh, every policy at
//! its last good version, keeps being served. Serving the rest without the refused
//! document could drop a DENY its author meant, so nothing of a change is served until
//! all of it reads. At start there is no last good mesh: a bad document stops the
//! control server from starting (fail closed: no waypoint is ready without it). Each
//! policy is also checked as a waypoint will check it (its wire form decoded by
//! `ambit_xds`'s own type), so what is served is never NACKed for its content by a
//! waypoint with the same root namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ambit_manifests::{Located, ManifestError, ParseOptions, WaypointPolicy};
use ambit_proto::Resource;
use ambit_state::{parse_local_config, ConfigError, LocalConfig, ProxyState};
use ambit_waypoint_xds::{
    resource_name, AuthnDocuments, DestinationRuleDocuments, DocumentKind, PolicyDocuments,
    RouteDocuments,
};

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
    /// A manifest document refused, with its file, line, column and field (the first
    /// of `more` + 1).
    #[error("{first}{}", more_errors(*more))]
    Manifest {
        first: Box<ManifestError>,
        more: usize,
    },
    /// A policy, route or RequestAuthentication read from a manifest that its waypoints
    /// would refuse over xDS (over its limits, say); `key` is `<kind>/<namespace>/<name>`.
    #[error("{origin}: {key} cannot be served to waypoints: {reason}")]
    Unservable {
        origin: String,
        key: String,
        reason: String,
    },
}

fn more_errors(more: usize) -> String {
    match more {
        0 => String::new(),
        n => format!(" (and {n} more refused documents)"),
    }
}

/// The Address name a gateway address gives: `<network>/<ip>` or `<namespace>/<hostname>`.
fn gateway_name(g: &ambit_state::GatewayAddress) -> String {
    match &g.destination {
        ambit_state::GatewayDestination::Address(a) => format!("{}/{}", a.network, a.address),
        ambit_state::GatewayDestination::Hostname(h) => h.to_string(),
    }
}

/// For on-demand clients: a workload answers to `<network>/<ip>` of each of its
/// addresses; a client that follows it needs its waypoint too, and one that follows one
/// of its services needs it (the client cannot know the uids of a service's endpoints).
fn link_workload(s: &mut Snapshot, w: &ambit_state::Workload) {
    for ip in &w.workload_ips {
        s.insert_alias(format!("{}/{}", w.network, ip), &w.uid);
    }
    if let Some(wp) = &w.waypoint {
        s.insert_dependent(&w.uid, gateway_name(wp));
    }
    for key in w.services.keys() {
        s.insert_dependent(key, w.uid.to_string());
    }
}

/// The mesh as loaded.
#[derive(Debug, Clone, Default)]
pub struct Mesh {
    /// The merged configuration (workload uids filled in).
    pub config: LocalConfig,
    /// The waypoints' policies read from manifest files, in reading order.
    pub waypoint_policies: Vec<Located<WaypointPolicy>>,
    /// Their resources, encoded and checked once.
    pub waypoint_resources: Vec<Arc<Resource>>,
    /// The HTTPRoutes and GRPCRoutes read from manifest files, in reading order, and
    /// their resources (each its document as written).
    pub routes: Vec<Located<ambit_gateway_routes::Route>>,
    pub route_resources: Vec<Arc<Resource>>,
    /// The RequestAuthentications' resources (each its document as written).
    pub authn_resources: Vec<Arc<Resource>>,
    /// The DestinationRules' resources (each its document as written).
    pub destination_rule_resources: Vec<Arc<Resource>>,
    /// Manifest documents read but not served (`file:line: what: why`).
    pub skipped: Vec<String>,
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
            link_workload(&mut s, w);
        }
        for svc in &self.config.services {
            let r = convert::service_resource(svc);
            for vip in &svc.vips {
                s.insert_alias(format!("{}/{}", vip.network, vip.address), &r.name);
            }
            if let Some(wp) = &svc.waypoint {
                s.insert_dependent(&r.name, gateway_name(wp));
            }
            s.insert(ambit_proto::ADDRESS_TYPE, r);
        }
        for p in &self.config.policies {
            s.insert(ambit_proto::AUTHORIZATION_TYPE, convert::policy_resource(p));
        }
        for r in &self.waypoint_resources {
            s.insert_shared(ambit_proto::WAYPOINT_POLICY_TYPE, r.clone());
        }
        for r in &self.route_resources {
            s.insert_shared(ambit_proto::WAYPOINT_ROUTE_TYPE, r.clone());
        }
        for r in &self.authn_resources {
            s.insert_shared(ambit_proto::WAYPOINT_AUTHN_TYPE, r.clone());
        }
        for r in &self.destination_rule_resources {
            s.insert_shared(ambit_proto::WAYPOINT_DESTINATION_RULE_TYPE, r.clone());
        }
        s
    }

    /// What users should be told of the routes, a line per refusal: a backend this mesh
    /// lacks, a match another route always wins over, a route of the other kind.
    pub fn route_status(&self) -> Vec<String> {
        let table = ambit_gateway_routes::RouteTable::new(
            self.routes
                .iter()
                .map(|r| std::sync::Arc::new(r.value.clone())),
        );
        let service = |k: &ambit_gateway_routes::ServiceKey| {
            self.config
                .services
                .iter()
                .find(|s| s.namespace == k.namespace && s.name == k.name)
        };
        let ports_of = |k: &ambit_gateway_routes::ServiceKey| {
            service(k).map_or_else(Vec::new, |s| s.ports.keys().copied().collect())
        };
        let problem = |b: &ambit_gateway_routes::ServiceBackend| match service(&b.service) {
            None => Some(format!("backend {} does not exist in the mesh", b.service)),
            Some(s) if !s.ports.contains_key(&b.port) => {
                Some(format!("backend {} has no port {}", b.service, b.port))
            }
            Some(_) => None,
        };
        ambit_gateway_routes::status(&table, ports_of, problem)
            .iter()
            .flat_map(|f| f.log_lines())
            .collect()
    }
}

/// True for a file of Kubernetes-shaped manifests (see the module docs).
pub fn is_manifest_file(text: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with("apiVersion:") || l.starts_with("kind:"))
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

/// Parses and merges mesh files (as [`read_dir`] returns them); manifests are read with
/// `options` (the root namespace, the namespace of an object that names none).
pub fn build(files: &[(PathBuf, String)], options: &ParseOptions) -> Result<Mesh, MeshError> {
    let mut merged = LocalConfig::default();
    let mut manifests = Manifests::default();
    let mut workload_at: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut service_at: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut policy_at: BTreeMap<String, PathBuf> = BTreeMap::new();
    // A file may name a policy another file defines: checked once all are merged.
    let mut deferred = Vec::new();
    for (path, text) in files {
        let origin = path.display().to_string();
        if is_manifest_file(text) {
            manifests.add(path, text, options)?;
            continue;
        }
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
            if let Some(first) = workload_at.insert(w.uid.to_string(), path.clone()) {
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
            if policy_at.contains_key(name.as_str()) {
                continue;
            }
            let path = workload_at.get(w.uid.as_str()).cloned().unwrap_or_default();
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
                policy: name.to_string(),
            });
        }
    }
    ProxyState::from_config(merged.clone()).map_err(MeshError::Merged)?;
    // One AuthorizationPolicy per namespace and name, whichever schema says it.
    for (key, path) in &manifests.at {
        if let Some(first) = policy_at.get(key) {
            return Err(MeshError::Duplicate {
                kind: "AuthorizationPolicy",
                name: key.clone(),
                first: first.clone(),
                second: path.clone(),
            });
        }
    }
    let root = &options.root_namespace;
    let waypoint_resources = served::<PolicyDocuments>(&manifests.policies, root)?;
    let route_resources = served::<RouteDocuments>(&manifests.routes, root)?;
    let authn_resources = served::<AuthnDocuments>(&manifests.authns, root)?;
    let destination_rule_resources =
        served::<DestinationRuleDocuments>(&manifests.destination_rules, root)?;
    let mut node_identities: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for w in &merged.workloads {
        if !w.node.is_empty() {
            node_identities
                .entry(w.node.to_string())
                .or_default()
                .insert(w.identity().to_string());
        }
    }
    Ok(Mesh {
        config: merged,
        waypoint_policies: manifests.policies.into_iter().map(|(p, _)| p).collect(),
        waypoint_resources,
        routes: manifests.routes.into_iter().map(|(r, _)| r).collect(),
        route_resources,
        authn_resources,
        destination_rule_resources,
        skipped: manifests.skipped,
        files: files.iter().map(|(p, _)| p.clone()).collect(),
        node_identities,
    })
}

/// The resources of documents read, each checked as a waypoint will read it.
fn served<K: DocumentKind>(
    documents: &[(Located<K::Value>, String)],
    root_namespace: &str,
) -> Result<Vec<Arc<Resource>>, MeshError> {
    documents
        .iter()
        .map(|(d, text)| {
            convert::waypoint_resource::<K>(&d.value, text, root_namespace)
                .map(Arc::new)
                .map_err(|reason| MeshError::Unservable {
                    origin: d.origin.to_string(),
                    key: resource_name::<K>(&d.value),
                    reason,
                })
        })
        .collect()
}

/// What one manifest file (or one object of the API server) comes to, read and checked as
/// [`build`] reads it: kept by a caller that assembles meshes of many such parts without
/// reading any again ([`assemble`]), as `ambit control --kubernetes` does per object.
///
/// Only the wire forms are kept (each carries its document as written): the values read
/// are checked and dropped, so a cluster's worth of objects is held once, not twice.
#[derive(Debug, Clone, Default)]
pub struct ManifestParts {
    pub waypoint_resources: Vec<Arc<Resource>>,
    pub route_resources: Vec<Arc<Resource>>,
    pub authn_resources: Vec<Arc<Resource>>,
    pub destination_rule_resources: Vec<Arc<Resource>>,
    pub skipped: Vec<String>,
}

impl ManifestParts {
    /// Bytes of the wire forms (each carrying its document as written).
    pub fn wire_bytes(&self) -> usize {
        self.waypoint_resources
            .iter()
            .chain(&self.route_resources)
            .chain(&self.authn_resources)
            .chain(&self.destination_rule_resources)
            .map(|r| r.resource.as_ref().map_or(0, |a| a.value.len()))
            .sum()
    }
}

/// Reads one manifest file's text as [`build`] would.
pub fn read_manifest(
    path: &Path,
    text: &str,
    options: &ParseOptions,
) -> Result<ManifestParts, MeshError> {
    let mut m = Manifests::default();
    m.add(path, text, options)?;
    let root = &options.root_namespace;
    Ok(ManifestParts {
        waypoint_resources: served::<PolicyDocuments>(&m.policies, root)?,
        route_resources: served::<RouteDocuments>(&m.routes, root)?,
        authn_resources: served::<AuthnDocuments>(&m.authns, root)?,
        destination_rule_resources: served::<DestinationRuleDocuments>(&m.destination_rules, root)?,
        skipped: m.skipped,
    })
}

/// A mesh of manifests only (no workloads), from parts [`read_manifest`] read; the caller
/// keeps their names unique (an API server does). It carries the resources to serve, not
/// the values read (no route status is worked out from it: it has no Services).
pub fn assemble<'a>(parts: impl IntoIterator<Item = (&'a Path, &'a ManifestParts)>) -> Mesh {
    let mut mesh = Mesh::default();
    for (path, p) in parts {
        mesh.waypoint_resources
            .extend(p.waypoint_resources.iter().cloned());
        mesh.route_resources
            .extend(p.route_resources.iter().cloned());
        mesh.authn_resources
            .extend(p.authn_resources.iter().cloned());
        mesh.destination_rule_resources
            .extend(p.destination_rule_resources.iter().cloned());
        mesh.skipped.extend(p.skipped.iter().cloned());
        mesh.files.push(path.to_path_buf());
    }
    mesh
}

/// What the manifest files come to, as they are read: each document with its text.
#[derive(Default)]
struct Manifests {
    policies: Vec<(Located<WaypointPolicy>, String)>,
    routes: Vec<(Located<ambit_gateway_routes::Route>, String)>,
    authns: Vec<(Located<ambit_manifests::WaypointAuthn>, String)>,
    destination_rules: Vec<(Located<ambit_manifests::WaypointDestinationRule>, String)>,
    /// `<kind>/<namespace>/<name>` of each → the file that defines it.
    documents_at: BTreeMap<String, PathBuf>,
    skipped: Vec<String>,
    /// `namespace/name` → the file that defines it.
    at: BTreeMap<String, PathBuf>,
}

impl Manifests {
    /// Reads one file; its first refused document refuses the mesh.
    fn add(&mut self, path: &Path, text: &str, options: &ParseOptions) -> Result<(), MeshError> {
        let parsed = ambit_manifests::parse_documents(&path.display().to_string(), text, options);
        let mut errors = parsed.errors.into_iter();
        if let Some(first) = errors.next() {
            return Err(MeshError::Manifest {
                first: Box::new(first),
                more: errors.count(),
            });
        }
        // The file read whole had no refusal, so each document reads alone the same.
        for (mut one, text) in
            ambit_manifests::each_document(&path.display().to_string(), text, options)
        {
            for p in one.policies.drain(..) {
                let key = p.value.authorization.key();
                if let Some(first) = self.at.get(&key) {
                    return Err(MeshError::Duplicate {
                        kind: "AuthorizationPolicy",
                        name: key,
                        first: first.clone(),
                        second: path.to_path_buf(),
                    });
                }
                self.at.insert(key, path.to_path_buf());
                self.policies.push((p, text.clone()));
            }
            for route in one.routes.drain(..) {
                let key = resource_name::<RouteDocuments>(&route.value);
                self.first_of(&key, path)?;
                self.routes.push((route, text.clone()));
            }
            for authn in one.authns.drain(..) {
                let key = resource_name::<AuthnDocuments>(&authn.value);
                self.first_of(&key, path)?;
                self.authns.push((authn, text.clone()));
            }
            for rule in one.destination_rules.drain(..) {
                let key = resource_name::<DestinationRuleDocuments>(&rule.value);
                self.first_of(&key, path)?;
                self.destination_rules.push((rule, text.clone()));
            }
        }
        self.skipped.extend(
            parsed
                .skipped
                .iter()
                .map(|s| format!("{}: {}", s.origin, s.value)),
        );
        Ok(())
    }
}

impl Manifests {
    /// Refuses a second document of this `<kind>/<namespace>/<name>` (in any file).
    fn first_of(&mut self, key: &str, path: &Path) -> Result<(), MeshError> {
        if let Some(first) = self.documents_at.get(key) {
            return Err(MeshError::Duplicate {
                kind: "document",
                name: key.to_string(),
                first: first.clone(),
                second: path.to_path_buf(),
            });
        }
        self.documents_at
            .insert(key.to_string(), path.to_path_buf());
        Ok(())
    }
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
pub fn load(dir: &Path, options: &ParseOptions) -> Result<Mesh, MeshError> {
    build(&read_dir(dir)?, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_(files: &[(PathBuf, String)]) -> Result<Mesh, MeshError> {
        build(files, &ParseOptions::default())
    }

    fn files(list: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
        list.iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect()
    }

    const A: &str = "workloads:\n- name: a\n  namespace: ns\n  node: n1\n  serviceAccount: sa-a\n  workloadIps: [\"10.0.0.1\"]\n  authorizationPolicies: [\"ns/deny\"]\n";
    const B: &str = "policies:\n- name: deny\n  namespace: ns\n  scope: WorkloadSelector\n  action: Deny\nservices:\n- name: s\n  namespace: ns\n  hostname: s.ns.svc.cluster.local\n  vips: [\"/10.96.0.1\"]\n";

    #[test]
    fn files_merge_and_may_refer_to_each_other() {
        let mesh = build_(&files(&[("/m/a.yaml", A), ("/m/b.yaml", B)])).unwrap();
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
        let err = build_(&files(&[("/m/a.yaml", A)])).unwrap_err().to_string();
        assert!(err.contains("/m/a.yaml: line 7"), "{err}");
        assert!(err.contains("ns/deny"), "{err}");
    }

    #[test]
    fn duplicates_across_files_name_both_files() {
        let err = build_(&files(&[
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
        let err = build_(&files(&[
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
        let err = build_(&files(&[("/m/bad.yaml", bad)]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/m/bad.yaml: line 4"), "{err}");
        assert!(err.contains("workloads[0].protocol"), "{err}");
    }

    const POLICIES: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: reviews, namespace: ns}\nspec:\n  targetRefs: [{kind: Service, name: reviews}]\n  action: DENY\n  rules: [{to: [{operation: {paths: [/admin]}}]}]\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: ztunnel-only, namespace: ns}\nspec:\n  selector: {matchLabels: {app: a}}\n";

    #[test]
    fn a_file_of_manifests_is_told_from_local_config() {
        let table = [
            ("apiVersion: v1\nkind: X\n", true),
            ("# a comment\n---\nkind: AuthorizationPolicy\n", true),
            (POLICIES, true),
            (A, false),
            (B, false),
            // Only a top-level key counts.
            ("workloads:\n- name: a\n  kind: x\n", false),
            ("", false),
        ];
        for (text, manifest) in table {
            assert_eq!(is_manifest_file(text), manifest, "{text}");
        }
    }

    /// Manifests beside local config: the waypoints' policies served as their own type,
    /// decoding to what the file says; ztunnel's types as before; skipped documents
    /// listed.
    /// Route status, logged once per change: a backend the mesh lacks and a match
    /// another route always wins over, each named with the Service and port.
    #[test]
    fn route_status_names_what_is_not_honoured() {
        let svc = "services:\n- name: s\n  namespace: ns\n  hostname: s.ns.svc.cluster.local\n  vips: [\"/10.96.0.1\"]\n  ports: {80: 8080}\n";
        let route = |name: &str, created: &str, backend: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: ns, creationTimestamp: \"{created}\"}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: s}}]\n  rules:\n  - backendRefs: [{{name: {backend}, port: 80}}]\n"
            )
        };
        let routes = format!(
            "{}---\n{}",
            route("old", "2024-01-01T00:00:00Z", "s"),
            route("new", "2024-02-01T00:00:00Z", "gone")
        );
        let mesh = build_(&files(&[("/m/a.yaml", svc), ("/m/routes.yaml", &routes)])).unwrap();
        assert_eq!(mesh.routes.len(), 2);
        assert_eq!(mesh.route_resources.len(), 2);
        let lines = mesh.route_status();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines.iter().any(|l| l.starts_with("ns/s:80: HTTPRoute ns/new: rule 0 match 0 conflicts with HTTPRoute ns/old rule 0 match 0")),
            "{lines:?}"
        );
        assert!(
            lines.iter().any(|l| l == "ns/s:80: HTTPRoute ns/new: rule 0: backend ns/gone does not exist in the mesh: its share of requests is answered 500"),
            "{lines:?}"
        );
        // The same route in two files is refused, as a policy is.
        let again = build_(&files(&[
            ("/m/a.yaml", svc),
            ("/m/r1.yaml", &route("old", "2024-01-01T00:00:00Z", "s")),
            ("/m/r2.yaml", &route("old", "2024-01-01T00:00:00Z", "s")),
        ]));
        assert!(
            matches!(
                again,
                Err(MeshError::Duplicate {
                    kind: "document",
                    ..
                })
            ),
            "{again:?}"
        );
    }

    #[test]
    fn manifests_are_served_as_the_waypoints_own_type() {
        let mesh = build_(&files(&[
            ("/m/a.yaml", A),
            ("/m/b.yaml", B),
            ("/m/policies.yaml", POLICIES),
        ]))
        .unwrap();
        assert_eq!(mesh.waypoint_policies.len(), 1);
        assert_eq!(
            mesh.waypoint_policies[0].origin.to_string(),
            "/m/policies.yaml:1"
        );
        assert_eq!(mesh.skipped.len(), 1);
        assert!(
            mesh.skipped[0].starts_with("/m/policies.yaml:9: security.istio.io/v1 AuthorizationPolicy ns/ztunnel-only: selects workloads"),
            "{:?}",
            mesh.skipped
        );
        let snap = mesh.snapshot(1);
        let served = snap.resources(ambit_proto::WAYPOINT_POLICY_TYPE).unwrap();
        assert_eq!(
            served.keys().collect::<Vec<_>>(),
            ["AuthorizationPolicy/ns/reviews"]
        );
        let any = served["AuthorizationPolicy/ns/reviews"]
            .resource
            .clone()
            .unwrap();
        assert_eq!(any.type_url, ambit_proto::WAYPOINT_POLICY_TYPE);
        let decoded = <ambit_waypoint_xds::WaypointPolicies as ambit_xds::ResourceType>::decode(
            &ambit_waypoint_xds::WaypointPolicies::default(),
            &any.value,
        )
        .unwrap();
        assert_eq!(
            decoded.op,
            ambit_waypoint_xds::DocumentOp::Put(std::sync::Arc::new(
                mesh.waypoint_policies[0].value.clone()
            ))
        );
        // ztunnel's types are what the local config says, untouched by the manifests.
        assert_eq!(
            snap.resources(ambit_proto::AUTHORIZATION_TYPE)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(snap.resources(ambit_proto::ADDRESS_TYPE).unwrap().len(), 2);
        // Without manifests, the type is served empty.
        let plain = build_(&files(&[("/m/a.yaml", A), ("/m/b.yaml", B)])).unwrap();
        let snap = plain.snapshot(1);
        assert!(snap
            .resources(ambit_proto::WAYPOINT_POLICY_TYPE)
            .unwrap()
            .is_empty());
    }

    /// Each mesh and the start of its refusal: a bad document with its file, line, column
    /// and field; a policy defined twice, naming both files; one no waypoint could take.
    #[test]
    fn a_bad_manifest_refuses_the_mesh_naming_file_line_and_field() {
        let bad_method = POLICIES.replace("paths: [/admin]", "methods: [get]");
        let long_target =
            POLICIES.replace("name: reviews}]", &format!("name: {}}}]", "r".repeat(5000)));
        let second_bad = format!("{bad_method}---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: x}}\nspec: {{action: NOPE}}\n");
        let local_policy = B.replace("name: deny", "name: reviews");
        let table: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (
                vec![("/m/p.yaml", bad_method.as_str())],
                "/m/p.yaml:7:40: spec.rules[0].to[0].operation.methods[0]: ",
            ),
            (
                vec![("/m/p.yaml", second_bad.as_str())],
                "/m/p.yaml:7:40: spec.rules[0].to[0].operation.methods[0]: ",
            ),
            (
                vec![("/m/p.yaml", POLICIES), ("/m/q.yaml", POLICIES)],
                "AuthorizationPolicy \"ns/reviews\" is defined in both /m/p.yaml and /m/q.yaml",
            ),
            (
                vec![
                    ("/m/b.yaml", local_policy.as_str()),
                    ("/m/p.yaml", POLICIES),
                ],
                "AuthorizationPolicy \"ns/reviews\" is defined in both /m/b.yaml and /m/p.yaml",
            ),
            (
                vec![("/m/p.yaml", long_target.as_str())],
                "/m/p.yaml:5:38: spec.targetRefs[0].name: \"rrrr",
            ),
        ];
        for (list, want) in table {
            let err = build_(&files(&list)).unwrap_err().to_string();
            assert!(err.starts_with(want), "\n  got  {err}\n  want {want}...");
        }
        // Every refused document is counted.
        let err = build_(&files(&[("/m/p.yaml", &second_bad)]))
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("(and 1 more refused documents)"), "{err}");
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
        load(dir.path(), &ParseOptions::default()).unwrap();
        assert!(matches!(
            load(&dir.path().join("missing"), &ParseOptions::default()),
            Err(MeshError::ReadDir { .. })
        ));
    }
}
