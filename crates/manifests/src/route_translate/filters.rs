//! A rule's (or backendRef's) filters: header modifiers, redirects, rewrites and mirrors,
//! with the CRD's checks between them; the types this waypoint does not apply make the rule
//! unsupported.

use ambit_gateway_routes::{
    BackendTarget, Filter, HeaderModifier, Mirror, PathModifier, Redirect, Rewrite, RouteKind,
};
use http::header::HeaderName;

use super::fields::{check_hostname, header_name, header_value, port, MAX_PATH};
use super::invalid;
use super::object_ref::backend_object;
use crate::locate::{field, FieldPath};
use crate::route_schema::{
    BackendObjectSpec, CorsSpec, FilterSpec, HeaderFilterSpec, MirrorSpec, PathModifierSpec,
    RedirectSpec, RewriteSpec,
};
use crate::translate::Invalid;
use crate::values::Text;

// The CRDs' limits.
const MAX_FILTERS: usize = 16;
const MAX_HEADER_CHANGES: usize = 16;
const REDIRECT_CODES: &[i64] = &[301, 302, 303, 307, 308];

/// The filter types the CRD allows on a route of `kind`.
fn allowed_types(kind: RouteKind) -> &'static [&'static str] {
    match kind {
        RouteKind::Http => &[
            "RequestHeaderModifier",
            "ResponseHeaderModifier",
            "RequestMirror",
            "RequestRedirect",
            "URLRewrite",
            "ExtensionRef",
            "CORS",
            "ExternalAuth",
        ],
        RouteKind::Grpc => &[
            "RequestHeaderModifier",
            "ResponseHeaderModifier",
            "RequestMirror",
            "ExtensionRef",
        ],
    }
}

/// A rule's (or backendRef's) filters, with the CRD's checks between them.
pub(super) fn filters(
    p: &FieldPath,
    list: Vec<FilterSpec>,
    namespace: &str,
    kind: RouteKind,
    unsupported: &mut Option<String>,
    notes: &mut Vec<String>,
) -> Result<Vec<Filter>, Invalid> {
    if list.len() > MAX_FILTERS {
        return Err(invalid(p.clone(), format!("at most {MAX_FILTERS} filters")));
    }
    let allowed = allowed_types(kind);
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for (k, f) in list.into_iter().enumerate() {
        let fp = p.at(field![k]);
        let ty = f.kind.0.as_str();
        let Some(ty) = allowed.iter().find(|a| **a == ty).copied() else {
            return Err(invalid(
                fp.at(field!["type"]),
                format!(
                    "unknown {kind} filter type {ty:?}; one of {}",
                    allowed.join(", ")
                ),
            ));
        };
        check_only_its_field(&fp, ty, &f)?;
        if ty != "RequestMirror" && ty != "ExtensionRef" && seen.contains(&ty) {
            return Err(invalid(fp, format!("a {ty} filter cannot be repeated")));
        }
        seen.push(ty);
        if seen.contains(&"RequestRedirect") && seen.contains(&"URLRewrite") {
            return Err(invalid(
                fp,
                "RequestRedirect and URLRewrite filters cannot be used together",
            ));
        }
        let filter = match (ty, f) {
            ("RequestHeaderModifier", f) => Some(Filter::RequestHeaders(header_filter(
                &fp.at(field!["requestHeaderModifier"]),
                f.request_header_modifier.unwrap_or_default(),
            )?)),
            ("ResponseHeaderModifier", f) => Some(Filter::ResponseHeaders(header_filter(
                &fp.at(field!["responseHeaderModifier"]),
                f.response_header_modifier.unwrap_or_default(),
            )?)),
            (
                "RequestRedirect",
                FilterSpec {
                    request_redirect: Some(r),
                    ..
                },
            ) => Some(Filter::Redirect(redirect(
                &fp.at(field!["requestRedirect"]),
                r,
            )?)),
            (
                "URLRewrite",
                FilterSpec {
                    url_rewrite: Some(r),
                    ..
                },
            ) => Some(Filter::Rewrite(rewrite(&fp.at(field!["urlRewrite"]), r)?)),
            (
                "RequestMirror",
                FilterSpec {
                    request_mirror: Some(m),
                    ..
                },
            ) => mirror(&fp.at(field!["requestMirror"]), m, namespace, notes)?.map(Filter::Mirror),
            ("CORS", FilterSpec { cors: Some(c), .. }) => {
                Some(Filter::Cors(cors(&fp.at(field!["cors"]), c)?))
            }
            (other, _) => {
                unsupported.get_or_insert_with(|| {
                    format!("{fp}: {other} filters are not supported by this waypoint")
                });
                None
            }
        };
        out.extend(filter);
    }
    Ok(out)
}

/// Exactly the field of the filter's type is set.
fn check_only_its_field(fp: &FieldPath, ty: &str, f: &FilterSpec) -> Result<(), Invalid> {
    let set = [
        (
            "RequestHeaderModifier",
            "requestHeaderModifier",
            f.request_header_modifier.is_some(),
        ),
        (
            "ResponseHeaderModifier",
            "responseHeaderModifier",
            f.response_header_modifier.is_some(),
        ),
        ("RequestMirror", "requestMirror", f.request_mirror.is_some()),
        (
            "RequestRedirect",
            "requestRedirect",
            f.request_redirect.is_some(),
        ),
        ("URLRewrite", "urlRewrite", f.url_rewrite.is_some()),
        ("CORS", "cors", f.cors.is_some()),
        ("ExternalAuth", "externalAuth", f.external_auth.is_some()),
        ("ExtensionRef", "extensionRef", f.extension_ref.is_some()),
    ];
    for (t, name, present) in set {
        if t == ty && !present {
            return Err(invalid(
                fp.clone(),
                format!("{name} must be set for a {ty} filter"),
            ));
        }
        if t != ty && present {
            return Err(invalid(
                fp.at(field![name]),
                format!("must not be set for a {ty} filter"),
            ));
        }
    }
    Ok(())
}

/// A hostname a redirect or rewrite writes.
fn hostname(p: &FieldPath, h: Option<Text>) -> Result<Option<String>, Invalid> {
    h.map(|h| {
        check_hostname(&h.0)
            .map(|_| h.0)
            .map_err(|m| invalid(p.at(field!["hostname"]), m))
    })
    .transpose()
}

fn redirect(rp: &FieldPath, r: RedirectSpec) -> Result<Redirect, Invalid> {
    let scheme = match r.scheme.map(|s| s.0) {
        None => None,
        Some(s) if s == "http" || s == "https" => Some(s),
        Some(s) => {
            return Err(invalid(
                rp.at(field!["scheme"]),
                format!("unknown scheme {s:?}; http or https"),
            ))
        }
    };
    let hostname = hostname(rp, r.hostname)?;
    let path = r
        .path
        .map(|m| path_modifier(&rp.at(field!["path"]), m))
        .transpose()?;
    let port = r
        .port
        .map(|n| port(n).map_err(|m| invalid(rp.at(field!["port"]), m)))
        .transpose()?;
    let status = match r.status_code {
        None => 302,
        Some(c) if REDIRECT_CODES.contains(&c) => c as u16,
        Some(c) => {
            return Err(invalid(
                rp.at(field!["statusCode"]),
                format!("{c} is not a redirect status; one of 301, 302, 303, 307, 308"),
            ))
        }
    };
    Ok(Redirect {
        scheme,
        hostname,
        path,
        port,
        status,
    })
}

fn rewrite(rp: &FieldPath, r: RewriteSpec) -> Result<Rewrite, Invalid> {
    let hostname = hostname(rp, r.hostname)?;
    let path = r
        .path
        .map(|m| path_modifier(&rp.at(field!["path"]), m))
        .transpose()?;
    Ok(Rewrite { hostname, path })
}

/// A mirror, or `None` (noted) when its backend is not one the waypoint sends to: the
/// specification drops a mirror to an invalid backend.
fn mirror(
    mp: &FieldPath,
    m: MirrorSpec,
    namespace: &str,
    notes: &mut Vec<String>,
) -> Result<Option<Mirror>, Invalid> {
    let (numerator, denominator) = match (m.percent, m.fraction) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                mp.at(field!["fraction"]),
                "set either percent or fraction, not both",
            ))
        }
        (Some(pc), None) if (0..=100).contains(&pc) => (pc as u32, 100),
        (Some(pc), None) => {
            return Err(invalid(
                mp.at(field!["percent"]),
                format!("{pc} is not a percentage (0 to 100)"),
            ))
        }
        (None, Some(fr)) => {
            let den = fr.denominator.unwrap_or(100);
            let ok = |n: i64| u32::try_from(n).ok();
            match (ok(fr.numerator), ok(den)) {
                (Some(n), Some(d)) if d > 0 && n <= d => (n, d),
                _ => return Err(invalid(
                    mp.at(field!["fraction"]),
                    "numerator must be 0 or more and at most the denominator, which is more than 0",
                )),
            }
        }
        (None, None) => (1, 1),
    };
    let bp = mp.at(field!["backendRef"]);
    let b: &BackendObjectSpec = &m.backend_ref;
    match backend_object(
        &bp,
        b.group.as_ref(),
        b.kind.as_ref(),
        &b.name,
        b.namespace.as_ref(),
        b.port,
        namespace,
    )? {
        BackendTarget::Service(backend) => Ok(Some(Mirror {
            backend,
            numerator,
            denominator,
        })),
        BackendTarget::Invalid(why) => {
            notes.push(format!("{bp}: mirror dropped: {why}"));
            Ok(None)
        }
    }
}

fn path_modifier(p: &FieldPath, m: PathModifierSpec) -> Result<PathModifier, Invalid> {
    let check = |v: &Text, f: &str| -> Result<String, Invalid> {
        if v.0.chars().count() > MAX_PATH {
            return Err(invalid(
                p.at(field![f]),
                format!("longer than {MAX_PATH} characters"),
            ));
        }
        Ok(v.0.clone())
    };
    match (
        m.kind.0.as_str(),
        &m.replace_full_path,
        &m.replace_prefix_match,
    ) {
        ("ReplaceFullPath", Some(v), None) => Ok(PathModifier::Full(check(v, "replaceFullPath")?)),
        ("ReplacePrefixMatch", None, Some(v)) => {
            Ok(PathModifier::Prefix(check(v, "replacePrefixMatch")?))
        }
        ("ReplaceFullPath", _, Some(_)) => Err(invalid(
            p.at(field!["replacePrefixMatch"]),
            "must not be set when type is ReplaceFullPath",
        )),
        ("ReplacePrefixMatch", Some(_), _) => Err(invalid(
            p.at(field!["replaceFullPath"]),
            "must not be set when type is ReplacePrefixMatch",
        )),
        ("ReplaceFullPath", None, _) => Err(invalid(
            p.clone(),
            "replaceFullPath must be set when type is ReplaceFullPath",
        )),
        ("ReplacePrefixMatch", _, None) => Err(invalid(
            p.clone(),
            "replacePrefixMatch must be set when type is ReplacePrefixMatch",
        )),
        (other, _, _) => Err(invalid(
            p.at(field!["type"]),
            format!("unknown path modifier type {other:?}; ReplaceFullPath or ReplacePrefixMatch"),
        )),
    }
}

/// A header modifier: at most 16 of each list, and each header name in one action only.
fn header_filter(p: &FieldPath, f: HeaderFilterSpec) -> Result<HeaderModifier, Invalid> {
    let mut names: Vec<HeaderName> = Vec::new();
    let mut claim = |at: FieldPath, raw: &str| -> Result<HeaderName, Invalid> {
        let name = header_name(raw).map_err(|m| invalid(at.clone(), m))?;
        if names.contains(&name) {
            return Err(invalid(
                at,
                format!(
                    "header {raw:?} is named twice; a header modifier takes one action per header"
                ),
            ));
        }
        names.push(name.clone());
        Ok(name)
    };
    let mut out = HeaderModifier::default();
    for (list, field_name, into) in [(f.set, "set", &mut out.set), (f.add, "add", &mut out.add)] {
        let list = list.unwrap_or_default();
        if list.len() > MAX_HEADER_CHANGES {
            return Err(invalid(
                p.at(field![field_name]),
                format!("at most {MAX_HEADER_CHANGES} headers"),
            ));
        }
        for (k, h) in list.into_iter().enumerate() {
            let hp = p.at(field![field_name, k]);
            let name = claim(hp.at(field!["name"]), &h.name.0)?;
            header_value(&h.value.0).map_err(|m| invalid(hp.at(field!["value"]), m))?;
            into.push((name, h.value.0));
        }
    }
    let remove = f.remove.unwrap_or_default();
    if remove.len() > MAX_HEADER_CHANGES {
        return Err(invalid(
            p.at(field!["remove"]),
            format!("at most {MAX_HEADER_CHANGES} headers"),
        ));
    }
    for (k, h) in remove.into_iter().enumerate() {
        out.remove.push(claim(p.at(field!["remove", k]), &h.0)?);
    }
    Ok(out)
}

// The CRD's limits on a CORS filter.
const MAX_CORS_ENTRIES: usize = 64;
const CORS_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "*",
];

/// `cors`, checked as the CRD checks it.
fn cors(cp: &FieldPath, c: CorsSpec) -> Result<ambit_gateway_routes::Cors, Invalid> {
    use ambit_gateway_routes::{Cors, OriginPattern, DEFAULT_MAX_AGE};
    let list =
        |v: Option<Vec<Text>>, name: &'static str| -> Result<Vec<(usize, String)>, Invalid> {
            let v = v.unwrap_or_default();
            if v.len() > MAX_CORS_ENTRIES {
                return Err(invalid(
                    cp.at(field![name]),
                    format!("at most {MAX_CORS_ENTRIES} entries"),
                ));
            }
            Ok(v.into_iter().map(|t| t.0).enumerate().collect())
        };
    let mut allow_origins = Vec::new();
    for (i, o) in list(c.allow_origins, "allowOrigins")? {
        let pattern =
            OriginPattern::parse(&o).map_err(|m| invalid(cp.at(field!["allowOrigins", i]), m))?;
        allow_origins.push(pattern);
    }
    let mut allow_methods = Vec::new();
    for (i, m) in list(c.allow_methods, "allowMethods")? {
        if !CORS_METHODS.contains(&m.as_str()) {
            return Err(invalid(
                cp.at(field!["allowMethods", i]),
                format!("{m:?} is not one of {}", CORS_METHODS.join(", ")),
            ));
        }
        allow_methods.push(m);
    }
    let names =
        |entries: Vec<(usize, String)>, name: &'static str| -> Result<Vec<String>, Invalid> {
            entries
                .into_iter()
                .map(|(i, h)| {
                    if h == "*" {
                        return Ok(h);
                    }
                    HeaderName::from_bytes(h.as_bytes())
                        .map(|n| n.as_str().to_string())
                        .map_err(|_| {
                            invalid(
                                cp.at(field![name, i]),
                                format!("{h:?} is not a header name"),
                            )
                        })
                })
                .collect()
        };
    let allow_headers = names(list(c.allow_headers, "allowHeaders")?, "allowHeaders")?;
    let expose_headers = names(list(c.expose_headers, "exposeHeaders")?, "exposeHeaders")?;
    let max_age = match c.max_age {
        None => DEFAULT_MAX_AGE,
        Some(v) if (1..=i64::from(i32::MAX)).contains(&v) => v as u32,
        Some(_) => {
            return Err(invalid(
                cp.at(field!["maxAge"]),
                "must be 1 to 2147483647 seconds",
            ))
        }
    };
    Ok(Cors {
        allow_origins,
        allow_credentials: c.allow_credentials.unwrap_or(false),
        allow_methods,
        allow_headers,
        expose_headers,
        max_age,
    })
}
