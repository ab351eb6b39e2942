//! What a watcher sees: selection of events by namespace and selectors (an object that
//! stops matching is DELETED for that watcher, one that starts matching ADDED, as the
//! watch cache does), and the wire form of events. Sans IO.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::resource::Resource;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{set_rv, Event, EventType};

/// The objects one watch selects.
#[derive(Clone, Debug)]
pub struct WatchFilter {
    pub resource: Resource,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchFilter {
    pub fn matches(&self, obj: &Value) -> bool {
        let ns_ok = self
            .namespace
            .as_deref()
            .is_none_or(|n| obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(n));
        ns_ok && self.labels.matches(obj) && self.fields.matches(self.resource, obj)
    }

    /// The event this watcher gets for `ev`, if any.
    pub fn translate(&self, ev: &Event) -> Option<(EventType, Arc<Value>)> {
        if ev.key.0 != self.resource {
            return None;
        }
        let now = self.matches(&ev.object);
        let before = ev.old.as_deref().is_some_and(|o| self.matches(o));
        match ev.kind {
            EventType::Added if now => Some((EventType::Added, ev.object.clone())),
            EventType::Deleted if now => Some((EventType::Deleted, ev.object.clone())),
            EventType::Modified => match (before, now) {
                (true, true) => Some((EventType::Modified, ev.object.clone())),
                (false, true) => Some((EventType::Added, ev.object.clone())),
                (true, false) => {
                    // The last state this watcher saw matching, at the event's version.
                    let mut last = ev.old.as_deref().cloned().unwrap_or(Value::Null);
                    set_rv(&mut last, ev.rv);
                    Some((EventType::Deleted, Arc::new(last)))
                }
                (false, false) => None,
            },
            _ => None,
        }
    }
}

/// One newline-terminated watch event.
pub fn event_line(kind: &str, object: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object}))
        .unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line
}

/// A BOOKMARK's object in the watch's `version`: only the type and the resourceVersion
/// (plus, for the end of a streamed initial list, Kubernetes' annotation saying so).
pub fn bookmark(resource: Resource, version: &str, rv: u64, initial_events_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": resource.kind(), "apiVersion": resource.api_version_in(version), "metadata": meta})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventType, old: Option<Value>, new: Value) -> Event {
        Event {
            rv: 9,
            kind,
            key: (Resource::Pods, "default".into(), "p".into()),
            old: old.map(Arc::new),
            object: Arc::new(new),
        }
    }

    fn p(app: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default", "labels": {"app": app}, "resourceVersion": "8"}})
    }

    #[test]
    fn selector_transitions() {
        let f = WatchFilter {
            resource: Resource::Pods,
            namespace: Some("default".into()),
            labels: LabelSelector::parse("app=x").unwrap(),
            fields: FieldSelector::default(),
        };
        let kind = |e: &Event| f.translate(e).map(|(k, _)| k);
        assert_eq!(
            kind(&ev(EventType::Added, None, p("x"))),
            Some(EventType::Added)
        );
        assert_eq!(kind(&ev(EventType::Added, None, p("y"))), None);
        assert_eq!(
            kind(&ev(EventType::Modified, Some(p("x")), p("x"))),
            Some(EventType::Modified)
        );
        assert_eq!(
            kind(&ev(EventType::Modified, Some(p("y")), p("x"))),
            Some(EventType::Added)
        );
        let (k, obj) = f
            .translate(&ev(EventType::Modified, Some(p("x")), p("y")))
            .unwrap();
        assert_eq!(k, EventType::Deleted);
        assert_eq!(obj["metadata"]["labels"]["app"], "x");
        assert_eq!(obj["metadata"]["resourceVersion"], "9");
        assert_eq!(kind(&ev(EventType::Modified, Some(p("y")), p("z"))), None);
        assert_eq!(
            kind(&ev(EventType::Deleted, Some(p("x")), p("x"))),
            Some(EventType::Deleted)
        );
        let mut other_ns = p("x");
        other_ns["metadata"]["namespace"] = json!("other");
        assert_eq!(kind(&ev(EventType::Added, None, other_ns)), None);
    }

    #[test]
    fn wire_forms() {
        let line = event_line("ADDED", &json!({"a": 1}));
        assert_eq!(
            line,
            b"{\"object\":{\"a\":1},\"type\":\"ADDED\"}\n".to_vec()
        );
        let b = bookmark(Resource::Pods, "v1", 7, false);
        assert_eq!(
            b,
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}})
        );
        let b = bookmark(Resource::AuthorizationPolicies, "v1beta1", 8, true);
        assert_eq!(b["apiVersion"], "security.istio.io/v1beta1");
        assert_eq!(b["kind"], "AuthorizationPolicy");
    }
}
