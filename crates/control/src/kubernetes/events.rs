//! A Warning Event on every object version refused (istiod may call the same object
//! Accepted in its status, so the refusal must be where `kubectl describe` shows it). One
//! Event per refused version, however often it is re-listed; the Events waiting to be
//! written are bounded (beyond, they are dropped and counted).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use tokio::sync::mpsc;

use super::objects::Refused;
use crate::shared::Shared;

/// The component Events name as their source.
pub const COMPONENT: &str = "ambit-control";
/// The reason Events give.
pub const REASON: &str = "RefusedByWaypointReader";
/// Events waiting to be written at most.
pub const QUEUE: usize = 256;
/// Refused versions remembered, so a re-list does not report one twice.
pub const REMEMBERED: usize = 4096;
/// The longest message written (the API server keeps Events small).
pub const MAX_MESSAGE: usize = 1024;

/// The Event for a refused version, at `now`.
pub fn event_for(r: &Refused, now: Time) -> Event {
    let mut message = format!(
        "refused by ambit's waypoint configuration reader ({}): {}",
        if r.kept {
            "its last accepted version is still served"
        } else {
            "no version of it is served"
        },
        r.message
    );
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", r.key.name)),
            namespace: Some(r.key.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(format!("{}/{}", r.key.kind.group(), r.key.kind.version())),
            kind: Some(r.key.kind.name().to_string()),
            name: Some(r.key.name.clone()),
            namespace: Some(r.key.namespace.clone()),
            uid: r.uid.clone(),
            resource_version: r.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(REASON.to_string()),
        message: Some(message),
        type_: Some("Warning".to_string()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_string()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.to_string()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

/// Refused versions already reported, oldest first out.
#[derive(Debug, Default)]
pub struct Reported {
    seen: HashSet<(String, String)>,
    order: VecDeque<(String, String)>,
}

impl Reported {
    /// True the first time this version of this object is seen.
    pub fn first_time(&mut self, r: &Refused) -> bool {
        let id = (
            r.key.to_string(),
            r.resource_version
                .clone()
                .unwrap_or_else(|| r.message.clone()),
        );
        if !self.seen.insert(id.clone()) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}

/// Writes the Events, one at a time, off the watch loop.
pub(crate) struct Reporter {
    tx: mpsc::Sender<Refused>,
    reported: Reported,
    shared: Arc<Shared>,
}

impl Reporter {
    pub(crate) fn spawn(client: kube::Client, shared: Arc<Shared>) -> Reporter {
        let (tx, mut rx) = mpsc::channel::<Refused>(QUEUE);
        let writer_shared = shared.clone();
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                let api: kube::Api<Event> = kube::Api::namespaced(client.clone(), &r.key.namespace);
                let event = event_for(&r, Time(k8s_openapi::jiff::Timestamp::now()));
                if let Err(e) = api.create(&kube::api::PostParams::default(), &event).await {
                    writer_shared.metrics.events_failed.inc();
                    tracing::warn!("cannot write the Event for {}: {e}", r.key);
                }
            }
        });
        Reporter {
            tx,
            reported: Reported::default(),
            shared,
        }
    }

    pub(crate) fn report(&mut self, r: Refused) {
        if !self.reported.first_time(&r) {
            return;
        }
        if self.tx.try_send(r).is_err() {
            self.shared.metrics.events_failed.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::objects::{Kind, ObjectKey};

    fn refused(rv: &str, message: &str) -> Refused {
        Refused {
            key: ObjectKey {
                kind: Kind::AuthorizationPolicy,
                namespace: "shop".into(),
                name: "read-only".into(),
            },
            message: message.into(),
            kept: true,
            uid: Some("5f1c".into()),
            resource_version: Some(rv.into()),
        }
    }

    #[test]
    fn the_event_names_the_object_and_says_why() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let e = event_for(&refused("42", "spec.action: must be ALLOW"), now);
        let o = &e.involved_object;
        assert_eq!(o.api_version.as_deref(), Some("security.istio.io/v1"));
        assert_eq!(o.kind.as_deref(), Some("AuthorizationPolicy"));
        assert_eq!(
            (o.namespace.as_deref(), o.name.as_deref()),
            (Some("shop"), Some("read-only"))
        );
        assert_eq!(o.uid.as_deref(), Some("5f1c"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        let m = e.message.unwrap();
        assert!(
            m.contains("last accepted version is still served")
                && m.ends_with("spec.action: must be ALLOW"),
            "{m}"
        );
        let long = event_for(
            &refused("43", &"é".repeat(2000)),
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        let m = long.message.unwrap();
        assert!(m.len() <= MAX_MESSAGE && m.ends_with("..."), "{}", m.len());
    }

    #[test]
    fn a_version_is_reported_once() {
        let mut reported = Reported::default();
        assert!(reported.first_time(&refused("42", "a")));
        assert!(
            !reported.first_time(&refused("42", "a")),
            "a re-list of the same version"
        );
        assert!(reported.first_time(&refused("43", "a")));
        for i in 0..REMEMBERED {
            reported.first_time(&refused(&format!("v{i}"), "a"));
        }
        assert_eq!(reported.seen.len(), REMEMBERED);
        assert!(
            reported.first_time(&refused("42", "a")),
            "forgotten, oldest first"
        );
    }
}
