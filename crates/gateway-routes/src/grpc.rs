//! GRPCRoute's `method` match as a path match on `/<service>/<method>` (how Istio
//! translates it, reference §3.2): service and method exact is an exact path; a service
//! alone, every method of it (a prefix); a method alone, or a regular expression, an
//! expression over the path in which a part left out matches any one segment.

use crate::model::PathMatch;
use crate::pattern::{Pattern, PatternError};

/// How the service and method of a GRPCRoute match compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcMatchType {
    Exact,
    RegularExpression,
}

/// Why a gRPC method match was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrpcMatchError {
    #[error("one or both of service and method must be set")]
    Empty,
    #[error("service {0:?} is not a gRPC service name (letters, digits and '_' in '.'-separated parts, not starting with a digit)")]
    Service(String),
    #[error("method {0:?} is not a gRPC method name (letters, digits and '_', not starting with a digit)")]
    Method(String),
    #[error("{0}")]
    Pattern(#[from] PatternError),
}

fn ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`, the CRD's check of an exact service.
fn service_name(s: &str) -> bool {
    let s = s.strip_prefix('.').unwrap_or(s);
    !s.is_empty() && s.split('.').all(ident)
}

/// The path match of a gRPC method match; `service` and `method` empty count as left out.
pub fn grpc_path_match(
    kind: GrpcMatchType,
    service: Option<&str>,
    method: Option<&str>,
) -> Result<PathMatch, GrpcMatchError> {
    let service = service.filter(|s| !s.is_empty());
    let method = method.filter(|s| !s.is_empty());
    match kind {
        GrpcMatchType::Exact => {
            if let Some(s) = service.filter(|s| !service_name(s)) {
                return Err(GrpcMatchError::Service(s.to_string()));
            }
            if let Some(m) = method.filter(|m| !ident(m)) {
                return Err(GrpcMatchError::Method(m.to_string()));
            }
            match (service, method) {
                (None, None) => Err(GrpcMatchError::Empty),
                (Some(s), Some(m)) => Ok(PathMatch::Exact(format!("/{s}/{m}"))),
                (Some(s), None) => Ok(PathMatch::prefix(&format!("/{s}"))),
                (None, Some(m)) => Ok(PathMatch::Regex(Pattern::new(&format!(
                    "/[^/]+/{}",
                    regex::escape(m)
                ))?)),
            }
        }
        GrpcMatchType::RegularExpression => {
            if service.is_none() && method.is_none() {
                return Err(GrpcMatchError::Empty);
            }
            // Each part is checked alone first, so an error names the part at fault and
            // neither can reach across the '/' (an alternation stays in its group).
            for part in [service, method].into_iter().flatten() {
                Pattern::new(part)?;
            }
            let part = |p: Option<&str>| p.map_or("[^/]+".to_string(), |p| format!("(?:{p})"));
            Ok(PathMatch::Regex(Pattern::new(&format!(
                "/{}/{}",
                part(service),
                part(method)
            ))?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::prefix_matches;

    fn matches(m: &PathMatch, path: &str) -> bool {
        match m {
            PathMatch::Exact(p) => p == path,
            PathMatch::Prefix(p) => prefix_matches(p, path),
            PathMatch::Regex(r) => r.is_match(path),
        }
    }

    #[test]
    fn exact_matches_become_paths() {
        use GrpcMatchType::*;
        let both = grpc_path_match(Exact, Some("foo.Bar"), Some("Get")).unwrap();
        assert_eq!(both, PathMatch::Exact("/foo.Bar/Get".into()));
        let service = grpc_path_match(Exact, Some("foo.Bar"), None).unwrap();
        assert_eq!(service, PathMatch::Prefix("/foo.Bar".into()));
        assert!(matches(&service, "/foo.Bar/Get") && matches(&service, "/foo.Bar/Put"));
        assert!(!matches(&service, "/foo.BarBaz/Get"));
        let method = grpc_path_match(Exact, None, Some("Get")).unwrap();
        assert!(matches(&method, "/foo.Bar/Get") && matches(&method, "/x/Get"));
        assert!(!matches(&method, "/foo.Bar/GetAll") && !matches(&method, "/a/b/Get"));
        // The empty string is as left out.
        assert_eq!(
            grpc_path_match(Exact, Some(""), Some("")),
            Err(GrpcMatchError::Empty)
        );
        assert_eq!(
            grpc_path_match(Exact, Some("foo.Bar"), Some("")),
            Ok(PathMatch::Prefix("/foo.Bar".into()))
        );
    }

    #[test]
    fn exact_names_are_checked_as_the_crd_does() {
        use GrpcMatchType::*;
        assert!(grpc_path_match(Exact, Some(".grpc.health.v1.Health"), None).is_ok());
        assert!(grpc_path_match(Exact, Some("_a.B_2"), Some("_x9")).is_ok());
        for bad in ["foo/bar", "1foo", "foo..bar", "foo.", "foo bar", "."] {
            assert_eq!(
                grpc_path_match(Exact, Some(bad), None),
                Err(GrpcMatchError::Service(bad.into())),
                "{bad}"
            );
        }
        for bad in ["Get/All", "1Get", "a.b"] {
            assert_eq!(
                grpc_path_match(Exact, None, Some(bad)),
                Err(GrpcMatchError::Method(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn regular_expressions_match_their_segment_only() {
        use GrpcMatchType::*;
        let m = grpc_path_match(RegularExpression, Some(r"foo\..*"), Some("Get|Put")).unwrap();
        assert!(matches(&m, "/foo.Bar/Get") && matches(&m, "/foo.Baz/Put"));
        assert!(!matches(&m, "/bar.Foo/Get") && !matches(&m, "/foo.Bar/Delete"));
        let m = grpc_path_match(RegularExpression, None, Some("Get.*")).unwrap();
        assert!(matches(&m, "/any.Svc/GetAll"));
        assert!(!matches(&m, "/any.Svc/List"));
        assert!(matches!(
            grpc_path_match(RegularExpression, Some("(["), None),
            Err(GrpcMatchError::Pattern(_))
        ));
    }
}
