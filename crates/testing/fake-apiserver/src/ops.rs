//! Create, update (main resource and `status` subresource), patch and delete, with
//! Kubernetes' rules for metadata, status, generation, optimistic concurrency and no-op
//! writes. Sans IO: the caller broadcasts the returned events.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::resource::Resource;
use crate::store::{key_of, Event, Key, Store};

/// The object written (or current, for a no-op) and the events to fan out.
pub type Outcome = (Arc<Value>, Vec<Arc<Event>>);

/// Which part of an object a write addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
}

/// A PATCH body's media type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 7386.
    Merge,
    /// RFC 6902.
    Json,
    /// Treated as a merge patch: maps merge, `$`-directives are dropped, and lists are
    /// replaced whole (list merge keys are not implemented).
    Strategic,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Result<PatchType, ApiError> {
        let media = ct.split(';').next().unwrap_or_default().trim();
        match media {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            _ => Err(ApiError::unsupported_patch(ct)),
        }
    }
}

/// `2026-01-02T03:04:05Z`, as Kubernetes writes timestamps.
pub(crate) fn now_rfc3339() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn new_uid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn random_suffix() -> String {
    // Kubernetes' alphabet for generated names: no vowels, no confusable digits.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random::<usize>() % ALPHABET.len()] as char)
        .collect()
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// How Kubernetes validates names of `r`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NameRule {
    Label,
    Subdomain,
    PathSegment,
}

fn name_rule(r: Resource) -> NameRule {
    match r {
        Resource::Namespaces => NameRule::Label,
        Resource::ClusterRoles
        | Resource::ClusterRoleBindings
        | Resource::Roles
        | Resource::RoleBindings => NameRule::PathSegment,
        // Pods, nodes, config maps, events, daemonsets, and custom resources.
        _ => NameRule::Subdomain,
    }
}

fn name_error(r: Resource, name: &str) -> Option<String> {
    let rule = name_rule(r);
    let ok = match rule {
        NameRule::Label => dns_label(name),
        NameRule::Subdomain => name.len() <= 253 && name.split('.').all(dns_label),
        NameRule::PathSegment => {
            !name.contains('/') && !name.contains('%') && name != "." && name != ".."
        }
    };
    if ok {
        return None;
    }
    Some(match rule {
        NameRule::Label => format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 label must consist \
             of lower case alphanumeric characters or '-', and must start and end with an \
             alphanumeric character"
        ),
        NameRule::Subdomain => format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must \
             consist of lower case alphanumeric characters, '-' or '.', and must start and end \
             with an alphanumeric character"
        ),
        NameRule::PathSegment => {
            format!("metadata.name: Invalid value: \"{name}\": may not contain '/' or '%'")
        }
    })
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let o = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

fn version_mismatch(data: &str, expected: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the API version in the data ({data}) does not match the expected API version ({expected})"
    ))
}

/// Checks a body's `apiVersion`/`kind` against the request's `version` of `r`, then puts
/// the object in the storage version. A built-in kind's body may leave both out (the URL
/// says which type is meant); a custom resource's is decoded as an unstructured object,
/// so it needs its kind, a missing `apiVersion` is an empty one, and a wrong kind is
/// refused by validation (422) as kube-apiserver does.
pub(crate) fn check_type(r: Resource, version: &str, body: &mut Value) -> Result<(), ApiError> {
    let expected = r.api_version_in(version);
    let name = meta_str(body, "name").unwrap_or_default().to_string();
    let raw = body.to_string();
    let obj = body
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let api_version = obj.get("apiVersion").and_then(Value::as_str);
    let kind = obj.get("kind").and_then(Value::as_str);
    if r.is_custom() {
        let Some(kind) = kind.filter(|k| !k.is_empty()) else {
            let summary = match raw.get(..30) {
                Some(head) if raw.len() > 30 => format!("{head} ..."),
                _ => raw.clone(),
            };
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): Object 'Kind' is \
                 missing in '{raw}' ({summary})",
                r.kind()
            )));
        };
        let data = api_version.unwrap_or_default();
        if data != expected {
            return Err(version_mismatch(data, &expected));
        }
        if kind != r.kind() {
            return Err(ApiError::invalid_kind(
                r.group(),
                kind,
                &name,
                &format!("kind: Invalid value: \"{kind}\": must be {}", r.kind()),
            ));
        }
    } else {
        if let Some(v) = api_version {
            if v != expected {
                return Err(version_mismatch(v, &expected));
            }
        }
        if let Some(k) = kind {
            if k != r.kind() {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    r.kind()
                )));
            }
        }
    }
    obj.insert("apiVersion".into(), json!(r.api_version()));
    obj.insert("kind".into(), json!(r.kind()));
    Ok(())
}

/// An event's namespace must be its involved object's (or, for an object without one,
/// empty or `default`), as kube-apiserver's validation of core/v1 events says.
fn event_error(event: &Value) -> Option<String> {
    let ns = meta_str(event, "namespace").unwrap_or_default();
    let involved = event
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let event_time = event
        .get("eventTime")
        .is_some_and(|t| t.as_str().is_some_and(|s| !s.is_empty()));
    let ok = match (involved.is_empty(), event_time) {
        (true, false) => ns.is_empty() || ns == "default",
        (true, true) => ns == "default" || ns == "kube-system",
        (false, false) => ns == involved,
        (false, true) => true,
    };
    (!ok).then(|| {
        format!("involvedObject.namespace: Invalid value: \"{involved}\": does not match event.namespace")
    })
}

/// Writes to an immutable config map's data are refused, as kube-apiserver's validation does.
fn config_map_error(old: &Value, new: &Value) -> Option<String> {
    if old.get("immutable") != Some(&json!(true)) {
        return None;
    }
    let forbidden = |f: &str| format!("{f}: Forbidden: field is immutable when `immutable` is set");
    let mut errs = Vec::new();
    if new.get("immutable") != Some(&json!(true)) {
        errs.push(forbidden("immutable"));
    }
    for field in ["data", "binaryData"] {
        if old.get(field) != new.get(field) {
            errs.push(forbidden(field));
        }
    }
    match errs.len() {
        0 => None,
        1 => errs.pop(),
        _ => Some(format!("[{}]", errs.join(", "))),
    }
}

/// Whether an update changes what `metadata.generation` counts: the spec, or for a
/// custom resource anything but metadata and status (as CRDs with a status subresource).
fn generation_changes(r: Resource, old: &Value, new: &Value) -> bool {
    if !r.is_custom() {
        return new.get("spec") != old.get("spec");
    }
    let content = |v: &Value| -> Option<Map<String, Value>> {
        let mut m = v.as_object()?.clone();
        m.remove("metadata");
        m.remove("status");
        Some(m)
    };
    content(old) != content(new)
}

/// How a create treats a pod's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateStatus {
    /// As Kubernetes: status is reset (pods start `Pending`).
    Reset,
    /// Keep a given status (the Rust API, standing in for the kubelet); `Pending` if none.
    Keep,
}

/// Creates `body`, sent for `version` of `r`, in namespace `ns` (from the path).
pub fn create(
    store: &mut Store,
    r: Resource,
    version: &str,
    ns: Option<&str>,
    mut body: Value,
    status: CreateStatus,
) -> Result<Outcome, ApiError> {
    if !r.stored() {
        return Err(ApiError::internal(&format!(
            "{} are not stored",
            r.plural()
        )));
    }
    check_type(r, version, &mut body)?;
    let meta = meta_mut(&mut body)?;
    if r.namespaced() {
        let path_ns = ns.unwrap_or("default");
        match meta.get("namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != path_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {}
        }
        meta.insert("namespace".into(), json!(path_ns));
    } else {
        meta.remove("namespace");
    }
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| !v.is_empty())
    {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        match meta.get("generateName").and_then(Value::as_str) {
            Some(g) if !g.is_empty() => name = format!("{g}{}", random_suffix()),
            _ => {
                return Err(ApiError::invalid(
                    r,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ))
            }
        }
    }
    if let Some(e) = name_error(r, &name) {
        return Err(ApiError::invalid(r, &name, &e));
    }
    if r == Resource::Events {
        if let Some(e) = event_error(&body) {
            return Err(ApiError::invalid(r, &name, &e));
        }
    }
    let meta = meta_mut(&mut body)?;
    meta.insert("name".into(), json!(name));
    meta.insert("uid".into(), json!(new_uid()));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    meta.remove("deletionTimestamp");
    if r.has_generation() {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    if r == Resource::Namespaces {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }
    let ns_name = meta
        .get("namespace")
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(n) = &ns_name {
        if store.get(&key_of(Resource::Namespaces, None, n)).is_none() {
            return Err(ApiError::not_found(Resource::Namespaces, n));
        }
    }
    let key = key_of(r, ns_name.as_deref(), &name);
    if store.get(&key).is_some() {
        return Err(ApiError::already_exists(r, &name));
    }
    let obj = body
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    match r {
        Resource::Pods => {
            if status == CreateStatus::Reset || !obj.contains_key("status") {
                obj.insert("status".into(), json!({"phase": "Pending"}));
            }
            obj.entry("spec").or_insert_with(|| json!({}));
        }
        Resource::Namespaces => {
            obj.insert("status".into(), json!({"phase": "Active"}));
            obj.entry("spec")
                .or_insert_with(|| json!({"finalizers": ["kubernetes"]}));
        }
        Resource::DaemonSets if status == CreateStatus::Reset => {
            obj.insert(
                "status".into(),
                json!({"currentNumberScheduled": 0, "numberMisscheduled": 0,
                       "desiredNumberScheduled": 0, "numberReady": 0}),
            );
        }
        // A custom resource with a status subresource: create cannot set status.
        _ if r.is_custom() && status == CreateStatus::Reset => {
            obj.remove("status");
        }
        _ => {}
    }
    let ev = store.insert(key, body);
    Ok((ev.object.clone(), vec![ev]))
}

fn current(store: &Store, key: &Key) -> Result<Arc<Value>, ApiError> {
    store
        .get(key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(key.0, &key.2))
}

/// Writes `body` (sent for `version`) over `old` (the object at `key`) under Kubernetes'
/// rules for `sub`.
fn finish_update(
    store: &mut Store,
    key: Key,
    version: &str,
    old: Arc<Value>,
    body: Value,
    sub: Sub,
) -> Result<Outcome, ApiError> {
    let r = key.0;
    let mut body = body;
    check_type(r, version, &mut body)?;
    let want_rv = meta_str(&body, "resourceVersion").unwrap_or_default();
    let old_rv = meta_str(&old, "resourceVersion").unwrap_or_default();
    if !want_rv.is_empty() && want_rv != old_rv {
        return Err(ApiError::conflict(r, &key.2, ApiError::MODIFIED));
    }
    let mut new = match sub {
        Sub::Main => {
            let mut new = body;
            if r.has_status() {
                let o = new
                    .as_object_mut()
                    .ok_or_else(|| ApiError::bad_request("not an object"))?;
                match old.get("status") {
                    Some(s) => o.insert("status".into(), s.clone()),
                    None => o.remove("status"),
                };
            }
            new
        }
        Sub::Status => {
            // The old object with the body's status, and for built-in kinds its labels and
            // annotations (a custom resource's status write takes its status only).
            let mut new = (*old).clone();
            let o = new
                .as_object_mut()
                .ok_or_else(|| ApiError::internal("stored object is not a map"))?;
            match body.get("status") {
                Some(s) => o.insert("status".into(), s.clone()),
                None => o.remove("status"),
            };
            if r.is_custom() {
                return write_if_changed(store, key, old, new);
            }
            let m = meta_mut(&mut new)?;
            for field in ["labels", "annotations"] {
                match body.get("metadata").and_then(|bm| bm.get(field)) {
                    Some(v) if !v.is_null() => m.insert(field.into(), v.clone()),
                    _ => m.remove(field),
                };
            }
            new
        }
    };
    // Identity and bookkeeping fields stay the server's.
    let m = meta_mut(&mut new)?;
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "generation",
    ] {
        match old.get("metadata").and_then(|om| om.get(field)) {
            Some(v) => m.insert(field.into(), v.clone()),
            None => m.remove(field),
        };
    }
    if r == Resource::ConfigMaps {
        if let Some(e) = config_map_error(&old, &new) {
            return Err(ApiError::invalid(r, &key.2, &e));
        }
    }
    if r.has_generation() && sub == Sub::Main && generation_changes(r, &old, &new) {
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(&mut new)?.insert("generation".into(), json!(generation + 1));
    }
    write_if_changed(store, key, old, new)
}

/// Stores `new` unless it equals `old` (a no-op write bumps nothing).
fn write_if_changed(
    store: &mut Store,
    key: Key,
    old: Arc<Value>,
    new: Value,
) -> Result<Outcome, ApiError> {
    if new == *old {
        return Ok((old, Vec::new()));
    }
    let ev = store.insert(key, new);
    Ok((ev.object.clone(), vec![ev]))
}

/// Replaces the object at (`r`, `ns`, `name`) with `body`, sent for `version` (PUT).
pub fn update(
    store: &mut Store,
    r: Resource,
    version: &str,
    ns: Option<&str>,
    name: &str,
    sub: Sub,
    body: Value,
) -> Result<Outcome, ApiError> {
    let key = key_of(r, ns, name);
    let body_name = meta_str(&body, "name").unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if r.namespaced() {
        if let Some(n) = meta_str(&body, "namespace").filter(|n| !n.is_empty()) {
            if n != key.1 {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
    }
    let Some(old) = store.get(&key).cloned() else {
        if r.create_on_update() && sub == Sub::Main {
            let mut body = body;
            if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            return create(store, r, version, ns, body, CreateStatus::Reset);
        }
        return Err(ApiError::not_found(r, name));
    };
    finish_update(store, key, version, old, body, sub)
}

/// Drops strategic-merge `$` directives so the rest applies as a merge patch.
fn strip_directives(v: &mut Value) {
    if let Some(m) = v.as_object_mut() {
        m.retain(|k, _| !k.starts_with('$'));
        for child in m.values_mut() {
            strip_directives(child);
        }
    }
}

/// Applies a PATCH of type `pt`, sent for `version`, to the object as that version shows
/// it (PATCH).
#[allow(clippy::too_many_arguments)] // the parts of the request, each one meaningful
pub fn patch(
    store: &mut Store,
    r: Resource,
    version: &str,
    ns: Option<&str>,
    name: &str,
    sub: Sub,
    pt: PatchType,
    body: &[u8],
) -> Result<Outcome, ApiError> {
    let key = key_of(r, ns, name);
    let old = current(store, &key)?;
    let mut patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut doc = crate::resource::served_as(r, version, &old).into_owned();
    match pt {
        PatchType::Merge | PatchType::Strategic => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            if pt == PatchType::Strategic {
                strip_directives(&mut patch);
            }
            json_patch::merge(&mut doc, &patch);
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut doc, &ops)
                .map_err(|e| ApiError::invalid(r, name, &format!("the JSON patch failed: {e}")))?;
        }
    }
    let patched_name = meta_str(&doc, "name").unwrap_or_default();
    if patched_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({patched_name}) does not match the name on the URL ({name})"
        )));
    }
    finish_update(store, key, version, old, doc, sub)
}

/// Changes the stored object with `f`, bypassing the subresource rules (a test's kubelet).
pub fn modify(
    store: &mut Store,
    r: Resource,
    ns: Option<&str>,
    name: &str,
    f: impl FnOnce(&mut Value),
) -> Result<Outcome, ApiError> {
    let key = key_of(r, ns, name);
    let old = current(store, &key)?;
    let mut new = (*old).clone();
    f(&mut new);
    let m = meta_mut(&mut new)?;
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "resourceVersion",
    ] {
        if let Some(v) = old.get("metadata").and_then(|om| om.get(field)) {
            m.insert(field.into(), v.clone());
        }
    }
    if new == *old {
        return Ok((old, Vec::new()));
    }
    let ev = store.insert(key, new);
    Ok((ev.object.clone(), vec![ev]))
}

/// Deletes the object now; a namespace takes its namespaced objects with it. `options` is
/// a DeleteOptions body whose `preconditions` (uid, resourceVersion) are checked.
pub fn delete(
    store: &mut Store,
    r: Resource,
    ns: Option<&str>,
    name: &str,
    options: Option<&Value>,
) -> Result<Outcome, ApiError> {
    let key = key_of(r, ns, name);
    let old = current(store, &key)?;
    if let Some(pre) = options.and_then(|o| o.get("preconditions")) {
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            if let Some(want) = pre.get(field).and_then(Value::as_str) {
                let have = meta_str(&old, field).unwrap_or_default();
                if want != have {
                    return Err(ApiError::conflict(
                        r,
                        name,
                        &format!(
                            "Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"
                        ),
                    ));
                }
            }
        }
    }
    let mut events = Vec::new();
    if r == Resource::Namespaces {
        let inside: Vec<Key> = Resource::ALL
            .into_iter()
            .filter(|r| r.namespaced())
            .flat_map(|nr| {
                store
                    .list(nr, Some(name))
                    .map(|(k, _)| k.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        for k in inside {
            events.extend(store.remove(&k));
        }
    }
    let ev = store
        .remove(&key)
        .ok_or_else(|| ApiError::not_found(r, name))?;
    let last = ev.object.clone();
    events.push(ev);
    Ok((last, events))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EventType;

    fn setup() -> Store {
        let mut s = Store::new(100);
        create(
            &mut s,
            Resource::Namespaces,
            "v1",
            None,
            json!({"metadata": {"name": "default"}}),
            CreateStatus::Reset,
        )
        .unwrap();
        create(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            json!({"metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {"nodeName": "n1"},
                   "status": {"phase": "Running"}}),
            CreateStatus::Reset,
        )
        .unwrap();
        s
    }

    fn pod(s: &Store) -> Arc<Value> {
        s.get(&key_of(Resource::Pods, Some("default"), "p"))
            .unwrap()
            .clone()
    }

    #[test]
    fn create_sets_server_fields() {
        let s = setup();
        let p = pod(&s);
        assert_eq!(p["apiVersion"], "v1");
        assert_eq!(p["kind"], "Pod");
        assert_eq!(p["metadata"]["namespace"], "default");
        assert_eq!(p["metadata"]["resourceVersion"], "2");
        assert_eq!(p["metadata"]["generation"], 1);
        assert_eq!(p["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert!(p["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z'));
        assert_eq!(
            p["status"],
            json!({"phase": "Pending"}),
            "HTTP creates reset status"
        );
        let ns = s
            .get(&key_of(Resource::Namespaces, None, "default"))
            .unwrap();
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "default"
        );
        assert!(ns["metadata"].get("generation").is_none());
    }

    #[test]
    fn create_errors() {
        let mut s = setup();
        let e = create(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            json!({"metadata": {"name": "p"}}),
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.reason, e.message.as_str()),
            (409, "AlreadyExists", "pods \"p\" already exists")
        );
        let e = create(
            &mut s,
            Resource::Pods,
            "v1",
            Some("nope"),
            json!({"metadata": {"name": "q"}}),
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(e.message, "namespaces \"nope\" not found");
        let e = create(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            json!({"metadata": {}}),
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        let e = create(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            json!({"kind": "Node", "metadata": {"name": "z"}}),
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        let (p, _) = create(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            json!({"metadata": {"generateName": "web-"}}),
            CreateStatus::Reset,
        )
        .unwrap();
        let n = p["metadata"]["name"].as_str().unwrap();
        assert!(n.starts_with("web-") && n.len() == 9, "{n}");
    }

    #[test]
    fn status_subresource_rules() {
        let mut s = setup();
        // Main resource: status changes are ignored, spec and labels apply.
        let (p, ev) = patch(&mut s, Resource::Pods, "v1", Some("default"), "p", Sub::Main, PatchType::Merge,
            br#"{"spec":{"nodeName":"n2"},"status":{"phase":"Failed"},"metadata":{"labels":{"a":"b"}}}"#).unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(p["spec"]["nodeName"], "n2");
        assert_eq!(p["metadata"]["labels"]["a"], "b");
        assert_eq!(
            p["metadata"]["generation"], 2,
            "a spec change bumps generation"
        );
        // Status: spec changes are ignored, status and annotations apply.
        let (p, _) = patch(&mut s, Resource::Pods, "v1", Some("default"), "p", Sub::Status, PatchType::Merge,
            br#"{"spec":{"nodeName":"n3"},"status":{"phase":"Running","podIP":"10.0.0.1"},"metadata":{"annotations":{"k":"v"}}}"#).unwrap();
        assert_eq!(p["spec"]["nodeName"], "n2");
        assert_eq!(p["status"]["podIP"], "10.0.0.1");
        assert_eq!(p["metadata"]["annotations"]["k"], "v");
        assert_eq!(p["metadata"]["generation"], 2);
        // PUT on status with the whole object.
        let mut body = (*p).clone();
        body["status"]["phase"] = json!("Succeeded");
        body["spec"]["nodeName"] = json!("n9");
        let (p, _) = update(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Status,
            body,
        )
        .unwrap();
        assert_eq!(p["status"]["phase"], "Succeeded");
        assert_eq!(p["spec"]["nodeName"], "n2");
    }

    #[test]
    fn no_op_writes_do_not_bump() {
        let mut s = setup();
        let before = s.rv();
        let (p, ev) = patch(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            PatchType::Merge,
            br#"{"metadata":{"labels":{"app":"x"}}}"#,
        )
        .unwrap();
        assert!(ev.is_empty());
        assert_eq!(s.rv(), before);
        assert_eq!(p["metadata"]["resourceVersion"], before.to_string());
        // A status change through the main resource is a no-op too.
        let (_, ev) = patch(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            PatchType::Json,
            br#"[{"op":"replace","path":"/status/phase","value":"Failed"}]"#,
        )
        .unwrap();
        assert!(ev.is_empty());
        let (_, ev) = update(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            (*p).clone(),
        )
        .unwrap();
        assert!(ev.is_empty());
    }

    #[test]
    fn optimistic_concurrency() {
        let mut s = setup();
        let p = pod(&s);
        let mut stale = (*p).clone();
        patch(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            PatchType::Merge,
            br#"{"metadata":{"labels":{"v":"1"}}}"#,
        )
        .unwrap();
        stale["metadata"]["labels"]["v"] = json!("2");
        let e = update(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            stale.clone(),
        )
        .unwrap_err();
        assert_eq!(e.code, 409);
        assert_eq!(e.message, "Operation cannot be fulfilled on pods \"p\": the object has been modified; please apply your changes to the latest version and try again");
        // Without a resourceVersion the update is unconditional.
        stale["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        let (p, _) = update(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            stale,
        )
        .unwrap();
        assert_eq!(p["metadata"]["labels"]["v"], "2");
        // A patch carrying a stale resourceVersion is a precondition.
        let e = patch(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            PatchType::Merge,
            br#"{"metadata":{"resourceVersion":"1","labels":{"v":"3"}}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 409);
        let e = update(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "nope",
            Sub::Main,
            json!({"metadata":{"name":"nope"}}),
        )
        .unwrap_err();
        assert_eq!(e.message, "pods \"nope\" not found");
        let e = patch(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            PatchType::Json,
            b"{}",
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml")
                .unwrap_err()
                .code,
            415
        );
    }

    #[test]
    fn strategic_merge_drops_directives() {
        let mut s = setup();
        let (p, _) = patch(
            &mut s,
            Resource::Pods,
            "v1",
            Some("default"),
            "p",
            Sub::Main,
            PatchType::Strategic,
            br#"{"metadata":{"labels":{"app":null,"b":"c"},"$setElementOrder/finalizers":[]}}"#,
        )
        .unwrap();
        assert_eq!(p["metadata"]["labels"], json!({"b": "c"}));
        assert!(p["metadata"].get("$setElementOrder/finalizers").is_none());
    }

    #[test]
    fn deletes_cascade_from_namespaces() {
        let mut s = setup();
        let (last, ev) = delete(&mut s, Resource::Namespaces, None, "default", None).unwrap();
        assert_eq!(last["metadata"]["name"], "default");
        assert_eq!(ev.len(), 2);
        assert!(ev.iter().all(|e| e.kind == EventType::Deleted));
        assert_eq!(ev[0].key.2, "p");
        let e = delete(&mut s, Resource::Pods, Some("default"), "p", None).unwrap_err();
        assert_eq!(e.code, 404);
    }

    #[test]
    fn delete_preconditions() {
        let mut s = setup();
        let e = delete(
            &mut s,
            Resource::Pods,
            Some("default"),
            "p",
            Some(&json!({"preconditions": {"uid": "x"}})),
        )
        .unwrap_err();
        assert_eq!(e.code, 409);
        let uid = pod(&s)["metadata"]["uid"].clone();
        delete(
            &mut s,
            Resource::Pods,
            Some("default"),
            "p",
            Some(&json!({"preconditions": {"uid": uid}})),
        )
        .unwrap();
    }

    fn ap(version: &str) -> Value {
        json!({"apiVersion": format!("security.istio.io/{version}"), "kind": "AuthorizationPolicy",
               "metadata": {"name": "deny", "labels": {"a": "1"}},
               "spec": {"action": "DENY"}, "status": {"validationMessages": []}})
    }

    const AP: Resource = Resource::AuthorizationPolicies;

    #[test]
    fn custom_resources_store_one_version_with_generation_and_status_rules() {
        let mut s = setup();
        let (p, _) = create(
            &mut s,
            AP,
            "v1beta1",
            Some("default"),
            ap("v1beta1"),
            CreateStatus::Reset,
        )
        .unwrap();
        assert_eq!(p["apiVersion"], "security.istio.io/v1", "stored in v1");
        assert_eq!(p["metadata"]["generation"], 1);
        assert!(p.get("status").is_none(), "create cannot set status");
        // Through v1beta1 a patch sees the object as v1beta1 shows it.
        let (p, _) = patch(
            &mut s,
            AP,
            "v1beta1",
            Some("default"),
            "deny",
            Sub::Main,
            PatchType::Json,
            br#"[{"op":"test","path":"/apiVersion","value":"security.istio.io/v1beta1"},
                 {"op":"replace","path":"/spec/action","value":"ALLOW"}]"#,
        )
        .unwrap();
        assert_eq!(p["apiVersion"], "security.istio.io/v1");
        assert_eq!(p["metadata"]["generation"], 2);
        // Metadata changes leave the generation; any other field than status bumps it.
        let (p, _) = patch(
            &mut s,
            AP,
            "v1",
            Some("default"),
            "deny",
            Sub::Main,
            PatchType::Merge,
            br#"{"metadata":{"labels":{"b":"2"}},"status":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(p["metadata"]["generation"], 2);
        assert!(
            p.get("status").is_none(),
            "the main resource ignores status"
        );
        let (p, _) = patch(
            &mut s,
            AP,
            "v1",
            Some("default"),
            "deny",
            Sub::Main,
            PatchType::Merge,
            br#"{"extra":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(p["metadata"]["generation"], 3);
        // The status subresource takes status only: not labels, not spec.
        let (p, ev) = patch(&mut s, AP, "v1beta1", Some("default"), "deny", Sub::Status, PatchType::Merge,
            br#"{"metadata":{"labels":{"c":"3"}},"spec":{"action":"DENY"},"status":{"conditions":[]}}"#).unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(p["status"], json!({"conditions": []}));
        assert!(p["metadata"]["labels"].get("c").is_none());
        assert_eq!(p["spec"]["action"], "ALLOW");
        assert_eq!(p["metadata"]["generation"], 3);
        // The Rust API (a controller's stand-in) may create with a status.
        let mut other = ap("v1");
        other["metadata"]["name"] = json!("other");
        let (p, _) = create(&mut s, AP, "v1", Some("default"), other, CreateStatus::Keep).unwrap();
        assert_eq!(p["status"], json!({"validationMessages": []}));
    }

    #[test]
    fn custom_resource_bodies_are_type_checked_as_kube_apiserver_does() {
        let mut s = setup();
        let e = create(
            &mut s,
            AP,
            "v1",
            Some("default"),
            ap("v1beta1"),
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, "the API version in the data (security.istio.io/v1beta1) does not match the expected API version (security.istio.io/v1)"));
        let mut wrong_group = ap("v1");
        wrong_group["apiVersion"] = json!("networking.istio.io/v1");
        let e = create(
            &mut s,
            AP,
            "v1beta1",
            Some("default"),
            wrong_group,
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(e.message, "the API version in the data (networking.istio.io/v1) does not match the expected API version (security.istio.io/v1beta1)");
        let mut wrong_kind = ap("v1");
        wrong_kind["kind"] = json!("RequestAuthentication");
        let e = create(
            &mut s,
            AP,
            "v1",
            Some("default"),
            wrong_kind,
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (422, "RequestAuthentication.security.istio.io \"deny\" is invalid: kind: Invalid value: \"RequestAuthentication\": must be AuthorizationPolicy"));
        let mut no_kind = ap("v1");
        no_kind.as_object_mut().unwrap().remove("kind");
        let e = create(
            &mut s,
            AP,
            "v1",
            Some("default"),
            no_kind,
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.starts_with("the object provided is unrecognized (must be of type AuthorizationPolicy): Object 'Kind' is missing in '{"), "{}", e.message);
        let mut no_version = ap("v1");
        no_version.as_object_mut().unwrap().remove("apiVersion");
        let e = create(
            &mut s,
            AP,
            "v1",
            Some("default"),
            no_version,
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(e.message, "the API version in the data () does not match the expected API version (security.istio.io/v1)");
        let mut bad_name = ap("v1");
        bad_name["metadata"]["name"] = json!("Deny");
        let e = create(
            &mut s,
            AP,
            "v1",
            Some("default"),
            bad_name,
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert!(e.message.starts_with("AuthorizationPolicy.security.istio.io \"Deny\" is invalid: metadata.name: Invalid value"), "{}", e.message);
        // An update through one version with a body of the other is refused too.
        create(
            &mut s,
            AP,
            "v1",
            Some("default"),
            ap("v1"),
            CreateStatus::Reset,
        )
        .unwrap();
        let e = update(
            &mut s,
            AP,
            "v1beta1",
            Some("default"),
            "deny",
            Sub::Main,
            ap("v1"),
        )
        .unwrap_err();
        assert_eq!(e.message, "the API version in the data (security.istio.io/v1) does not match the expected API version (security.istio.io/v1beta1)");
        update(
            &mut s,
            AP,
            "v1beta1",
            Some("default"),
            "deny",
            Sub::Main,
            ap("v1beta1"),
        )
        .unwrap();
    }

    #[test]
    fn config_maps_and_events() {
        let mut s = setup();
        let cm = json!({"metadata": {"name": "c"}, "data": {"a": "1"}, "immutable": true});
        let (c, _) = create(
            &mut s,
            Resource::ConfigMaps,
            "v1",
            Some("default"),
            cm,
            CreateStatus::Reset,
        )
        .unwrap();
        assert!(c["metadata"].get("generation").is_none());
        let e = patch(
            &mut s,
            Resource::ConfigMaps,
            "v1",
            Some("default"),
            "c",
            Sub::Main,
            PatchType::Merge,
            br#"{"data":{"a":"2"}}"#,
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (422, "ConfigMap \"c\" is invalid: data: Forbidden: field is immutable when `immutable` is set"));
        let e = patch(
            &mut s,
            Resource::ConfigMaps,
            "v1",
            Some("default"),
            "c",
            Sub::Main,
            PatchType::Merge,
            br#"{"immutable":false,"binaryData":{"b":"AA=="}}"#,
        )
        .unwrap_err();
        assert!(e.message.ends_with("is invalid: [immutable: Forbidden: field is immutable when `immutable` is set, binaryData: Forbidden: field is immutable when `immutable` is set]"), "{}", e.message);
        // Its metadata may still change.
        patch(
            &mut s,
            Resource::ConfigMaps,
            "v1",
            Some("default"),
            "c",
            Sub::Main,
            PatchType::Merge,
            br#"{"metadata":{"labels":{"x":"y"}}}"#,
        )
        .unwrap();
        let ev = |name: &str, involved_ns: &str| {
            json!({"metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": involved_ns}, "reason": "R"})
        };
        create(
            &mut s,
            Resource::Events,
            "v1",
            Some("default"),
            ev("p.1", "default"),
            CreateStatus::Reset,
        )
        .unwrap();
        let e = create(
            &mut s,
            Resource::Events,
            "v1",
            Some("default"),
            ev("p.2", "other"),
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (422, "Event \"p.2\" is invalid: involvedObject.namespace: Invalid value: \"other\": does not match event.namespace"));
        let node_event =
            json!({"metadata": {"name": "n.1"}, "involvedObject": {"kind": "Node", "name": "n1"}});
        create(
            &mut s,
            Resource::Events,
            "v1",
            Some("default"),
            node_event,
            CreateStatus::Reset,
        )
        .unwrap();
        let e = create(
            &mut s,
            Resource::TokenReviews,
            "v1",
            None,
            json!({}),
            CreateStatus::Reset,
        )
        .unwrap_err();
        assert_eq!(e.code, 500);
    }

    #[test]
    fn deleting_a_namespace_takes_its_custom_resources() {
        let mut s = setup();
        create(
            &mut s,
            AP,
            "v1",
            Some("default"),
            ap("v1"),
            CreateStatus::Reset,
        )
        .unwrap();
        let gc = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                        "metadata": {"name": "istio"}, "spec": {"controllerName": "istio.io/gateway-controller"}});
        create(
            &mut s,
            Resource::GatewayClasses,
            "v1",
            None,
            gc,
            CreateStatus::Reset,
        )
        .unwrap();
        let (_, ev) = delete(&mut s, Resource::Namespaces, None, "default", None).unwrap();
        assert!(ev.iter().any(|e| e.key.0 == AP));
        assert!(s.get(&key_of(AP, Some("default"), "deny")).is_none());
        assert!(
            s.get(&key_of(Resource::GatewayClasses, None, "istio"))
                .is_some(),
            "cluster-scoped"
        );
    }
}
