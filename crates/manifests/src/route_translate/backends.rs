//! A rule's backendRefs: each a Service of the route's namespace with a port (other kinds
//! and namespaces kept as invalid targets, as the specification asks), a weight, and
//! header-modifier filters.

use ambit_routes::{Backend, BackendTarget, Filter, RouteKind, ServiceBackend, ServiceKey};

use super::fields::{check_group, check_kind, check_object_name, port};
use super::filters::filters;
use super::invalid;
use crate::locate::{field, FieldPath};
use crate::route_schema::BackendRefSpec;
use crate::translate::{check_dns, Invalid};
use crate::values::Text;

// The CRDs' limits.
const MAX_BACKEND_REFS: usize = 16;
const MAX_WEIGHT: i64 = 1_000_000;

/// A rule's `backendRefs`, at most [`MAX_BACKEND_REFS`].
pub(super) fn backend_refs(
    p: &FieldPath,
    spec: Option<Vec<BackendRefSpec>>,
) -> Result<Vec<BackendRefSpec>, Invalid> {
    let spec = spec.unwrap_or_default();
    if spec.len() > MAX_BACKEND_REFS {
        return Err(invalid(
            p.at(field!["backendRefs"]),
            format!("at most {MAX_BACKEND_REFS} backendRefs"),
        ));
    }
    Ok(spec)
}

/// A backend object reference: a Service of this namespace with a port, or why not.
pub(super) fn backend_object(
    p: &FieldPath,
    group: Option<&Text>,
    kind: Option<&Text>,
    name: &Text,
    ns: Option<&Text>,
    port_written: Option<i64>,
    namespace: &str,
) -> Result<BackendTarget, Invalid> {
    let group = group.map_or("", |g| g.0.as_str());
    let kind = kind.map_or("Service", |k| k.0.as_str());
    check_group(group).map_err(|m| invalid(p.at(field!["group"]), m))?;
    check_kind(kind).map_err(|m| invalid(p.at(field!["kind"]), m))?;
    check_object_name(&name.0).map_err(|m| invalid(p.at(field!["name"]), m))?;
    let target_ns = match ns {
        Some(Text(n)) => {
            check_dns(n, 63, false).map_err(|m| invalid(p.at(field!["namespace"]), m))?;
            n.clone()
        }
        None => namespace.to_string(),
    };
    let port = port_written
        .map(|n| port(n).map_err(|m| invalid(p.at(field!["port"]), m)))
        .transpose()?;
    if !(group.is_empty() && kind == "Service") {
        return Ok(BackendTarget::Invalid(format!(
            "{kind} (group {group:?}) is not a backend kind the waypoint sends to; only Services are"
        )));
    }
    let Some(port) = port else {
        return Err(invalid(
            p.at(field!["port"]),
            "a Service backend must have a port",
        ));
    };
    if target_ns != namespace {
        return Ok(BackendTarget::Invalid(format!(
            "Service {target_ns}/{} is in another namespace, and ReferenceGrants (which would permit it) are not read",
            name.0
        )));
    }
    Ok(BackendTarget::Service(ServiceBackend {
        service: ServiceKey::new(target_ns, name.0.clone()),
        port,
    }))
}

pub(super) fn backends(
    p: &FieldPath,
    list: Vec<BackendRefSpec>,
    namespace: &str,
    kind: RouteKind,
    unsupported: &mut Option<String>,
    notes: &mut Vec<String>,
) -> Result<Vec<Backend>, Invalid> {
    let mut out = Vec::with_capacity(list.len());
    for (k, b) in list.into_iter().enumerate() {
        let bp = p.at(field!["backendRefs", k]);
        let target = backend_object(
            &bp,
            b.group.as_ref(),
            b.kind.as_ref(),
            &b.name,
            b.namespace.as_ref(),
            b.port,
            namespace,
        )?;
        let weight = match b.weight {
            None => 1,
            Some(w) if (0..=MAX_WEIGHT).contains(&w) => w as u32,
            Some(w) => {
                return Err(invalid(
                    bp.at(field!["weight"]),
                    format!("{w} is not a weight (0 to {MAX_WEIGHT})"),
                ))
            }
        };
        let fp = bp.at(field!["filters"]);
        let filters = filters(
            &fp,
            b.filters.unwrap_or_default(),
            namespace,
            kind,
            unsupported,
            notes,
        )?;
        if let Some(f) = filters
            .iter()
            .find(|f| !matches!(f, Filter::RequestHeaders(_) | Filter::ResponseHeaders(_)))
        {
            let what = match f {
                Filter::Redirect(_) => "RequestRedirect",
                Filter::Rewrite(_) => "URLRewrite",
                _ => "RequestMirror",
            };
            unsupported.get_or_insert_with(|| {
                format!("{fp}: a {what} filter on a backendRef is not supported (only header modifiers are)")
            });
        }
        out.push(Backend {
            target,
            weight,
            filters,
        });
    }
    Ok(out)
}
