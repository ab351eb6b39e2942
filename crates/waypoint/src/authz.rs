//! Which policies apply, and their verdict. Attachment is by `targetRefs` only (reference
//! waypoint.md §2.1): this waypoint's Gateway (all its traffic), its GatewayClass (from the
//! root namespace), and a Service or ServiceEntry it is fronting for this stream. The
//! verdict is the state crate's one evaluator (`ambit_state::authorize_request`, or the
//! L4 `authorize_observed` for opaque tunnels, where an ALLOW rule with L7 fields never
//! matches). AUDIT policies only mark; CUSTOM needs an external authorizer this waypoint
//! does not have, so a CUSTOM policy that applies denies every request, as Istio does for
//! a provider it cannot find.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use ambit_manifests::{PolicyTarget, WaypointAction, WaypointPolicy};
use ambit_state::{Authorization, RbacContext, RequestAttributes};
use hyper::body::Incoming;

use crate::downstream::Downstream;
use crate::front::Fronted;
use crate::Waypoint;

/// The waypoint's policies, as loaded, indexed by what they target.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    pub policies: Vec<Arc<WaypointPolicy>>,
    /// Set when a refused document's policy has no good version to stand in for it
    /// ([`crate::policies`]): every request is denied, saying why, until it is fixed.
    pub fail_closed: Option<String>,
    /// Service or ServiceEntry name → (its namespace, the policy's index), so that a
    /// request looks at the few policies of its service, not at every one loaded.
    by_service: HashMap<String, Vec<(String, usize)>>,
    /// The policies with a Gateway or GatewayClass target, checked for every request.
    wide: Vec<usize>,
}

/// Who this waypoint is, for attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment<'a> {
    pub namespace: &'a str,
    pub gateway: &'a str,
    pub gateway_class: &'a str,
}

/// The policies that apply to one stream.
#[derive(Debug, Default)]
pub struct Applying {
    /// ALLOW and DENY (enforced or dry-run), for the evaluator.
    pub evaluated: Vec<Arc<WaypointPolicy>>,
    /// The first CUSTOM policy that applies (`namespace/name`, provider).
    pub custom: Option<(String, String)>,
    /// Why everything is denied (a refused policy without a last good version).
    pub fail_closed: Option<String>,
}

impl PolicySet {
    pub fn new(policies: Vec<Arc<WaypointPolicy>>, fail_closed: Option<String>) -> PolicySet {
        let mut by_service: HashMap<String, Vec<(String, usize)>> = HashMap::new();
        let mut wide = Vec::new();
        for (i, p) in policies.iter().enumerate() {
            for t in &p.targets {
                match t {
                    PolicyTarget::Service { namespace, name }
                    | PolicyTarget::ServiceEntry { namespace, name } => {
                        by_service
                            .entry(name.clone())
                            .or_default()
                            .push((namespace.clone(), i));
                    }
                    PolicyTarget::Gateway { .. } | PolicyTarget::GatewayClass { .. } => {
                        wide.push(i)
                    }
                }
            }
        }
        PolicySet {
            policies,
            fail_closed,
            by_service,
            wide,
        }
    }

    /// The policies attached to what `fronted` is, for the waypoint `me`, in the order
    /// they were loaded.
    pub fn applying(&self, me: &Attachment<'_>, fronted: &Fronted) -> Applying {
        let mut out = Applying {
            fail_closed: self.fail_closed.clone(),
            ..Applying::default()
        };
        let mut candidates: Vec<usize> = self.wide.clone();
        if let Some(s) = fronted.service() {
            candidates.extend(
                self.by_service
                    .get(s.name.as_str())
                    .into_iter()
                    .flatten()
                    .filter(|(namespace, _)| *namespace == s.namespace)
                    .map(|(_, i)| *i),
            );
        }
        candidates.sort_unstable();
        candidates.dedup();
        for p in candidates.into_iter().map(|i| &self.policies[i]) {
            if !p.targets.iter().any(|t| attaches(t, me, fronted)) {
                continue;
            }
            match &p.action {
                WaypointAction::Allow | WaypointAction::Deny => out.evaluated.push(p.clone()),
                WaypointAction::Audit => {}
                WaypointAction::Custom { provider } => {
                    out.custom
                        .get_or_insert_with(|| (p.authorization.key(), provider.clone()));
                }
            }
        }
        out
    }
}

pub(crate) fn attaches(target: &PolicyTarget, me: &Attachment<'_>, fronted: &Fronted) -> bool {
    match target {
        PolicyTarget::Gateway { namespace, name } => {
            namespace == me.namespace && name == me.gateway
        }
        PolicyTarget::GatewayClass { name } => name == me.gateway_class,
        PolicyTarget::Service { namespace, name }
        | PolicyTarget::ServiceEntry { namespace, name } => fronted
            .service()
            .is_some_and(|s| &s.namespace == namespace && &s.name == name),
    }
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Envoy's response code details say why.
    Deny {
        details: String,
    },
}

/// The connection as RBAC sees it: the HBONE peer, and the destination dialed.
fn context(down: &Downstream) -> RbacContext {
    let ip = down
        .destination_ip
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    RbacContext {
        source_identity: down.peer_identity.clone(),
        source_ip: down.peer_ip,
        destination: SocketAddr::new(ip, down.fronted.port()),
    }
}

pub(crate) fn attachment(wp: &Waypoint) -> Attachment<'_> {
    Attachment {
        namespace: &wp.cfg.namespace,
        gateway: &wp.cfg.gateway,
        gateway_class: &wp.cfg.gateway_class,
    }
}

fn refused_policy_denial(why: &str) -> Verdict {
    tracing::warn!(
        "denied: a policy document was refused and has no last good version to stand in for it; fix it: {why}"
    );
    Verdict::Deny {
        details: "rbac_access_denied_matched_policy[none]".into(),
    }
}

fn custom_denial(custom: &(String, String)) -> Verdict {
    tracing::warn!(
        policy = %custom.0,
        provider = %custom.1,
        "a CUSTOM policy applies, and this waypoint has no external authorizer: denied (as Istio denies for a provider it cannot find)"
    );
    Verdict::Deny {
        details: "rbac_access_denied_matched_policy[default-deny-all-due-to-bad-CUSTOM-action]"
            .into(),
    }
}

fn authorizations(applying: &Applying) -> Vec<&Authorization> {
    applying
        .evaluated
        .iter()
        .map(|p| &p.authorization)
        .collect()
}

/// The policies the evaluator decides on for this stream, or the denial that needs no
/// evaluation (a refused policy without a stand-in, a CUSTOM policy).
fn evaluated(wp: &Waypoint, down: &Downstream) -> Result<Applying, Verdict> {
    let applying = wp.policies.get().applying(&attachment(wp), &down.fronted);
    if let Some(why) = &applying.fail_closed {
        return Err(refused_policy_denial(why));
    }
    if let Some(custom) = &applying.custom {
        return Err(custom_denial(custom));
    }
    Ok(applying)
}

/// The verdict on one HTTP request (`path` already normalised, `host` as received,
/// `auth` what its validated JWT says, if it carried one).
pub fn authorize_request(
    wp: &Waypoint,
    down: &Downstream,
    req: &http::Request<Incoming>,
    path: &str,
    host: &str,
    auth: Option<&ambit_state::RequestAuth>,
) -> Verdict {
    let applying = match evaluated(wp, down) {
        Ok(a) => a,
        Err(denied) => return denied,
    };
    let attrs = RequestAttributes {
        method: req.method().as_str(),
        path,
        query: req.uri().query(),
        host,
        headers: req.headers(),
        remote_ip: down.peer_ip,
        auth,
        sni: None,
    };
    match ambit_state::authorize_request(
        &authorizations(&applying),
        &context(down),
        &attrs,
        &*wp.dry_run,
    ) {
        Ok(_) => Verdict::Allow,
        Err(denied) => Verdict::Deny {
            details: denied.details(),
        },
    }
}

/// The verdict on an opaque tunnel: L4 fields only.
pub fn authorize_connection(wp: &Waypoint, down: &Downstream) -> Verdict {
    let applying = match evaluated(wp, down) {
        Ok(a) => a,
        Err(denied) => return denied,
    };
    match ambit_state::authorize_observed(&authorizations(&applying), &context(down), &*wp.dry_run)
    {
        Ok(()) => Verdict::Allow,
        Err(denied) => Verdict::Deny {
            details: denied.details(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_state::ProxyState;

    const MESH: &str = r#"
services:
- {name: reviews, namespace: shop, hostname: reviews.shop.svc.cluster.local, vips: ["/10.96.0.1"], ports: {80: 8080}}
- {name: ratings, namespace: shop, hostname: ratings.shop.svc.cluster.local, vips: ["/10.96.0.2"], ports: {80: 8080}}
"#;

    const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: on-gateway, namespace: shop}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: DENY
  rules: [{to: [{operation: {methods: ["DELETE"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: on-other-gateway, namespace: shop}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: other}]
  action: DENY
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: on-reviews, namespace: shop}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  action: ALLOW
  rules: [{to: [{operation: {methods: ["GET"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit-reviews, namespace: shop}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  action: AUDIT
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext, namespace: shop}
spec:
  targetRefs: [{kind: Service, group: "", name: ratings}]
  action: CUSTOM
  provider: {name: my-authz}
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-of-another-namespace, namespace: books}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  action: DENY
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: both-ways, namespace: shop}
spec:
  targetRefs:
  - {kind: Service, group: "", name: reviews}
  - {kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}
  action: DENY
  rules: [{to: [{operation: {methods: ["PATCH"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: late-gateway, namespace: shop}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: DENY
  rules: [{to: [{operation: {methods: ["PUT"]}}]}]
"#;

    fn names(a: &Applying) -> Vec<String> {
        a.evaluated.iter().map(|p| p.authorization.key()).collect()
    }

    #[test]
    fn attachment_table() {
        let state = ProxyState::from_yaml("mesh", MESH).unwrap();
        let parsed = ambit_manifests::parse_documents(
            "policies.yaml",
            POLICIES,
            &ambit_manifests::ParseOptions::default(),
        );
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let set = PolicySet::new(
            parsed
                .policies
                .into_iter()
                .map(|p| Arc::new(p.value))
                .collect(),
            None,
        );
        let me = Attachment {
            namespace: "shop",
            gateway: "waypoint",
            gateway_class: "istio-waypoint",
        };
        let service = |host: &str| Fronted::Service {
            service: state.service_by_key(&format!("shop/{host}")).unwrap(),
            port: 80,
            vip: None,
        };
        // In the order loaded, each once, and never a policy for another namespace's
        // service of the same name.
        let reviews = set.applying(&me, &service("reviews.shop.svc.cluster.local"));
        assert_eq!(
            names(&reviews),
            [
                "shop/on-gateway",
                "shop/on-reviews",
                "shop/both-ways",
                "shop/late-gateway"
            ]
        );
        assert_eq!(reviews.custom, None);
        let ratings = set.applying(&me, &service("ratings.shop.svc.cluster.local"));
        assert_eq!(
            names(&ratings),
            ["shop/on-gateway", "shop/both-ways", "shop/late-gateway"]
        );
        assert_eq!(
            ratings.custom,
            Some(("shop/ext".to_string(), "my-authz".to_string()))
        );
        // Another gateway of the same name in another namespace attaches nothing.
        let elsewhere = Attachment {
            namespace: "other",
            ..me.clone()
        };
        let reviews_elsewhere =
            set.applying(&elsewhere, &service("reviews.shop.svc.cluster.local"));
        assert_eq!(
            names(&reviews_elsewhere),
            ["shop/on-reviews", "shop/both-ways"]
        );
    }
}
