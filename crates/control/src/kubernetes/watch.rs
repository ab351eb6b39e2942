//! The watches: cluster-wide, on the L7 kinds and on Gateways and GatewayClasses. Each
//! event lands in [`State`] (sans IO); a re-list (after a dropped watch or a 410) replaces
//! a kind's objects with what it listed, object by object, so an unchanged object is no
//! change and a refused one keeps its last accepted version. What is served is rebuilt by
//! the file mode's readers when the documents changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ambit_manifests::ParseOptions;
use futures_util::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use serde_json::Value;
use tokio::sync::watch;

use super::objects::{Kind, ObjectKey, Objects, Outcome, Refused};
use super::visibility::{UseWaypoint, Visibility};
use crate::shared::{stopped, Shared};

/// What one watch follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    L7(Kind),
    Gateways,
    GatewayClasses,
    /// Their `use-waypoint` labels only.
    Services,
    Namespaces,
}

impl Source {
    pub const ALL: [Source; 9] = [
        Source::L7(Kind::AuthorizationPolicy),
        Source::L7(Kind::RequestAuthentication),
        Source::L7(Kind::HttpRoute),
        Source::L7(Kind::GrpcRoute),
        Source::L7(Kind::DestinationRule),
        Source::Gateways,
        Source::GatewayClasses,
        Source::Services,
        Source::Namespaces,
    ];

    /// The group, version, kind and plural watched.
    pub fn resource(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            Source::L7(k) => (k.group(), k.version(), k.name(), k.plural()),
            Source::Gateways => ("gateway.networking.k8s.io", "v1", "Gateway", "gateways"),
            Source::GatewayClasses => (
                "gateway.networking.k8s.io",
                "v1",
                "GatewayClass",
                "gatewayclasses",
            ),
            Source::Services => ("", "v1", "Service", "services"),
            Source::Namespaces => ("", "v1", "Namespace", "namespaces"),
        }
    }
}

fn text(object: &Value, pointer: &str) -> Option<String> {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// `namespace/name` of a Service.
fn service_key(object: &Value) -> Option<String> {
    Some(format!(
        "{}/{}",
        text(object, "/metadata/namespace")?,
        text(object, "/metadata/name")?
    ))
}

/// An object's key, as the API server gave it.
fn key_of(kind: Kind, object: &Value) -> Option<ObjectKey> {
    let text = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some(ObjectKey {
        kind,
        namespace: text("/metadata/namespace")?,
        name: text("/metadata/name")?,
    })
}

/// Everything the watches hold.
#[derive(Debug, Default)]
pub struct State {
    pub objects: Objects,
    /// The waypoints, and the labels that say what they front (the objects' targets are
    /// added when it is published).
    pub visibility: Visibility,
    /// Objects of a re-list in progress, per source.
    relisting: BTreeMap<Source, Vec<Value>>,
    /// Sources listed once at least.
    synced: BTreeSet<Source>,
    /// A list ended since the last publish (what it read is freed once it is served).
    relisted: bool,
}

impl State {
    /// Takes one event; returns the refusals it caused.
    pub fn on_event(
        &mut self,
        source: Source,
        event: Event<Value>,
        options: &ParseOptions,
    ) -> Vec<Refused> {
        match event {
            Event::Init => {
                self.relisting.insert(source, Vec::new());
                Vec::new()
            }
            Event::InitApply(object) => {
                self.relisting.entry(source).or_default().push(object);
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.relisting.remove(&source).unwrap_or_default();
                self.synced.insert(source);
                self.relisted = true;
                self.replace(source, listed, options)
            }
            Event::Apply(object) => self.apply(source, &object, options),
            Event::Delete(object) => {
                match source {
                    Source::L7(kind) => {
                        if let Some(key) = key_of(kind, &object) {
                            self.objects.delete(&key);
                        }
                    }
                    Source::Gateways => self.visibility.waypoints.delete_gateway(&object),
                    Source::GatewayClasses => self.visibility.waypoints.delete_class(&object),
                    Source::Services => {
                        if let Some(key) = service_key(&object) {
                            self.visibility.set_service(key, None);
                        }
                    }
                    Source::Namespaces => {
                        if let Some(name) = text(&object, "/metadata/name") {
                            self.visibility.set_namespace(name, None);
                        }
                    }
                }
                Vec::new()
            }
        }
    }

    fn apply(&mut self, source: Source, object: &Value, options: &ParseOptions) -> Vec<Refused> {
        match source {
            Source::L7(kind) => {
                let Some(key) = key_of(kind, object) else {
                    return Vec::new();
                };
                let meta = |f: &str| {
                    object
                        .pointer(&format!("/metadata/{f}"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                };
                let (message, kept) = match self.objects.apply(key.clone(), object, options) {
                    Outcome::Accepted => return Vec::new(),
                    Outcome::Refused { message, kept } => (message, kept),
                    Outcome::OverLimit { message } => (message, false),
                };
                vec![Refused {
                    key,
                    message,
                    kept,
                    uid: meta("uid"),
                    resource_version: meta("resourceVersion"),
                }]
            }
            Source::Gateways => {
                self.visibility.waypoints.apply_gateway(object);
                Vec::new()
            }
            Source::GatewayClasses => {
                self.visibility.waypoints.apply_class(object);
                Vec::new()
            }
            Source::Services => {
                if let Some(key) = service_key(object) {
                    self.visibility
                        .set_service(key, Some(UseWaypoint::of(object)));
                }
                Vec::new()
            }
            Source::Namespaces => {
                if let Some(name) = text(object, "/metadata/name") {
                    self.visibility
                        .set_namespace(name, Some(UseWaypoint::of(object)));
                }
                Vec::new()
            }
        }
    }

    /// A re-list: what it did not list is gone, what it listed is applied.
    fn replace(
        &mut self,
        source: Source,
        listed: Vec<Value>,
        options: &ParseOptions,
    ) -> Vec<Refused> {
        match source {
            Source::L7(kind) => {
                let keep: BTreeSet<ObjectKey> =
                    listed.iter().filter_map(|o| key_of(kind, o)).collect();
                self.objects.retain(|k| k.kind != kind || keep.contains(k));
            }
            Source::Gateways => self.visibility.waypoints.clear_gateways(),
            Source::GatewayClasses => self.visibility.waypoints.clear_classes(),
            Source::Services => self.visibility.clear_services(),
            Source::Namespaces => self.visibility.clear_namespaces(),
        }
        listed
            .iter()
            .flat_map(|o| self.apply(source, o, options))
            .collect()
    }

    /// What each waypoint is shown, the objects' targets included.
    pub fn visibility(&self) -> Visibility {
        let mut v = self.visibility.clone();
        v.clear_objects();
        for (name, namespace, targets) in self.objects.targets() {
            v.set_object(name, namespace.to_string(), targets.to_vec());
        }
        v
    }

    /// Every source listed once.
    pub fn synced(&self) -> bool {
        Source::ALL.iter().all(|s| self.synced.contains(s))
    }
}

/// Runs the watches until `stop`, publishing what is served when it changes.
pub(crate) async fn run(
    shared: Arc<Shared>,
    client: kube::Client,
    kube: Arc<super::KubeShared>,
    mut stop: watch::Receiver<bool>,
) {
    let streams = Source::ALL.map(|source| {
        let (group, version, kind, plural) = source.resource();
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let api: kube::Api<DynamicObject> = kube::Api::all_with(client.clone(), &resource);
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .map(move |event| (source, event))
            .boxed()
    });
    let mut watched = futures_util::stream::select_all(streams);
    let mut events = super::events::Reporter::spawn(client.clone(), shared.clone());
    let options = shared.config.manifests.clone();
    let mut state = State::default();
    let mut published: Option<u64> = None;
    let mut dirty = false;
    loop {
        let next = tokio::select! {
            _ = stopped(&mut stop) => return,
            next = watched.next() => next,
            _ = tokio::time::sleep(Duration::from_millis(50)), if dirty => {
                dirty = false;
                publish(&shared, &kube, &mut state, &mut published);
                continue;
            }
        };
        let Some((source, event)) = next else { return };
        let as_value = |o: DynamicObject| serde_json::to_value(o).unwrap_or(Value::Null);
        let event = match event {
            Ok(Event::Init) => Event::Init,
            Ok(Event::InitApply(o)) => Event::InitApply(as_value(o)),
            Ok(Event::InitDone) => Event::InitDone,
            Ok(Event::Apply(o)) => Event::Apply(as_value(o)),
            Ok(Event::Delete(o)) => Event::Delete(as_value(o)),
            Err(e) => {
                tracing::warn!(?source, "watch: {e} (it re-lists)");
                continue;
            }
        };
        for r in state.on_event(source, event, &options) {
            shared.metrics.objects_refused.inc();
            if r.kept {
                tracing::warn!(
                    "{}: refused, its last accepted version stays: {}",
                    r.key,
                    r.message
                );
            } else {
                tracing::error!("{}: refused: {}", r.key, r.message);
            }
            events.report(r);
        }
        dirty = true;
    }
}

/// Rebuilds what is served when the objects, or what each waypoint is shown, changed:
/// assembled from what each object was read to when it arrived, nothing read again.
fn publish(
    shared: &Shared,
    kube: &super::KubeShared,
    state: &mut State,
    published: &mut Option<u64>,
) {
    if state.synced() {
        kube.synced
            .store(true, std::sync::atomic::Ordering::Release);
    }
    let visibility = state.visibility();
    let view_changed = *kube.visibility() != visibility;
    if view_changed {
        // Before the snapshot: the sessions comparing it must see the new view.
        kube.set_visibility(visibility);
    }
    let generation = state.objects.generation();
    if !view_changed && *published == Some(generation) {
        return;
    }
    shared.publish_as(state.objects.mesh(), view_changed);
    *published = Some(generation);
    // A list's pages and the mesh this one replaces go back to the system, as the file
    // mode does after each load.
    if std::mem::take(&mut state.relisted) {
        ambit_runtime::memory::release_freed();
    }
}

#[cfg(test)]
mod tests;
