//! An object a rule refers to for its traffic (a backendRef, a mirror's backendRef): a
//! Service of the route's namespace with a port, or why the waypoint does not send there.

use ambit_gateway_routes::{BackendTarget, ServiceBackend, ServiceKey};

use super::fields::{check_group, check_kind, check_object_name, port};
use super::invalid;
use crate::locate::{field, FieldPath};
use crate::translate::{check_dns, Invalid};
use crate::values::Text;

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
    // A ServiceEntry is a Service of the mesh state, by namespace and name (Istio's
    // backendRef extension).
    let entry = group == crate::dr_translate::NETWORKING_GROUP && kind == "ServiceEntry";
    let service = group.is_empty() && kind == "Service";
    if !(service || entry) {
        return Ok(BackendTarget::Invalid(format!(
            "{kind} (group {group:?}) is not a backend kind the waypoint sends to; Services and ServiceEntries are"
        )));
    }
    let Some(port) = port else {
        return Err(invalid(
            p.at(field!["port"]),
            format!("a {kind} backend must have a port"),
        ));
    };
    if target_ns != namespace {
        return Ok(BackendTarget::Invalid(format!(
            "{kind} {target_ns}/{} is in another namespace, and ReferenceGrants (which would permit it) are not read",
            name.0
        )));
    }
    Ok(BackendTarget::Service(ServiceBackend {
        service: ServiceKey::new(target_ns, name.0.clone()),
        port,
    }))
}
