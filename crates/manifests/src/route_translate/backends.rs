//! A rule's backendRefs: each a Service of the route's namespace with a port (other kinds
//! and namespaces kept as invalid targets, as the specification asks), a weight, and
//! header-modifier filters.

use ambit_gateway_routes::{Backend, Filter, RouteKind};

use super::filters::filters;
use super::invalid;
use super::object_ref::backend_object;
use crate::locate::{field, FieldPath};
use crate::route_schema::BackendRefSpec;
use crate::translate::Invalid;

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
