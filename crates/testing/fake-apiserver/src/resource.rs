//! The resources the server serves, their versions, and what discovery says about them.
//!
//! Custom resources (Istio's and Gateway API's kinds) behave as kube-apiserver serves a
//! CustomResourceDefinition with a `status` subresource and conversion `None`: every
//! served version shows the same objects, which differ only in `apiVersion`; the first
//! version listed is the storage and preferred one.

use std::borrow::Cow;

use serde_json::{json, Value};

/// A resource type the server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Pods,
    Namespaces,
    Nodes,
    Services,
    ConfigMaps,
    Events,
    DaemonSets,
    ClusterRoles,
    ClusterRoleBindings,
    Roles,
    RoleBindings,
    /// `authentication.k8s.io/v1` TokenReviews: create only, never stored.
    TokenReviews,
    AuthorizationPolicies,
    RequestAuthentications,
    DestinationRules,
    GatewayClasses,
    Gateways,
    HttpRoutes,
    GrpcRoutes,
}

/// An API group: its versions (the first is the storage and preferred one) and resources,
/// each served in every version of its group.
pub(crate) struct Group {
    pub name: &'static str,
    pub versions: &'static [&'static str],
    pub resources: &'static [Resource],
}

/// The API groups served, in discovery order.
pub(crate) const GROUPS: [Group; 7] = [
    Group {
        name: "",
        versions: &["v1"],
        resources: &[
            Resource::Pods,
            Resource::Namespaces,
            Resource::Nodes,
            Resource::Services,
            Resource::ConfigMaps,
            Resource::Events,
        ],
    },
    Group {
        name: "apps",
        versions: &["v1"],
        resources: &[Resource::DaemonSets],
    },
    Group {
        name: "authentication.k8s.io",
        versions: &["v1"],
        resources: &[Resource::TokenReviews],
    },
    Group {
        name: "rbac.authorization.k8s.io",
        versions: &["v1"],
        resources: &[
            Resource::ClusterRoles,
            Resource::ClusterRoleBindings,
            Resource::Roles,
            Resource::RoleBindings,
        ],
    },
    Group {
        name: "security.istio.io",
        versions: &["v1", "v1beta1"],
        resources: &[
            Resource::AuthorizationPolicies,
            Resource::RequestAuthentications,
        ],
    },
    Group {
        name: "networking.istio.io",
        versions: &["v1", "v1beta1", "v1alpha3"],
        resources: &[Resource::DestinationRules],
    },
    Group {
        name: "gateway.networking.k8s.io",
        versions: &["v1"],
        resources: &[
            Resource::GatewayClasses,
            Resource::Gateways,
            Resource::GrpcRoutes,
            Resource::HttpRoutes,
        ],
    },
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

/// The group of `name`.
pub(crate) fn group(name: &str) -> Option<&'static Group> {
    GROUPS.iter().find(|g| g.name == name)
}

/// `version` of group `name` as a static string, if the group serves it.
pub(crate) fn served_version(name: &str, version: &str) -> Option<&'static str> {
    group(name)?
        .versions
        .iter()
        .copied()
        .find(|v| *v == version)
}

/// Splits an `apiVersion` into group ("" for core) and version.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

impl Resource {
    pub const ALL: [Resource; 19] = [
        Resource::Pods,
        Resource::Namespaces,
        Resource::Nodes,
        Resource::Services,
        Resource::ConfigMaps,
        Resource::Events,
        Resource::DaemonSets,
        Resource::ClusterRoles,
        Resource::ClusterRoleBindings,
        Resource::Roles,
        Resource::RoleBindings,
        Resource::TokenReviews,
        Resource::AuthorizationPolicies,
        Resource::RequestAuthentications,
        Resource::DestinationRules,
        Resource::GatewayClasses,
        Resource::Gateways,
        Resource::HttpRoutes,
        Resource::GrpcRoutes,
    ];

    /// The API group ("" for core).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Pods
            | Resource::Namespaces
            | Resource::Nodes
            | Resource::Services
            | Resource::ConfigMaps
            | Resource::Events => "",
            Resource::DaemonSets => "apps",
            Resource::TokenReviews => "authentication.k8s.io",
            Resource::ClusterRoles
            | Resource::ClusterRoleBindings
            | Resource::Roles
            | Resource::RoleBindings => "rbac.authorization.k8s.io",
            Resource::AuthorizationPolicies | Resource::RequestAuthentications => {
                "security.istio.io"
            }
            Resource::DestinationRules => "networking.istio.io",
            Resource::GatewayClasses
            | Resource::Gateways
            | Resource::HttpRoutes
            | Resource::GrpcRoutes => "gateway.networking.k8s.io",
        }
    }

    /// The versions it is served in; the first is the storage (and preferred) version.
    pub fn versions(self) -> &'static [&'static str] {
        group(self.group()).map_or(&["v1"], |g| g.versions)
    }

    /// The version objects are stored in.
    pub fn storage_version(self) -> &'static str {
        self.versions()[0]
    }

    /// `apiVersion` of its objects as stored (and in the preferred version).
    pub fn api_version(self) -> String {
        self.api_version_in(self.storage_version())
    }

    /// `apiVersion` of its objects served through `version`.
    pub fn api_version_in(self, version: &str) -> String {
        match self.group() {
            "" => version.to_string(),
            g => format!("{g}/{version}"),
        }
    }

    /// Whether a CustomResourceDefinition defines it in a real cluster (Istio's kinds,
    /// Gateway API's), which changes a few rules: generation, status writes, list items,
    /// type checks of request bodies.
    pub fn is_custom(self) -> bool {
        matches!(
            self.group(),
            "security.istio.io" | "gateway.networking.k8s.io"
        )
    }

    /// Whether objects are kept (TokenReviews are answered, never stored).
    pub fn stored(self) -> bool {
        self != Resource::TokenReviews
    }

    /// The plural, as in URLs and RBAC rules.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Pods => "pods",
            Resource::Namespaces => "namespaces",
            Resource::Nodes => "nodes",
            Resource::Services => "services",
            Resource::ConfigMaps => "configmaps",
            Resource::Events => "events",
            Resource::DaemonSets => "daemonsets",
            Resource::ClusterRoles => "clusterroles",
            Resource::ClusterRoleBindings => "clusterrolebindings",
            Resource::Roles => "roles",
            Resource::RoleBindings => "rolebindings",
            Resource::TokenReviews => "tokenreviews",
            Resource::AuthorizationPolicies => "authorizationpolicies",
            Resource::RequestAuthentications => "requestauthentications",
            Resource::DestinationRules => "destinationrules",
            Resource::GatewayClasses => "gatewayclasses",
            Resource::Gateways => "gateways",
            Resource::HttpRoutes => "httproutes",
            Resource::GrpcRoutes => "grpcroutes",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Resource::Pods => "Pod",
            Resource::Namespaces => "Namespace",
            Resource::Nodes => "Node",
            Resource::Services => "Service",
            Resource::ConfigMaps => "ConfigMap",
            Resource::Events => "Event",
            Resource::DaemonSets => "DaemonSet",
            Resource::ClusterRoles => "ClusterRole",
            Resource::ClusterRoleBindings => "ClusterRoleBinding",
            Resource::Roles => "Role",
            Resource::RoleBindings => "RoleBinding",
            Resource::TokenReviews => "TokenReview",
            Resource::AuthorizationPolicies => "AuthorizationPolicy",
            Resource::RequestAuthentications => "RequestAuthentication",
            Resource::DestinationRules => "DestinationRule",
            Resource::GatewayClasses => "GatewayClass",
            Resource::Gateways => "Gateway",
            Resource::HttpRoutes => "HTTPRoute",
            Resource::GrpcRoutes => "GRPCRoute",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Resource::Namespaces
                | Resource::Nodes
                | Resource::ClusterRoles
                | Resource::ClusterRoleBindings
                | Resource::TokenReviews
                | Resource::GatewayClasses
        )
    }

    fn short_names(self) -> &'static [&'static str] {
        match self {
            Resource::Pods => &["po"],
            Resource::Namespaces => &["ns"],
            Resource::Nodes => &["no"],
            Resource::Services => &["svc"],
            Resource::ConfigMaps => &["cm"],
            Resource::Events => &["ev"],
            Resource::DaemonSets => &["ds"],
            Resource::AuthorizationPolicies => &["ap"],
            Resource::RequestAuthentications => &["ra"],
            Resource::DestinationRules => &["dr"],
            Resource::GatewayClasses => &["gc"],
            Resource::Gateways => &["gtw"],
            _ => &[],
        }
    }

    /// Discovery categories (`kubectl get all`, `kubectl get istio-io`).
    fn categories(self) -> &'static [&'static str] {
        match self.group() {
            _ if matches!(
                self,
                Resource::Pods | Resource::DaemonSets | Resource::Services
            ) =>
            {
                &["all"]
            }
            "security.istio.io" => &["istio-io", "security-istio-io"],
            "networking.istio.io" => &["istio-io", "networking-istio-io"],
            "gateway.networking.k8s.io" => &["gateway-api"],
            _ => &[],
        }
    }

    /// The verbs discovery lists.
    fn verbs(self) -> &'static [&'static str] {
        if self.stored() {
            &VERBS
        } else {
            &["create"]
        }
    }

    /// Whether it has a `status` subresource, whose changes the main resource ignores.
    pub fn has_status(self) -> bool {
        matches!(
            self,
            Resource::Pods
                | Resource::Namespaces
                | Resource::Nodes
                | Resource::Services
                | Resource::DaemonSets
        ) || self.is_custom()
    }

    /// Whether `metadata.generation` is kept (set on create, bumped on spec changes).
    pub(crate) fn has_generation(self) -> bool {
        matches!(self, Resource::Pods | Resource::DaemonSets) || self.is_custom()
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

    /// The kind as Kubernetes names it in messages: `Pod`, `DaemonSet.apps`.
    pub fn qualified_kind(self) -> String {
        qualified_kind(self.group(), self.kind())
    }

    /// The resource an object of `apiVersion`/`kind` belongs to, in any served version.
    pub fn from_kind(api_version: &str, kind: &str) -> Option<Resource> {
        let (group, version) = split_api_version(api_version);
        Resource::ALL
            .into_iter()
            .find(|r| r.group() == group && r.kind() == kind && r.versions().contains(&version))
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

/// `Kind` or `Kind.group`, as Kubernetes' GroupKind prints.
pub(crate) fn qualified_kind(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    }
}

/// A stored object as served through `version` of `r`: with conversion `None` only
/// `apiVersion` differs between versions.
pub fn served_as<'a>(r: Resource, version: &str, obj: &'a Value) -> Cow<'a, Value> {
    let want = r.api_version_in(version);
    if obj.get("apiVersion").and_then(Value::as_str) == Some(want.as_str())
        || obj.get("apiVersion").is_none()
    {
        return Cow::Borrowed(obj);
    }
    let mut o = obj.clone();
    o["apiVersion"] = json!(want);
    Cow::Owned(o)
}

/// `/api/v1` or `/apis/<group>/<version>`: an APIResourceList.
pub(crate) fn resource_list(group_name: &str, version: &str) -> Option<Value> {
    let g = group(group_name)?;
    served_version(group_name, version)?;
    let group_version = if group_name.is_empty() {
        version.to_string()
    } else {
        format!("{group_name}/{version}")
    };
    let mut list = Vec::new();
    for r in g.resources.iter() {
        let mut entry = json!({
            "name": r.plural(),
            "singularName": r.singular(),
            "namespaced": r.namespaced(),
            "kind": r.kind(),
            "verbs": r.verbs(),
        });
        if !r.short_names().is_empty() {
            entry["shortNames"] = json!(r.short_names());
        }
        if !r.categories().is_empty() {
            entry["categories"] = json!(r.categories());
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

fn group_entry(g: &Group) -> Value {
    let versions: Vec<Value> = g
        .versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{}/{v}", g.name), "version": v}))
        .collect();
    let preferred = versions[0].clone();
    json!({"name": g.name, "versions": versions, "preferredVersion": preferred})
}

/// `/apis/<group>`: an APIGroup.
pub(crate) fn api_group(name: &str) -> Option<Value> {
    let g = group(name).filter(|g| !g.name.is_empty())?;
    let mut v = group_entry(g);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

/// `/apis`: an APIGroupList.
pub(crate) fn api_group_list() -> Value {
    let groups: Vec<Value> = GROUPS
        .iter()
        .filter(|g| !g.name.is_empty())
        .map(group_entry)
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

    fn entry<'a>(list: &'a Value, name: &str) -> &'a Value {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {list}"))
    }

    #[test]
    fn discovery_lists_pods_with_short_names_and_the_status_subresource() {
        let list = resource_list("", "v1").unwrap();
        let pods = entry(&list, "pods");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["namespaced"], json!(true));
        entry(&list, "pods/status");
        assert_eq!(entry(&list, "configmaps")["shortNames"], json!(["cm"]));
        assert_eq!(entry(&list, "events")["kind"], "Event");
        assert_eq!(entry(&list, "events")["shortNames"], json!(["ev"]));
        let ds = resource_list("apps", "v1").unwrap();
        assert_eq!(ds["groupVersion"], "apps/v1");
        assert_eq!(ds["resources"][0]["shortNames"], json!(["ds"]));
        assert!(resource_list("batch", "v1").is_none());
        assert!(resource_list("apps", "v1beta1").is_none());
        assert_eq!(Resource::DaemonSets.qualified(), "daemonsets.apps");
        assert_eq!(
            Resource::from_kind("rbac.authorization.k8s.io/v1", "Role"),
            Some(Resource::Roles)
        );
    }

    #[test]
    fn custom_resources_in_two_versions_and_tokenreviews() {
        for v in ["v1", "v1beta1"] {
            let list = resource_list("security.istio.io", v).unwrap();
            assert_eq!(list["groupVersion"], format!("security.istio.io/{v}"));
            let ap = entry(&list, "authorizationpolicies");
            assert_eq!(ap["kind"], "AuthorizationPolicy");
            assert_eq!(ap["singularName"], "authorizationpolicy");
            assert_eq!(ap["categories"], json!(["istio-io", "security-istio-io"]));
            assert_eq!(
                entry(&list, "requestauthentications/status")["verbs"],
                json!(["get", "patch", "update"])
            );
        }
        let g = api_group("security.istio.io").unwrap();
        assert_eq!(
            g["versions"],
            json!([{"groupVersion": "security.istio.io/v1", "version": "v1"},
                   {"groupVersion": "security.istio.io/v1beta1", "version": "v1beta1"}])
        );
        assert_eq!(g["preferredVersion"]["version"], "v1");
        let all = api_group_list();
        assert!(all["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "gateway.networking.k8s.io"));
        let gw = resource_list("gateway.networking.k8s.io", "v1").unwrap();
        assert_eq!(entry(&gw, "gateways")["shortNames"], json!(["gtw"]));
        assert_eq!(entry(&gw, "gatewayclasses")["namespaced"], json!(false));
        assert_eq!(entry(&gw, "gatewayclasses")["shortNames"], json!(["gc"]));
        assert_eq!(entry(&gw, "httproutes")["kind"], "HTTPRoute");
        assert_eq!(
            entry(&gw, "grpcroutes")["categories"],
            json!(["gateway-api"])
        );
        let authn = resource_list("authentication.k8s.io", "v1").unwrap();
        let tr = entry(&authn, "tokenreviews");
        assert_eq!(tr["verbs"], json!(["create"]));
        assert_eq!(tr["namespaced"], json!(false));
        assert_eq!(authn["resources"].as_array().unwrap().len(), 1, "no status");

        assert_eq!(
            Resource::from_kind("security.istio.io/v1beta1", "AuthorizationPolicy"),
            Some(Resource::AuthorizationPolicies)
        );
        assert_eq!(
            Resource::from_kind("security.istio.io/v2", "AuthorizationPolicy"),
            None
        );
        assert_eq!(
            Resource::from_kind("gateway.networking.k8s.io/v1", "HTTPRoute"),
            Some(Resource::HttpRoutes)
        );
        assert_eq!(
            Resource::AuthorizationPolicies.api_version(),
            "security.istio.io/v1"
        );
        assert_eq!(
            Resource::HttpRoutes.qualified(),
            "httproutes.gateway.networking.k8s.io"
        );
        assert_eq!(
            Resource::Gateways.qualified_kind(),
            "Gateway.gateway.networking.k8s.io"
        );
        assert_eq!(Resource::ConfigMaps.api_version(), "v1");
        assert!(!Resource::TokenReviews.stored() && !Resource::TokenReviews.is_custom());
        assert!(Resource::Gateways.has_status() && !Resource::ConfigMaps.has_status());
        for r in Resource::ALL {
            assert_eq!(Resource::from_plural(r.group(), r.plural()), Some(r));
            assert!(group(r.group()).unwrap().resources.contains(&r), "{r:?}");
        }
    }

    #[test]
    fn objects_show_the_version_they_are_read_through() {
        let stored = json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy"});
        let beta = served_as(Resource::AuthorizationPolicies, "v1beta1", &stored);
        assert_eq!(beta["apiVersion"], "security.istio.io/v1beta1");
        assert!(matches!(
            served_as(Resource::AuthorizationPolicies, "v1", &stored),
            Cow::Borrowed(_)
        ));
    }
}
