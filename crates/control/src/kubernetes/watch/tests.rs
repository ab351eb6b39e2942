use super::*;
use serde_json::json;

fn policy(name: &str, method: &str) -> Value {
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "shop", "resourceVersion": "7"},
        "spec": {
            "targetRefs": [{"kind": "Service", "group": "", "name": "cart"}],
            "action": "ALLOW",
            "rules": [{"to": [{"operation": {"methods": [method]}}]}],
        },
    })
}

const AP: Source = Source::L7(Kind::AuthorizationPolicy);

fn list(state: &mut State, source: Source, objects: Vec<Value>) -> Vec<Refused> {
    let o = ParseOptions::default();
    let mut refused = state.on_event(source, Event::Init, &o);
    for object in objects {
        refused.extend(state.on_event(source, Event::InitApply(object), &o));
    }
    refused.extend(state.on_event(source, Event::InitDone, &o));
    refused
}

#[test]
fn a_relist_of_the_same_objects_changes_nothing() {
    let mut state = State::default();
    assert!(list(
        &mut state,
        AP,
        vec![policy("a", "GET"), policy("b", "POST")]
    )
    .is_empty());
    let before = crate::kubernetes::objects::tests::documents(&state.objects);
    assert_eq!(before.len(), 2);
    // A dropped watch or a 410: the same objects listed again (new resourceVersions).
    let mut again = vec![policy("a", "GET"), policy("b", "POST")];
    again[0]["metadata"]["resourceVersion"] = json!("99");
    assert!(list(&mut state, AP, again).is_empty());
    assert_eq!(
        crate::kubernetes::objects::tests::documents(&state.objects),
        before
    );
    // What a re-list no longer holds is gone; nothing else moves.
    list(&mut state, AP, vec![policy("a", "GET")]);
    assert_eq!(
        crate::kubernetes::objects::tests::documents(&state.objects),
        before[..1].to_vec()
    );
}

#[test]
fn a_refused_object_keeps_its_last_version_across_events_and_relists() {
    let mut state = State::default();
    let o = ParseOptions::default();
    list(&mut state, AP, vec![policy("a", "GET")]);
    let good = crate::kubernetes::objects::tests::documents(&state.objects);
    let refused = state.on_event(AP, Event::Apply(policy("a", "get")), &o);
    assert_eq!(refused.len(), 1);
    assert!(refused[0].kept, "{refused:?}");
    assert_eq!(refused[0].key.to_string(), "AuthorizationPolicy shop/a");
    assert_eq!(
        crate::kubernetes::objects::tests::documents(&state.objects),
        good
    );
    // Listed again still refused: the last accepted version still stands (no stand-in).
    let refused = list(&mut state, AP, vec![policy("a", "get")]);
    assert_eq!(refused.len(), 1);
    assert_eq!(
        crate::kubernetes::objects::tests::documents(&state.objects),
        good
    );
    // Deleted: gone.
    state.on_event(AP, Event::Delete(policy("a", "get")), &o);
    assert!(crate::kubernetes::objects::tests::documents(&state.objects).is_empty());
}

#[test]
fn synced_once_every_source_has_listed_and_gateways_follow() {
    let mut state = State::default();
    let o = ParseOptions::default();
    for source in Source::ALL {
        assert!(!state.synced());
        list(&mut state, source, Vec::new());
    }
    assert!(state.synced());
    let gateway = json!({"metadata": {"namespace": "shop", "name": "waypoint"},
                         "spec": {"gatewayClassName": "istio-waypoint"}});
    state.on_event(Source::Gateways, Event::Apply(gateway.clone()), &o);
    assert!(state.visibility.waypoints.runs_waypoint("shop", "waypoint"));
    // A re-list without it: no longer a waypoint.
    list(&mut state, Source::Gateways, Vec::new());
    assert!(!state.visibility.waypoints.runs_waypoint("shop", "waypoint"));
    list(&mut state, Source::Gateways, vec![gateway.clone()]);
    state.on_event(Source::Gateways, Event::Delete(gateway), &o);
    assert!(!state.visibility.waypoints.runs_waypoint("shop", "waypoint"));
}
