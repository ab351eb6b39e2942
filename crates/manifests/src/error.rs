//! Why a document (or a whole file) was refused, and where: the source, the line and
//! column, the field path and what is wrong, shown as
//! `policies.yaml:12:9: spec.rules[0].to[0].operation.methods[1]: "get" is not upper case`.

use std::fmt;

/// A 1-based line and column in a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

/// What kind of refusal, and so who fixes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The file or directory could not be read (missing, unreadable, too large): the
    /// deployment's to fix (the mount, the path given).
    Read,
    /// The document is not YAML (or the file not UTF-8 text): its author's to fix; the
    /// other documents still load.
    Syntax,
    /// The document is YAML but not an object we accept (a missing `kind`, an unknown
    /// field, a value that can never match, a target a waypoint cannot have): its author's
    /// to fix, as Istio would refuse it too; the other documents still load.
    Invalid,
    /// A second object of the same kind, namespace and name: Kubernetes holds one, so
    /// which was meant is unknown; the first one read is kept.
    Duplicate,
}

/// One refusal: a document (or file) that was not loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub kind: ErrorKind,
    /// Where the text came from (a file path, or the name a caller gave it).
    pub source: String,
    /// Where in it, when known (not for a file that could not be read).
    pub position: Option<Position>,
    /// The field at fault, like `spec.rules[0].from[1].source.ipBlocks[0]` (empty: the
    /// document or file as a whole).
    pub field: String,
    pub message: String,
    /// What the refused document says it is, as far as it parses (so that a reader can
    /// tell whose refusal it is, and keep that object's last good version in its place).
    pub object: Option<ObjectRef>,
}

/// What a refused document says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// A non-empty `kind`, when written: a refused HTTPRoute must not be taken for an
    /// AuthorizationPolicy of the same name.
    pub kind: Option<String>,
    /// `namespace/name` from `metadata` (the namespace defaulted), when it names one.
    pub key: Option<String>,
}

impl ObjectRef {
    /// True for a route (HTTPRoute, GRPCRoute): its refusal is the routes' reader's
    /// business. Anything else, a document without a kind included, could be a policy.
    pub fn is_route(&self) -> bool {
        matches!(self.kind.as_deref(), Some("HTTPRoute" | "GRPCRoute"))
    }

    /// True for a RequestAuthentication: not a policy, but its refusal leaves the targets
    /// it would have had without the token checks it names (the reader decides how to
    /// fail closed for them).
    /// True for a DestinationRule: its refusal keeps its last good version, or leaves the
    /// host balanced as without one; never a reason to deny.
    pub fn is_destination_rule(&self) -> bool {
        self.kind.as_deref() == Some("DestinationRule")
    }

    pub fn is_authn(&self) -> bool {
        self.kind.as_deref() == Some("RequestAuthentication")
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)?;
        if let Some(p) = self.position {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ManifestError {}

/// The message of a `yaml_serde` error without the parts we report apart: the position
/// suffix (` at line L column C`) and the field path prefix (`spec.rules[0]: `), which the
/// parser adds to errors raised while reading a value.
pub(crate) fn yaml_message(err: &yaml_serde::Error, path: &str) -> String {
    let mut message = err.to_string();
    if let Some(loc) = err.location() {
        let at = format!(" at line {} column {}", loc.line(), loc.column());
        // At the end of a value's error; after the problem, before its context, in a
        // syntax error's.
        message = match message.strip_suffix(&at) {
            Some(m) => m.to_string(),
            None => message.replacen(&at, "", 1),
        };
    }
    if path.is_empty() {
        return message;
    }
    if let Some((prefix, rest)) = message.split_once(": ") {
        let related = prefix == path || path.starts_with(prefix) || prefix.starts_with(path);
        if !prefix.contains(char::is_whitespace) && related {
            return rest.to_string();
        }
    }
    message
}

/// Rewrites every `line N column M` of a syntax error's message so that the lines count
/// from the start of the file, not of the document (which starts at `first_line`). Only
/// for the parser's own messages: a value's text never reaches them.
pub(crate) fn shift_lines(message: &str, first_line: usize) -> String {
    const LINE: &str = "line ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(LINE) {
        let (before, after) = rest.split_at(at + LINE.len());
        out.push_str(before);
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let shifted = after[..digits]
            .parse::<usize>()
            .ok()
            .filter(|_| after[digits..].starts_with(" column "))
            .map(|n| n + first_line - 1);
        match shifted {
            Some(n) => out.push_str(&n.to_string()),
            None => out.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_source_position_field_and_message() {
        let e = |position, field: &str| ManifestError {
            object: None,
            kind: ErrorKind::Invalid,
            source: "p.yaml".into(),
            position,
            field: field.into(),
            message: "bad".into(),
        };
        let at = Some(Position {
            line: 12,
            column: 9,
        });
        assert_eq!(
            e(at, "spec.action").to_string(),
            "p.yaml:12:9: spec.action: bad"
        );
        assert_eq!(e(at, "").to_string(), "p.yaml:12:9: bad");
        assert_eq!(e(None, "").to_string(), "p.yaml: bad");
    }

    #[test]
    fn syntax_messages_count_lines_from_the_file() {
        assert_eq!(
            shift_lines(
                "did not find expected key, while parsing a block mapping at line 2 column 1",
                10
            ),
            "did not find expected key, while parsing a block mapping at line 11 column 1"
        );
        // Only "line N column M" is a position.
        assert_eq!(
            shift_lines("line 3 of 4, line x", 10),
            "line 3 of 4, line x"
        );
    }
}
