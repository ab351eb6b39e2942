//! A route's head: its name and namespace, creation time, the Service parents it attaches
//! to (others noted), and its hostnames (checked only).

use ambit_gateway_routes::{CreationTime, ParentKind, ParentRef, ServiceKey};

use super::fields::{check_group, check_hostname, check_kind, check_object_name, port};
use super::{invalid, GATEWAY_GROUP};
use crate::locate::field;
use crate::route_schema::RouteObject;
use crate::translate::{check_dns, Invalid};
use crate::values::Text;
use crate::ParseOptions;

// The CRDs' limits.
const MAX_PARENT_REFS: usize = 32;
const MAX_HOSTNAMES: usize = 16;

/// The route's header: name, namespace, creation time, and the Service parents.
pub(super) struct Head {
    pub namespace: String,
    pub name: String,
    pub created: Option<CreationTime>,
    pub parents: Vec<ParentRef>,
    pub notes: Vec<String>,
}

/// A parentRef as the CRD compares them: group, kind, namespace, name, sectionName, port.
type ParentKey = (String, String, String, String, Option<String>, Option<i64>);

pub(super) fn head<R>(
    obj: &RouteObject<R>,
    created: Option<&str>,
    options: &ParseOptions,
) -> Result<Head, Invalid> {
    let name = obj.metadata.name.0.clone();
    check_dns(&name, 253, true).map_err(|m| invalid(field!["metadata", "name"], m))?;
    let namespace = match &obj.metadata.namespace {
        Some(Text(ns)) if !ns.is_empty() => {
            check_dns(ns, 63, false).map_err(|m| invalid(field!["metadata", "namespace"], m))?;
            ns.clone()
        }
        _ => options.default_namespace.clone(),
    };
    let created = created
        .map(CreationTime::parse)
        .transpose()
        .map_err(|m| invalid(field!["metadata", "creationTimestamp"], m))?;
    let spec = obj.spec.as_ref();
    let refs = spec.and_then(|s| s.parent_refs.as_deref()).unwrap_or(&[]);
    if refs.len() > MAX_PARENT_REFS {
        return Err(invalid(
            field!["spec", "parentRefs"],
            format!("at most {MAX_PARENT_REFS} parentRefs"),
        ));
    }
    let mut parents = Vec::new();
    let mut notes = Vec::new();
    let mut seen: Vec<ParentKey> = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let p = field!["spec", "parentRefs", i];
        let group = r.group.as_ref().map_or(GATEWAY_GROUP, |g| g.0.as_str());
        let kind = r.kind.as_ref().map_or("Gateway", |k| k.0.as_str());
        check_group(group).map_err(|m| invalid(p.at(field!["group"]), m))?;
        check_kind(kind).map_err(|m| invalid(p.at(field!["kind"]), m))?;
        check_object_name(&r.name.0).map_err(|m| invalid(p.at(field!["name"]), m))?;
        let ns = match &r.namespace {
            Some(Text(ns)) => {
                check_dns(ns, 63, false).map_err(|m| invalid(p.at(field!["namespace"]), m))?;
                ns.clone()
            }
            None => namespace.clone(),
        };
        if let Some(Text(s)) = &r.section_name {
            check_dns(s, 253, true).map_err(|m| invalid(p.at(field!["sectionName"]), m))?;
        }
        let port = r
            .port
            .map(|n| port(n).map_err(|m| invalid(p.at(field!["port"]), m)))
            .transpose()?;
        // The CRD: two references to one parent must tell themselves apart by
        // sectionName or port.
        let section = r.section_name.as_ref().map(|s| s.0.clone());
        let key = (
            group.to_string(),
            kind.to_string(),
            ns.clone(),
            r.name.0.clone(),
            section.clone(),
            r.port,
        );
        let same_parent =
            |k: &ParentKey| (&k.0, &k.1, &k.2, &k.3) == (&key.0, &key.1, &key.2, &key.3);
        if let Some(other) = seen.iter().find(|k| same_parent(k)) {
            let distinct = (key.4.is_some() || key.5.is_some())
                && (other.4.is_some() || other.5.is_some())
                && (other.4 != key.4 || other.5 != key.5);
            if !distinct {
                return Err(invalid(
                    p,
                    "refers to a parent already referred to; references to one parent must each set a distinct sectionName or port",
                ));
            }
        }
        seen.push(key);
        let shown = format!("parentRefs[{i}] ({kind} {ns}/{})", r.name.0);
        let service = (group.is_empty() && kind == "Service")
            || (group == crate::dr_translate::NETWORKING_GROUP && kind == "ServiceEntry");
        let gateway = group == GATEWAY_GROUP && kind == "Gateway";
        if gateway {
            if ns != namespace {
                notes.push(format!(
                    "{shown}: not honoured; a route attaches to a waypoint Gateway of its own namespace (the Gateway's allowedRoutes are not known to the waypoint)"
                ));
            } else {
                if r.section_name.is_some() || port.is_some() {
                    notes.push(format!(
                        "{shown}: sectionName and port not used; a waypoint Gateway's routes apply to every Service it fronts that has none of its own"
                    ));
                }
                parents.push(ParentRef {
                    service: ServiceKey::new(ns, r.name.0.clone()),
                    port: None,
                    kind: ParentKind::Gateway,
                });
            }
        } else if !service {
            notes.push(format!(
                "{shown}: not honoured; a waypoint serves routes whose parent is a Service (group \"\"), a ServiceEntry ({}) or its own Gateway",
                crate::dr_translate::NETWORKING_GROUP
            ));
        } else if ns != namespace {
            notes.push(format!(
                "{shown}: not honoured; a route for another namespace's {kind} (a consumer route) is not served by that {kind}'s waypoint"
            ));
        } else if r.section_name.is_some() {
            notes.push(format!(
                "{shown}: not honoured; a {kind} parent is scoped by port, not sectionName"
            ));
        } else {
            parents.push(ParentRef {
                service: ServiceKey::new(ns, r.name.0.clone()),
                port,
                kind: ParentKind::Service,
            });
        }
    }
    if let Some(hosts) = spec.and_then(|s| s.hostnames.as_ref()) {
        if hosts.len() > MAX_HOSTNAMES {
            return Err(invalid(
                field!["spec", "hostnames"],
                format!("at most {MAX_HOSTNAMES} hostnames"),
            ));
        }
        for (i, h) in hosts.iter().enumerate() {
            let bare = h.0.strip_prefix("*.").unwrap_or(&h.0);
            check_hostname(bare).map_err(|m| invalid(field!["spec", "hostnames", i], m))?;
        }
    }
    Ok(Head {
        namespace,
        name,
        created,
        parents,
        notes,
    })
}
