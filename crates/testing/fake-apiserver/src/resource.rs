//! The resources the server serves, and what discovery says about them.

use serde_json::{json, Value};

/// A resource type the server stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Pods,
    Namespaces,
    Nodes,
    DaemonSets,
    ClusterRoles,
    ClusterRoleBindings,
    Roles,
    RoleBindings,
}

/// The API groups served, with their resources, in discovery order.
pub(crate) const GROUPS: [(&str, &[Resource]); 3] = [
    ("", &[Resource::Pods, Resource::Namespaces, Resource::Nodes]),
    ("apps", &[Resource::DaemonSets]),
    (
        "rbac.authorization.k8s.io",
        &[
            Resource::ClusterRoles,
            Resource::ClusterRoleBindings,
            Resource::Roles,
            Resource::RoleBindings,
        ],
    ),
];

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "get",
    "list",
    "patch",
    "update",
    "watch",
    "deletecollection",
];

impl Resource {
    pub const ALL: [Resource; 8] = [
        Resource::Pods,
        Resource::Namespaces,
        Resource::Nodes,
        Resource::DaemonSets,
        Resource::ClusterRoles,
        Resource::ClusterRoleBindings,
        Resource::Roles,
        Resource::RoleBindings,
    ];

    /// The API group ("" for core).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Pods | Resource::Namespaces | Resource::Nodes => "",
            Resource::DaemonSets => "apps",
            _ => "rbac.authorization.k8s.io",
        }
    }

    /// `apiVersion` of its objects.
    pub fn api_version(self) -> &'static str {
        match self.group() {
            "" => "v1",
            "apps" => "apps/v1",
            _ => "rbac.authorization.k8s.io/v1",
        }
    }

    /// The plural, as in URLs and RBAC rules.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Pods => "pods",
            Resource::Namespaces => "namespaces",
            Resource::Nodes => "nodes",
            Resource::DaemonSets => "daemonsets",
            Resource::ClusterRoles => "clusterroles",
            Resource::ClusterRoleBindings => "clusterrolebindings",
            Resource::Roles => "roles",
            Resource::RoleBindings => "rolebindings",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Resource::Pods => "Pod",
            Resource::Namespaces => "Namespace",
            Resource::Nodes => "Node",
            Resource::DaemonSets => "DaemonSet",
            Resource::ClusterRoles => "ClusterRole",
            Resource::ClusterRoleBindings => "ClusterRoleBinding",
            Resource::Roles => "Role",
            Resource::RoleBindings => "RoleBinding",
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Resource::Pods | Resource::DaemonSets | Resource::Roles | Resource::RoleBindings
        )
    }

    fn short_names(self) -> &'static [&'static str] {
        match self {
            Resource::Pods => &["po"],
            Resource::Namespaces => &["ns"],
            Resource::Nodes => &["no"],
            Resource::DaemonSets => &["ds"],
            _ => &[],
        }
    }

    /// Whether it has a `status` subresource, whose changes the main resource ignores.
    pub fn has_status(self) -> bool {
        matches!(
            self,
            Resource::Pods | Resource::Namespaces | Resource::Nodes | Resource::DaemonSets
        )
    }

    /// Whether `metadata.generation` is kept (set on create, bumped on spec changes).
    pub(crate) fn has_generation(self) -> bool {
        matches!(self, Resource::Pods | Resource::DaemonSets)
    }

    /// Whether a PUT of a missing object creates it (RBAC objects, as Kubernetes).
    pub(crate) fn create_on_update(self) -> bool {
        self.group() == "rbac.authorization.k8s.io"
    }

    /// The resource as Kubernetes names it in messages: `pods`, `daemonsets.apps`.
    pub fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_string(),
            g => format!("{}.{g}", self.plural()),
        }
    }

    /// The resource an object of `apiVersion`/`kind` belongs to.
    pub fn from_kind(api_version: &str, kind: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.api_version() == api_version && r.kind() == kind)
    }

    /// The resource `plural` in `group`.
    pub(crate) fn from_plural(group: &str, plural: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.group() == group && r.plural() == plural)
    }

    fn singular(self) -> String {
        self.kind().to_ascii_lowercase()
    }
}

/// `/api/v1` or `/apis/<group>/v1`: an APIResourceList.
pub(crate) fn resource_list(group: &str) -> Option<Value> {
    let (_, resources) = GROUPS.iter().find(|(g, _)| *g == group)?;
    let group_version = if group.is_empty() {
        "v1".to_string()
    } else {
        format!("{group}/v1")
    };
    let mut list = Vec::new();
    for r in resources.iter() {
        let mut entry = json!({
            "name": r.plural(),
            "singularName": r.singular(),
            "namespaced": r.namespaced(),
            "kind": r.kind(),
            "verbs": VERBS,
        });
        if !r.short_names().is_empty() {
            entry["shortNames"] = json!(r.short_names());
        }
        if matches!(r, Resource::Pods | Resource::DaemonSets) {
            entry["categories"] = json!(["all"]);
        }
        list.push(entry);
        if r.has_status() {
            list.push(json!({
                "name": format!("{}/status", r.plural()),
                "singularName": "",
                "namespaced": r.namespaced(),
                "kind": r.kind(),
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": list,
    }))
}

fn group_entry(name: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
    json!({"name": name, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `/apis/<group>`: an APIGroup.
pub(crate) fn api_group(name: &str) -> Option<Value> {
    if name.is_empty() || !GROUPS.iter().any(|(g, _)| *g == name) {
        return None;
    }
    let mut g = group_entry(name);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/apis`: an APIGroupList.
pub(crate) fn api_group_list() -> Value {
    let groups: Vec<Value> = GROUPS
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, _)| group_entry(g))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/api`: the core APIVersions.
pub(crate) fn api_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

/// `/version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-ambit-fake-apiserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_pods_with_short_names_and_the_status_subresource() {
        let list = resource_list("").unwrap();
        let res = list["resources"].as_array().unwrap();
        let pods = res.iter().find(|r| r["name"] == "pods").unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["namespaced"], json!(true));
        assert!(res.iter().any(|r| r["name"] == "pods/status"));
        let ds = resource_list("apps").unwrap();
        assert_eq!(ds["groupVersion"], "apps/v1");
        assert_eq!(ds["resources"][0]["shortNames"], json!(["ds"]));
        assert!(resource_list("batch").is_none());
        assert_eq!(Resource::DaemonSets.qualified(), "daemonsets.apps");
        assert_eq!(
            Resource::from_kind("rbac.authorization.k8s.io/v1", "Role"),
            Some(Resource::Roles)
        );
    }
}
