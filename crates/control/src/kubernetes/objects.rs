//! The L7 objects read from the API server, sans IO: each object is turned into the document
//! it is (its `apiVersion`, `kind`, `metadata` and `spec`, as written) and read by the very
//! readers the file mode uses. A refused object keeps its last accepted version; a refused
//! AuthorizationPolicy that never had one is served as a stand-in that denies every request
//! to what it targets, so a DENY with a typo never turns into an allow. What this holds is
//! bounded in objects and in bytes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use std::path::Path;
use std::sync::Arc;

use ambit_manifests::ParseOptions;

use super::visibility::{targets_of, Target};
use crate::mesh::ManifestParts;
use serde_json::{json, Value};

/// The most objects held, of all kinds together.
pub const MAX_OBJECTS: usize = 100_000;
/// The most bytes of documents held (each object's text, counted once).
pub const MAX_BYTES: usize = 256 * 1024 * 1024;
/// The largest object taken (the API server's own limit on a request is 3 MiB).
pub const MAX_OBJECT_BYTES: usize = 3 * 1024 * 1024;

/// The kinds read, with the versions whose objects the readers take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    AuthorizationPolicy,
    RequestAuthentication,
    HttpRoute,
    GrpcRoute,
    DestinationRule,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::AuthorizationPolicy,
        Kind::RequestAuthentication,
        Kind::HttpRoute,
        Kind::GrpcRoute,
        Kind::DestinationRule,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::DestinationRule => "DestinationRule",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Kind::AuthorizationPolicy | Kind::RequestAuthentication => "security.istio.io",
            Kind::HttpRoute | Kind::GrpcRoute => "gateway.networking.k8s.io",
            Kind::DestinationRule => "networking.istio.io",
        }
    }

    /// The version watched: the API server serves every object of the kind in it, whatever
    /// version it was written in (security.istio.io v1beta1 objects are seen as v1).
    pub fn version(self) -> &'static str {
        "v1"
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::AuthorizationPolicy => "authorizationpolicies",
            Kind::RequestAuthentication => "requestauthentications",
            Kind::HttpRoute => "httproutes",
            Kind::GrpcRoute => "grpcroutes",
            Kind::DestinationRule => "destinationrules",
        }
    }
}

/// One object: its kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.name(), self.namespace, self.name)
    }
}

/// What an applied object came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Read and served (or skipped as not a waypoint's, as the file mode skips it).
    Accepted,
    /// Refused with the reader's message (source, line, column, field); `kept` says
    /// whether a last accepted version stays in its place.
    Refused { message: String, kept: bool },
    /// Not taken: over a limit (the object is dropped and its last version with it).
    OverLimit { message: String },
}

#[derive(Debug, Clone, Default)]
struct Held {
    /// The last accepted version, read once ([`crate::mesh::read_manifest`]).
    accepted: Option<Arc<ManifestParts>>,
    /// For an AuthorizationPolicy refused from its first version: its stand-in, read.
    stand_in: Option<Arc<ManifestParts>>,
    /// What the served version (the accepted one, else the stand-in) targets.
    targets: Vec<Target>,
    /// The latest version's refusal, if it was refused.
    refused: Option<String>,
}

impl Held {
    fn served(&self) -> Option<&Arc<ManifestParts>> {
        self.accepted.as_ref().or(self.stand_in.as_ref())
    }
}

/// The objects, by key.
#[derive(Debug, Default)]
pub struct Objects {
    held: BTreeMap<ObjectKey, Held>,
    bytes: usize,
    /// Bumped by every change of what is served.
    generation: u64,
}

impl Objects {
    /// Takes `object` (as the API server returned it) at `key`: read once, here; what it
    /// comes to is kept for every mesh assembled after.
    pub fn apply(&mut self, key: ObjectKey, object: &Value, options: &ParseOptions) -> Outcome {
        let document = as_written(key.kind, object);
        let text = match yaml_serde::to_string(&document) {
            Ok(t) => t,
            Err(e) => {
                return self.refuse(
                    &key,
                    format!("{key}: cannot be written as YAML: {e}"),
                    object,
                    options,
                )
            }
        };
        if text.len() > MAX_OBJECT_BYTES {
            self.delete(&key);
            return Outcome::OverLimit {
                message: format!("{key}: {} bytes, more than {MAX_OBJECT_BYTES}", text.len()),
            };
        }
        let is_new = !self.held.contains_key(&key);
        if is_new && self.held.len() >= MAX_OBJECTS {
            return Outcome::OverLimit {
                message: format!("{key}: {MAX_OBJECTS} objects are held already"),
            };
        }
        let previous = self.held.get(&key).map_or(0, held_bytes);
        if self.bytes - previous + text.len() > MAX_BYTES {
            return Outcome::OverLimit {
                message: format!("{key}: the objects held would pass {MAX_BYTES} bytes"),
            };
        }
        let parts = match crate::mesh::read_manifest(Path::new(&key.to_string()), &text, options) {
            Ok(parts) => parts,
            Err(e) => return self.refuse(&key, e.to_string(), object, options),
        };
        let held = self.held.entry(key).or_default();
        self.bytes -= previous;
        held.accepted = Some(Arc::new(parts));
        held.stand_in = None;
        held.targets = targets_of(object);
        held.refused = None;
        self.bytes += held_bytes(held);
        self.generation += 1;
        Outcome::Accepted
    }

    fn refuse(
        &mut self,
        key: &ObjectKey,
        message: String,
        object: &Value,
        options: &ParseOptions,
    ) -> Outcome {
        let held = self.held.entry(key.clone()).or_default();
        held.refused = Some(message.clone());
        if held.accepted.is_none() {
            held.targets = targets_of(object);
            held.stand_in = (key.kind == Kind::AuthorizationPolicy)
                .then(|| stand_in(key, object.pointer("/spec/targetRefs"), &message))
                .flatten()
                .and_then(|text| {
                    crate::mesh::read_manifest(Path::new(&key.to_string()), &text, options).ok()
                })
                .map(Arc::new);
            self.generation += 1;
        }
        Outcome::Refused {
            message,
            kept: held.accepted.is_some(),
        }
    }

    /// Forgets the object.
    pub fn delete(&mut self, key: &ObjectKey) {
        if let Some(held) = self.held.remove(key) {
            self.bytes -= held_bytes(&held);
            self.generation += 1;
        }
    }

    /// Forgets every object `keep` says no to (a re-list: what it did not list is gone).
    pub fn retain(&mut self, keep: impl Fn(&ObjectKey) -> bool) {
        let gone: Vec<ObjectKey> = self.held.keys().filter(|k| !keep(k)).cloned().collect();
        for key in gone {
            self.delete(&key);
        }
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Bumped by every change of what is served (an unchanged object re-listed is none).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The objects refused now, with their messages.
    pub fn refused(&self) -> impl Iterator<Item = (&ObjectKey, &str)> {
        self.held
            .iter()
            .filter_map(|(k, h)| Some((k, h.refused.as_deref()?)))
    }

    /// What is served: each object's accepted version, and for an AuthorizationPolicy
    /// refused without one, its stand-in; assembled from what each was read to, nothing
    /// read again.
    pub fn mesh(&self) -> crate::mesh::Mesh {
        let served: Vec<(PathBuf, &Arc<ManifestParts>)> = self
            .held
            .iter()
            .filter_map(|(key, held)| Some((path_of(key), held.served()?)))
            .collect();
        crate::mesh::assemble(served.iter().map(|(p, parts)| (p.as_path(), &***parts)))
    }

    /// Each object served, as it is named on the wire (`<kind>/<namespace>/<name>`), with
    /// its namespace and what the served version targets.
    pub fn targets(&self) -> impl Iterator<Item = (String, &str, &[Target])> {
        self.held
            .iter()
            .filter(|(_, h)| h.served().is_some())
            .map(|(k, h)| {
                (
                    format!("{}/{}/{}", k.kind.name(), k.namespace, k.name),
                    k.namespace.as_str(),
                    h.targets.as_slice(),
                )
            })
    }
}

/// Where an object's refusals and skips say it came from.
fn path_of(key: &ObjectKey) -> PathBuf {
    PathBuf::from(format!(
        "kubernetes/{}/{}/{}/{}",
        key.kind.group(),
        key.kind.plural(),
        key.namespace,
        key.name
    ))
}

fn held_bytes(held: &Held) -> usize {
    held.accepted.as_ref().map_or(0, |p| p.wire_bytes())
}

/// The object as written: `apiVersion`, `kind`, `metadata` without what the server keeps
/// for itself, and `spec`.
fn as_written(kind: Kind, object: &Value) -> Value {
    let mut metadata = object.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Some(m) = metadata.as_object_mut() {
        for server_side in [
            "managedFields",
            "resourceVersion",
            "uid",
            "generation",
            "creationTimestamp",
            "selfLink",
        ] {
            m.remove(server_side);
        }
    }
    json!({
        "apiVersion": object.get("apiVersion").cloned()
            .unwrap_or_else(|| json!(format!("{}/{}", kind.group(), kind.version()))),
        "kind": object.get("kind").cloned().unwrap_or_else(|| json!(kind.name())),
        "metadata": metadata,
        "spec": object.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// A refused AuthorizationPolicy with no accepted version: DENY every request to what it
/// targets (its `targetRefs` as written, when they are a list of objects), under its own
/// name. None when its targets cannot be read: then it names no waypoint to close.
fn stand_in(key: &ObjectKey, target_refs: Option<&Value>, why: &str) -> Option<String> {
    // A refusal message can be long; the annotation says why in short.
    let why: String = why.chars().take(512).collect();
    let refs: Vec<Value> = target_refs?
        .as_array()?
        .iter()
        .filter(|r| {
            ["kind", "name"].iter().all(|f| {
                r.get(f)
                    .and_then(Value::as_str)
                    .is_some_and(|v| !v.is_empty())
            })
        })
        .map(|r| {
            json!({
                "group": r.get("group").cloned().unwrap_or(json!("")),
                "kind": r["kind"],
                "name": r["name"],
            })
        })
        .collect();
    if refs.is_empty() {
        return None;
    }
    let document = json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {
            "name": key.name,
            "namespace": key.namespace,
            "annotations": {"ambit.io/refused": why},
        },
        "spec": {"targetRefs": refs, "action": "DENY", "rules": [{}]},
    });
    yaml_serde::to_string(&document).ok()
}

/// A refusal (or a dropped object) to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub key: ObjectKey,
    pub message: String,
    pub kept: bool,
    /// The object's `uid` and `resourceVersion`, for the Event that names it.
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

#[cfg(test)]
pub(crate) mod tests;
