//! Authenticated users and RBAC evaluation over the stored Roles, ClusterRoles and their
//! bindings, as Kubernetes' RBAC authorizer decides. Sans IO.

use serde_json::Value;

use crate::resource::Resource;
use crate::store::Store;

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// "" when the user has none (TokenReviews leave it out).
    pub uid: String,
    pub groups: Vec<String>,
}

/// A stable UUID-shaped id for `what` (RFC 9562 version 8: derived, not random), standing
/// in for a ServiceAccount object's uid.
fn derived_uid(what: &str) -> String {
    let fnv = |seed: u64| {
        what.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_be_bytes());
    b[8..].copy_from_slice(&fnv(0x6c62_272e_07bb_0142).to_be_bytes());
    b[6] = (b[6] & 0x0f) | 0x80;
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

impl User {
    /// A service account's user: `system:serviceaccount:<ns>:<name>`, its groups, and a uid
    /// that is the same for the same account every time.
    pub fn service_account(ns: &str, name: &str) -> User {
        User {
            name: format!("system:serviceaccount:{ns}:{name}"),
            uid: derived_uid(&format!("serviceaccount/{ns}/{name}")),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
        }
    }

    /// A cluster admin (group `system:masters`, always allowed).
    pub fn admin() -> User {
        User {
            name: "admin".into(),
            uid: String::new(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    /// A plain user with the authenticated group.
    pub fn named(name: &str, groups: &[&str]) -> User {
        let mut g: Vec<String> = groups.iter().map(|s| s.to_string()).collect();
        if !g.iter().any(|x| x == "system:authenticated") {
            g.push("system:authenticated".into());
        }
        User {
            name: name.into(),
            uid: String::new(),
            groups: g,
        }
    }

    /// The user of requests without credentials on the public paths.
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
}

/// What a resource request asks to do (Kubernetes' authorizer attributes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub resource: Resource,
    pub subresource: &'a str,
    /// "" for cluster-scoped requests and all-namespace lists.
    pub namespace: &'a str,
    /// "" for collections.
    pub name: &'a str,
}

/// Kubernetes' sentence for a denied request: `User "u" cannot <verb> resource ...`.
pub fn forbidden_message(user: &User, a: &Attributes) -> String {
    let mut resource = a.resource.plural().to_string();
    if !a.subresource.is_empty() {
        resource = format!("{resource}/{}", a.subresource);
    }
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    format!(
        "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name,
        a.verb,
        a.resource.group()
    )
}

fn strs(v: &Value, field: &str) -> Vec<String> {
    v.get(field)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let has = |field: &str, want: &str| strs(rule, field).iter().any(|x| x == "*" || x == want);
    if !has("verbs", a.verb) || !has("apiGroups", a.resource.group()) {
        return false;
    }
    let combined = if a.subresource.is_empty() {
        a.resource.plural().to_string()
    } else {
        format!("{}/{}", a.resource.plural(), a.subresource)
    };
    let resource_ok = strs(rule, "resources").iter().any(|r| {
        r == "*"
            || *r == combined
            || (!a.subresource.is_empty() && *r == format!("*/{}", a.subresource))
    });
    if !resource_ok {
        return false;
    }
    let names = strs(rule, "resourceNames");
    names.is_empty() || (!a.name.is_empty() && names.iter().any(|n| n == a.name))
}

/// Whether a binding (in `binding_ns`, "" for a ClusterRoleBinding) names the user.
fn binds(binding: &Value, binding_ns: &str, user: &User) -> bool {
    let subjects = binding
        .get("subjects")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    subjects.iter().any(|s| {
        let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
        match s.get("kind").and_then(Value::as_str) {
            Some("User") => name == user.name,
            Some("Group") => user.groups.iter().any(|g| g == name),
            Some("ServiceAccount") => {
                let ns = match s.get("namespace").and_then(Value::as_str) {
                    Some(ns) if !ns.is_empty() => ns,
                    _ => binding_ns,
                };
                !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
            }
            _ => false,
        }
    })
}

/// The rules of the role a binding refers to (missing roles grant nothing).
fn role_rules(store: &Store, binding: &Value, binding_ns: &str) -> Vec<Value> {
    let role_ref = binding.get("roleRef");
    let kind = role_ref.and_then(|r| r.get("kind")).and_then(Value::as_str);
    let name = role_ref
        .and_then(|r| r.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let key = match kind {
        Some("ClusterRole") => (Resource::ClusterRoles, String::new(), name.to_string()),
        Some("Role") if !binding_ns.is_empty() => {
            (Resource::Roles, binding_ns.to_string(), name.to_string())
        }
        _ => return Vec::new(),
    };
    store
        .get(&key)
        .and_then(|r| r.get("rules"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Whether RBAC allows `user` to do `a`: `system:masters` always; otherwise some rule of a
/// role bound to the user by a ClusterRoleBinding, or by a RoleBinding in the request's
/// namespace, must match. ClusterRole aggregation is not implemented.
pub fn allows(store: &Store, user: &User, a: &Attributes) -> bool {
    if user.groups.iter().any(|g| g == "system:masters") {
        return true;
    }
    let cluster = store
        .list(Resource::ClusterRoleBindings, None)
        .filter(|(_, b)| binds(b, "", user))
        .any(|(_, b)| role_rules(store, b, "").iter().any(|r| rule_allows(r, a)));
    if cluster {
        return true;
    }
    if a.namespace.is_empty() {
        return false;
    }
    store
        .list(Resource::RoleBindings, Some(a.namespace))
        .filter(|(_, b)| binds(b, a.namespace, user))
        .any(|(_, b)| {
            role_rules(store, b, a.namespace)
                .iter()
                .any(|r| rule_allows(r, a))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::key_of;
    use serde_json::json;

    fn put(s: &mut Store, r: Resource, ns: Option<&str>, obj: Value) {
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        s.insert(key_of(r, ns, &name), obj);
    }

    fn store() -> Store {
        let mut s = Store::new(100);
        put(
            &mut s,
            Resource::ClusterRoles,
            None,
            json!({
            "metadata": {"name": "cni"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
                {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"], "resourceNames": ["ztunnel"]},
            ]}),
        );
        put(
            &mut s,
            Resource::ClusterRoleBindings,
            None,
            json!({
            "metadata": {"name": "cni"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cni"},
            "subjects": [{"kind": "ServiceAccount", "name": "istio-cni", "namespace": "istio-system"}]}),
        );
        put(
            &mut s,
            Resource::Roles,
            Some("team"),
            json!({
            "metadata": {"name": "editor", "namespace": "team"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        );
        put(
            &mut s,
            Resource::RoleBindings,
            Some("team"),
            json!({
            "metadata": {"name": "editors", "namespace": "team"},
            "roleRef": {"kind": "Role", "name": "editor"},
            "subjects": [{"kind": "Group", "name": "devs"}, {"kind": "ServiceAccount", "name": "bot"}]}),
        );
        put(
            &mut s,
            Resource::RoleBindings,
            Some("team"),
            json!({
            "metadata": {"name": "viewers", "namespace": "team"},
            "roleRef": {"kind": "ClusterRole", "name": "cni"},
            "subjects": [{"kind": "User", "name": "alice"}]}),
        );
        put(
            &mut s,
            Resource::RoleBindings,
            Some("team"),
            json!({
            "metadata": {"name": "dangling", "namespace": "team"},
            "roleRef": {"kind": "Role", "name": "missing"},
            "subjects": [{"kind": "User", "name": "carol"}]}),
        );
        s
    }

    fn at<'a>(
        verb: &'a str,
        r: Resource,
        sub: &'a str,
        ns: &'a str,
        name: &'a str,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            resource: r,
            subresource: sub,
            namespace: ns,
            name,
        }
    }

    #[test]
    fn allow_and_deny() {
        let s = store();
        let cni = User::service_account("istio-system", "istio-cni");
        let other_sa = User::service_account("default", "istio-cni");
        let dev = User::named("bob", &["devs"]);
        let bot = User::service_account("team", "bot");
        let alice = User::named("alice", &[]);
        let carol = User::named("carol", &[]);
        let admin = User::admin();
        use Resource::*;
        let cases: Vec<(&User, Attributes, bool)> = vec![
            (&cni, at("list", Pods, "", "", ""), true),
            (&cni, at("watch", Pods, "", "default", ""), true),
            (&cni, at("get", Nodes, "", "", "n1"), true),
            (&cni, at("patch", Pods, "status", "default", "p"), true),
            (&cni, at("patch", Pods, "", "default", "p"), false),
            (&cni, at("delete", Pods, "", "default", "p"), false),
            (
                &cni,
                at("get", DaemonSets, "", "istio-system", "ztunnel"),
                true,
            ),
            (
                &cni,
                at("get", DaemonSets, "", "istio-system", "other"),
                false,
            ),
            // resourceNames never match collections.
            (&cni, at("list", DaemonSets, "", "istio-system", ""), false),
            (&other_sa, at("list", Pods, "", "", ""), false),
            (&dev, at("delete", Pods, "", "team", "p"), true),
            (&dev, at("update", DaemonSets, "status", "team", "d"), true),
            (&dev, at("delete", Pods, "", "default", "p"), false),
            (&dev, at("list", Pods, "", "", ""), false),
            // A ServiceAccount subject without a namespace is the binding's namespace.
            (&bot, at("create", Pods, "", "team", ""), true),
            (&alice, at("get", Pods, "", "team", "p"), true),
            (&alice, at("get", Pods, "", "default", "p"), false),
            (&carol, at("get", Pods, "", "team", "p"), false),
            (&admin, at("delete", Nodes, "", "", "n"), true),
        ];
        for (user, a, want) in cases {
            assert_eq!(allows(&s, user, &a), want, "{} {a:?}", user.name);
        }
    }

    #[test]
    fn service_accounts_have_stable_distinct_uids() {
        let a = User::service_account("istio-system", "ztunnel");
        assert_eq!(a.uid, User::service_account("istio-system", "ztunnel").uid);
        assert_ne!(a.uid, User::service_account("default", "ztunnel").uid);
        assert_eq!(a.uid.len(), 36);
        assert_eq!(&a.uid[14..15], "8", "version 8: {}", a.uid);
        assert!(User::admin().uid.is_empty());
    }

    #[test]
    fn forbidden_messages() {
        let cni = User::service_account("istio-system", "istio-cni");
        assert_eq!(
            forbidden_message(&cni, &at("patch", Resource::Pods, "status", "default", "x")),
            "User \"system:serviceaccount:istio-system:istio-cni\" cannot patch resource \
             \"pods/status\" in API group \"\" in the namespace \"default\""
        );
        assert_eq!(
            forbidden_message(&cni, &at("list", Resource::Nodes, "", "", "")),
            "User \"system:serviceaccount:istio-system:istio-cni\" cannot list resource \
             \"nodes\" in API group \"\" at the cluster scope"
        );
        let e = crate::error::ApiError::forbidden(
            Some(Resource::Pods),
            "",
            &forbidden_message(&cni, &at("list", Resource::Pods, "", "default", "")),
        );
        assert!(
            e.message.starts_with("pods is forbidden: User "),
            "{}",
            e.message
        );
    }
}
