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
        route: Located<ambit_gateway_routes::Route>,
        name_at: Position,
    },
    DestinationRule {
        rule: Box<Located<crate::model::WaypointDestinationRule>>,
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
        Ok(document) => document,
        Err(mut e) => {
            e.object = object_named(seg.text, options);
            Document::Refused(*e)
        }
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

/// A document refused, boxed: it is the rare outcome, and large.
type Refusal = Box<ManifestError>;

/// Places a document's refusals in its file: the document's own positions moved by the
/// line it starts at.
struct Placer<'a> {
    source: &'a str,
    seg: Segment<'a>,
    /// The document's last line and its length: the parser places the end of a text that
    /// does not end in a newline on a line of its own after it; we place it at the end of
    /// the last line.
    last_line: usize,
    last_len: usize,
}

impl<'a> Placer<'a> {
    fn new(source: &'a str, seg: Segment<'a>) -> Self {
        let last_line = seg.text.split('\n').count();
        let last_len = seg
            .text
            .rsplit('\n')
            .next()
            .map_or(0, |l| l.chars().count());
        Placer {
            source,
            seg,
            last_line,
            last_len,
        }
    }

    fn shift(&self, line: usize, column: usize) -> Position {
        let (line, column) = match line > self.last_line {
            true => (self.last_line, self.last_len + 1),
            false => (line, column),
        };
        Position {
            line: line + self.seg.first_line - 1,
            column,
        }
    }

    /// Where `path` is in the file, if the document has it.
    fn find(&self, path: &crate::locate::FieldPath) -> Option<Position> {
        locate(self.seg.text, path).map(|p| self.shift(p.line, p.column))
    }

    fn refuse(
        &self,
        kind: ErrorKind,
        position: Option<Position>,
        field: String,
        message: String,
    ) -> Refusal {
        Box::new(ManifestError {
            object: None,
            kind,
            source: self.source.to_string(),
            position: Some(position.unwrap_or(Position {
                line: self.seg.first_line,
                column: 1,
            })),
            field,
            message,
        })
    }

    fn invalid(&self, i: Invalid) -> Refusal {
        let at = self.find(&i.path);
        self.refuse(ErrorKind::Invalid, at, i.path.to_string(), i.message)
    }

    /// A document that does not fit its kind's schema: the parser's message, at the field.
    fn unfit(&self, e: serde_path_to_error::Error<yaml_serde::Error>) -> Refusal {
        let field = match e.path().to_string() {
            p if p == "." => String::new(),
            p => p,
        };
        let inner = e.inner();
        let at = inner.location().map(|l| self.shift(l.line(), l.column()));
        let message = yaml_message(inner, &field);
        self.refuse(ErrorKind::Invalid, at, field, message)
    }

    /// Reads the document as `T`, or refuses it at the field at fault.
    fn deserialize<T: DeserializeOwned>(&self) -> Result<T, Refusal> {
        serde_path_to_error::deserialize(yaml_serde::Deserializer::from_str(self.seg.text))
            .map_err(|e| self.unfit(e))
    }
}

/// The kinds read, by group and kind.
enum Known {
    Policy,
    Authn,
    HttpRoute,
    GrpcRoute,
    DestinationRule,
}

/// Which kind `group`/`kind` is, if one read, with its version checked; `None` for a kind
/// skipped.
fn known(group: &str, version: &str, kind: &str) -> Result<Option<Known>, Invalid> {
    let version_of = |versions: &[&str], message: String| {
        if versions.contains(&version) {
            Ok(())
        } else {
            Err(Invalid {
                path: field!["apiVersion"],
                message,
            })
        }
    };
    let security = |versions: &[&str]| {
        version_of(
            versions,
            format!(
                "{kind} has no version {version:?}; the versions are {}",
                versions.join(", ")
            ),
        )
    };
    let gateway = |versions: &[&str]| {
        version_of(
            versions,
            format!(
                "{kind} is read in versions {} of {GATEWAY_GROUP}, not {version:?}",
                versions.join(", ")
            ),
        )
    };
    Ok(Some(match (group, kind) {
        (SECURITY_GROUP, "AuthorizationPolicy") => {
            security(AUTHORIZATION_POLICY_VERSIONS)?;
            Known::Policy
        }
        (SECURITY_GROUP, "RequestAuthentication") => {
            security(REQUEST_AUTHENTICATION_VERSIONS)?;
            Known::Authn
        }
        (GATEWAY_GROUP, "HTTPRoute") => {
            gateway(HTTP_ROUTE_VERSIONS)?;
            Known::HttpRoute
        }
        (GATEWAY_GROUP, "GRPCRoute") => {
            gateway(GRPC_ROUTE_VERSIONS)?;
            Known::GrpcRoute
        }
        (crate::dr_translate::NETWORKING_GROUP, "DestinationRule") => {
            let versions = crate::dr_translate::DESTINATION_RULE_VERSIONS;
            version_of(
                versions,
                format!(
                    "{kind} has no version {version:?}; the versions are {}",
                    versions.join(", ")
                ),
            )?;
            Known::DestinationRule
        }
        ("", "List") => {
            return Err(Invalid {
                path: field!["kind"],
                message: "a List is not read; write its items as documents separated by ---".into(),
            })
        }
        _ => return Ok(None),
    }))
}

/// What every kind's outcome shares: where the document is, its apiVersion and kind, and
/// where its name is (for a duplicate's refusal).
struct Read {
    origin: Origin,
    api_version: String,
    kind: String,
    name_at: Position,
}

impl Read {
    fn skipped(self, namespace: String, name: String, reason: SkipReason) -> Document {
        Document::Skipped {
            name_at: Some(self.name_at),
            skipped: Located {
                origin: self.origin,
                value: Skipped {
                    api_version: self.api_version,
                    kind: self.kind,
                    namespace: Some(namespace),
                    name: Some(name),
                    reason,
                },
            },
        }
    }

    fn located<T>(&self, value: T) -> Located<T> {
        Located {
            origin: self.origin.clone(),
            value,
        }
    }
}

fn read_document(
    source: &str,
    index: usize,
    seg: Segment<'_>,
    options: &ParseOptions,
) -> Result<Document, Refusal> {
    let at = Placer::new(source, seg);
    // First as any YAML: a syntax error is the parser's own message, its positions moved.
    let value: Value = match yaml_serde::from_str(seg.text) {
        Ok(v) => v,
        Err(e) => {
            let position = e.location().map(|l| at.shift(l.line(), l.column()));
            let message = shift_lines(&yaml_message(&e, ""), seg.first_line);
            return Err(at.refuse(ErrorKind::Syntax, position, String::new(), message));
        }
    };
    let Value::Mapping(map) = &value else {
        if value.is_null() {
            return Ok(Document::Empty);
        }
        return Err(at.invalid(Invalid {
            path: field![],
            message: "a manifest is a map with apiVersion, kind and metadata".into(),
        }));
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
        (Err(e), _) | (_, Err(e)) => return Err(at.invalid(e)),
    };
    let origin = Origin {
        source: source.to_string(),
        document: index,
        line: at.find(&field![]).map_or(seg.first_line, |p| p.line),
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let known = match known(group, version, &kind) {
        Ok(Some(known)) => known,
        Ok(None) => {
            let meta = |key: &str| match map.get("metadata").and_then(|m| m.get(key)) {
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            };
            return Ok(Document::Skipped {
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
            });
        }
        Err(e) => return Err(at.invalid(e)),
    };
    let name_at = at.find(&field!["metadata", "name"]).unwrap_or(Position {
        line: origin.line,
        column: 1,
    });
    let read = Read {
        origin,
        api_version,
        kind,
        name_at,
    };
    match known {
        Known::HttpRoute | Known::GrpcRoute => read_route(&at, map, known, read, options),
        Known::Authn => read_authn(&at, read, options),
        Known::Policy => read_policy(&at, read, options),
        Known::DestinationRule => read_destination_rule(&at, read, options),
    }
}

fn read_route(
    at: &Placer<'_>,
    map: &yaml_serde::Mapping,
    known: Known,
    read: Read,
    options: &ParseOptions,
) -> Result<Document, Refusal> {
    let created = match map.get("metadata").and_then(|m| m.get("creationTimestamp")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(at.invalid(Invalid {
                path: field!["metadata", "creationTimestamp"],
                message: "must be a timestamp like 2024-05-01T12:00:00Z".into(),
            }))
        }
    };
    let translated = match known {
        Known::GrpcRoute => translate_grpc(
            at.deserialize::<RouteObject<GrpcRuleSpec>>()?,
            created,
            options,
        ),
        _ => translate_http(
            at.deserialize::<RouteObject<HttpRuleSpec>>()?,
            created,
            options,
        ),
    };
    let RouteTranslation {
        namespace,
        name,
        outcome,
    } = translated.map_err(|e| at.invalid(e))?;
    Ok(match outcome {
        RouteOutcome::Route(route) => Document::Route {
            route: read.located(route),
            name_at: read.name_at,
        },
        RouteOutcome::Skipped(reason) => read.skipped(namespace, name, reason),
    })
}

fn read_authn(at: &Placer<'_>, read: Read, options: &ParseOptions) -> Result<Document, Refusal> {
    let AuthnTranslation {
        namespace,
        name,
        outcome,
    } = translate_authn(at.deserialize::<AuthnObject>()?, options).map_err(|e| at.invalid(e))?;
    Ok(match outcome {
        AuthnOutcome::Authn(authn) => Document::Authn {
            authn: read.located(authn),
            name_at: read.name_at,
        },
        AuthnOutcome::Skipped(reason) => read.skipped(namespace, name, reason),
    })
}

fn read_policy(at: &Placer<'_>, read: Read, options: &ParseOptions) -> Result<Document, Refusal> {
    let translation = translate(at.deserialize::<Object>()?, options).map_err(|e| at.invalid(e))?;
    Ok(match translation.outcome {
        Outcome::Policy(policy) => Document::Policy {
            policy: read.located(policy),
            name_at: read.name_at,
        },
        Outcome::Skipped(reason) => read.skipped(translation.namespace, translation.name, reason),
    })
}

fn read_destination_rule(
    at: &Placer<'_>,
    read: Read,
    options: &ParseOptions,
) -> Result<Document, Refusal> {
    use crate::dr_translate::{translate_destination_rule, RuleOutcome, RuleTranslation};
    let RuleTranslation {
        namespace,
        name,
        outcome,
    } = translate_destination_rule(
        at.deserialize::<crate::dr_schema::DestinationRuleObject>()?,
        options,
    )
    .map_err(|e| at.invalid(e))?;
    Ok(match outcome {
        RuleOutcome::Rule(rule) => Document::DestinationRule {
            rule: Box::new(read.located(*rule)),
            name_at: read.name_at,
        },
        RuleOutcome::Skipped(reason) => read.skipped(namespace, name, reason),
    })
}
