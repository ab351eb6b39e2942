//! One document: parsed as YAML, its `apiVersion` and `kind` read, and an
//! AuthorizationPolicy, RequestAuthentication, HTTPRoute or GRPCRoute read and translated;
//! any refusal placed at a line and column of the file (the document's own positions moved
//! by the line it starts at). Sans-IO.

use serde::de::DeserializeOwned;
use yaml_serde::Value;

use crate::authn_schema::AuthnObject;
use crate::authn_translate::{
    translate_authn, AuthnOutcome, AuthnTranslation, REQUEST_AUTHENTICATION_VERSIONS,
};
use crate::error::{shift_lines, yaml_message, ErrorKind, ManifestError, ObjectRef, Position};
use crate::locate::{field, locate};
use crate::model::{Located, Origin, SkipReason, Skipped, WaypointAuthn, WaypointPolicy};
use crate::route_schema::{GrpcRuleSpec, HttpRuleSpec, RouteObject};
use crate::route_translate::{
    translate_grpc, translate_http, RouteOutcome, RouteTranslation, GATEWAY_GROUP,
    GRPC_ROUTE_VERSIONS, HTTP_ROUTE_VERSIONS,
};
use crate::schema::Object;
use crate::split::Segment;
use crate::translate::{translate, Invalid, Outcome};
use crate::ParseOptions;

/// The API group of AuthorizationPolicy and RequestAuthentication, and the versions of
/// AuthorizationPolicy we read.
pub const SECURITY_GROUP: &str = "security.istio.io";
pub const AUTHORIZATION_POLICY_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// What one document came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Document {
    /// Nothing but comments, or `null`.
    Empty,
    Policy {
        policy: Located<WaypointPolicy>,
        /// Where `metadata.name` is, to place a duplicate's refusal.
        name_at: Position,
    },
    Authn {
        authn: Located<WaypointAuthn>,
        name_at: Position,
    },
    Route {
        route: Located<ambit_routes::Route>,
        name_at: Position,
    },
    Skipped {
        skipped: Located<Skipped>,
        /// For an AuthorizationPolicy, RequestAuthentication or route, as for a policy.
        name_at: Option<Position>,
    },
    Refused(ManifestError),
}

/// Reads the document `index` of `source`; a refusal names the object when the document
/// names one.
pub(crate) fn read(
    source: &str,
    index: usize,
    seg: Segment<'_>,
    options: &ParseOptions,
) -> Document {
    match read_document(source, index, seg, options) {
        Document::Refused(mut e) => {
            e.object = object_named(seg.text, options);
            Document::Refused(e)
        }
        other => other,
    }
}

/// The kind and `metadata` name of a document, as far as it parses: each part on its own,
/// so that a route refused for its name is still known to be a route.
fn object_named(text: &str, options: &ParseOptions) -> Option<ObjectRef> {
    let value: Value = yaml_serde::from_str(text).ok()?;
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .map(str::to_string);
    let key = (|| {
        let metadata = value.get("metadata")?;
        let name = metadata.get("name")?.as_str()?;
        let namespace = match metadata.get("namespace") {
            Some(n) => n.as_str()?,
            None => &options.default_namespace,
        };
        Some(format!("{namespace}/{name}"))
    })();
    (kind.is_some() || key.is_some()).then_some(ObjectRef { kind, key })
}

fn read_document(source: &str, index: usize, seg: Segment<'_>, options: &ParseOptions) -> Document {
    // The parser places the end of a text that does not end in a newline on a line of
    // its own after it; we place it at the end of the last line.
    let last_line = seg.text.split('\n').count();
    let last_len = seg
        .text
        .rsplit('\n')
        .next()
        .map_or(0, |l| l.chars().count());
    let shift = |line: usize, column: usize| {
        let (line, column) = match line > last_line {
            true => (last_line, last_len + 1),
            false => (line, column),
        };
        Position {
            line: line + seg.first_line - 1,
            column,
        }
    };
    let refuse = |kind, position: Option<Position>, field: String, message: String| {
        Document::Refused(ManifestError {
            object: None,
            kind,
            source: source.to_string(),
            position: Some(position.unwrap_or(Position {
                line: seg.first_line,
                column: 1,
            })),
            field,
            message,
        })
    };
    let invalid = |i: Invalid| {
        let at = locate(seg.text, &i.path).map(|p| shift(p.line, p.column));
        refuse(ErrorKind::Invalid, at, i.path.to_string(), i.message)
    };

    // A document that does not fit its kind's schema: the parser's message, at the field.
    let refuse_parse = |e: serde_path_to_error::Error<yaml_serde::Error>| {
        let field = match e.path().to_string() {
            p if p == "." => String::new(),
            p => p,
        };
        let inner = e.inner();
        let at = inner.location().map(|l| shift(l.line(), l.column()));
        let message = yaml_message(inner, &field);
        refuse(ErrorKind::Invalid, at, field, message)
    };

    // First as any YAML: a syntax error is the parser's own message, its positions moved.
    let value: Value = match yaml_serde::from_str(seg.text) {
        Ok(v) => v,
        Err(e) => {
            let at = e.location().map(|l| shift(l.line(), l.column()));
            let message = shift_lines(&yaml_message(&e, ""), seg.first_line);
            return refuse(ErrorKind::Syntax, at, String::new(), message);
        }
    };
    let Value::Mapping(map) = &value else {
        if value.is_null() {
            return Document::Empty;
        }
        return invalid(Invalid {
            path: field![],
            message: "a manifest is a map with apiVersion, kind and metadata".into(),
        });
    };
    let text = |key: &str| -> Result<String, Invalid> {
        match map.get(key) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(_) => Err(Invalid {
                path: field![key],
                message: "must be a non-empty string".into(),
            }),
            None => Err(Invalid {
                path: field![key],
                message: "missing; every manifest names its apiVersion and kind".into(),
            }),
        }
    };
    let (api_version, kind) = match (text("apiVersion"), text("kind")) {
        (Ok(a), Ok(k)) => (a, k),
        (Err(e), _) | (_, Err(e)) => return invalid(e),
    };
    let origin = Origin {
        source: source.to_string(),
        document: index,
        line: locate(seg.text, &field![]).map_or(seg.first_line, |p| shift(p.line, p.column).line),
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));

    /// Which route kind the document is, if one.
    enum RouteDoc {
        Http,
        Grpc,
    }
    let mut route_doc = None;
    let mut authn_doc = false;
    match (group, kind.as_str()) {
        (SECURITY_GROUP, "AuthorizationPolicy" | "RequestAuthentication") => {
            let versions = match kind.as_str() {
                "AuthorizationPolicy" => AUTHORIZATION_POLICY_VERSIONS,
                _ => REQUEST_AUTHENTICATION_VERSIONS,
            };
            if !versions.contains(&version) {
                return invalid(Invalid {
                    path: field!["apiVersion"],
                    message: format!(
                        "{kind} has no version {version:?}; the versions are {}",
                        versions.join(", ")
                    ),
                });
            }
            authn_doc = kind == "RequestAuthentication";
        }
        (GATEWAY_GROUP, "HTTPRoute" | "GRPCRoute") => {
            let (versions, doc) = match kind.as_str() {
                "HTTPRoute" => (HTTP_ROUTE_VERSIONS, RouteDoc::Http),
                _ => (GRPC_ROUTE_VERSIONS, RouteDoc::Grpc),
            };
            if !versions.contains(&version) {
                return invalid(Invalid {
                    path: field!["apiVersion"],
                    message: format!(
                        "{kind} is read in versions {} of {GATEWAY_GROUP}, not {version:?}",
                        versions.join(", ")
                    ),
                });
            }
            route_doc = Some(doc);
        }
        ("", "List") => {
            return invalid(Invalid {
                path: field!["kind"],
                message: "a List is not read; write its items as documents separated by ---".into(),
            })
        }
        _ => {
            let meta = |key: &str| match map.get("metadata").and_then(|m| m.get(key)) {
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            };
            return Document::Skipped {
                skipped: Located {
                    origin,
                    value: Skipped {
                        api_version,
                        kind,
                        namespace: meta("namespace"),
                        name: meta("name"),
                        reason: SkipReason::UnsupportedKind,
                    },
                },
                name_at: None,
            };
        }
    }

    let origin_line = origin.line;
    let name_at = || {
        locate(seg.text, &field!["metadata", "name"])
            .map(|p| shift(p.line, p.column))
            .unwrap_or(Position {
                line: origin_line,
                column: 1,
            })
    };

    if let Some(doc) = route_doc {
        let created = match map.get("metadata").and_then(|m| m.get("creationTimestamp")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => {
                return invalid(Invalid {
                    path: field!["metadata", "creationTimestamp"],
                    message: "must be a timestamp like 2024-05-01T12:00:00Z".into(),
                })
            }
        };
        let translated = match doc {
            RouteDoc::Http => match deserialize::<RouteObject<HttpRuleSpec>>(seg.text) {
                Ok(obj) => translate_http(obj, created, options),
                Err(e) => return refuse_parse(e),
            },
            RouteDoc::Grpc => match deserialize::<RouteObject<GrpcRuleSpec>>(seg.text) {
                Ok(obj) => translate_grpc(obj, created, options),
                Err(e) => return refuse_parse(e),
            },
        };
        let RouteTranslation {
            namespace,
            name,
            outcome,
        } = match translated {
            Ok(t) => t,
            Err(e) => return invalid(e),
        };
        return match outcome {
            RouteOutcome::Route(route) => Document::Route {
                name_at: name_at(),
                route: Located {
                    origin,
                    value: route,
                },
            },
            RouteOutcome::Skipped(reason) => Document::Skipped {
                name_at: Some(name_at()),
                skipped: Located {
                    origin,
                    value: Skipped {
                        api_version,
                        kind,
                        namespace: Some(namespace),
                        name: Some(name),
                        reason,
                    },
                },
            },
        };
    }

    if authn_doc {
        let obj = match deserialize::<AuthnObject>(seg.text) {
            Ok(obj) => obj,
            Err(e) => return refuse_parse(e),
        };
        let AuthnTranslation {
            namespace,
            name,
            outcome,
        } = match translate_authn(obj, options) {
            Ok(t) => t,
            Err(e) => return invalid(e),
        };
        return match outcome {
            AuthnOutcome::Authn(authn) => Document::Authn {
                name_at: name_at(),
                authn: Located {
                    origin,
                    value: authn,
                },
            },
            AuthnOutcome::Skipped(reason) => Document::Skipped {
                name_at: Some(name_at()),
                skipped: Located {
                    origin,
                    value: Skipped {
                        api_version,
                        kind,
                        namespace: Some(namespace),
                        name: Some(name),
                        reason,
                    },
                },
            },
        };
    }

    let obj = match deserialize::<Object>(seg.text) {
        Ok(obj) => obj,
        Err(e) => return refuse_parse(e),
    };
    let translation = match translate(obj, options) {
        Ok(t) => t,
        Err(e) => return invalid(e),
    };
    let name_at = name_at();
    match translation.outcome {
        Outcome::Policy(policy) => Document::Policy {
            policy: Located {
                origin,
                value: policy,
            },
            name_at,
        },
        Outcome::Skipped(reason) => Document::Skipped {
            skipped: Located {
                origin,
                value: Skipped {
                    api_version,
                    kind,
                    namespace: Some(translation.namespace),
                    name: Some(translation.name),
                    reason,
                },
            },
            name_at: Some(name_at),
        },
    }
}

/// Reads a document as `T`, keeping the path of the field at fault.
fn deserialize<T: DeserializeOwned>(
    text: &str,
) -> Result<T, serde_path_to_error::Error<yaml_serde::Error>> {
    serde_path_to_error::deserialize(yaml_serde::Deserializer::from_str(text))
}
