//! Errors of the local configuration.

use std::fmt;

/// Why a local configuration was refused. The message names the source (a file path or
/// `LOCAL_XDS`), where in it (line and column, or the item), and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The YAML does not parse, or does not fit the schema (unknown field, wrong type,
    /// unknown enum value, bad address text, ...).
    #[error("{}", ParseDisplay(self))]
    Parse {
        /// Where the configuration came from: a file path or `LOCAL_XDS`.
        origin: String,
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// Field path at fault, like `workloads[1].protocol` (empty for the document).
        path: String,
        message: String,
    },
    /// A workload's `authorizationPolicies` entry names a policy the configuration does
    /// not define: the workload would silently run without it. The user's to fix.
    #[error("{0}")]
    UnknownPolicy(Box<UnknownPolicy>),
    /// An item parsed but is not valid (duplicate uid, bad identity, ...).
    #[error("{}", InvalidDisplay(self))]
    Invalid {
        /// Where the configuration came from (empty when built in code).
        origin: String,
        /// 1-based line of the field (or else the item) at fault, when the YAML is known.
        line: Option<usize>,
        /// 1-based column, likewise.
        column: Option<usize>,
        /// The item at fault, like `workloads[0] (uid Kubernetes//v1/Pod/default/a)`.
        item: String,
        message: String,
    },
}

impl ConfigError {
    /// Sets the origin (file path or `LOCAL_XDS`) named in the message.
    pub fn with_origin(mut self, new_origin: &str) -> Self {
        match &mut self {
            ConfigError::Parse { origin, .. } | ConfigError::Invalid { origin, .. } => {
                *origin = new_origin.to_string();
            }
            ConfigError::UnknownPolicy(u) => u.origin = new_origin.to_string(),
        }
        self
    }

    pub(crate) fn invalid(item: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            origin: String::new(),
            line: None,
            column: None,
            item: item.into(),
            message: message.into(),
        }
    }
}

/// Writes `origin: line L, column C: path: ` (the parts that are known).
fn write_place(
    f: &mut fmt::Formatter<'_>,
    origin: &str,
    line: &Option<usize>,
    column: &Option<usize>,
    path: &str,
) -> fmt::Result {
    if !origin.is_empty() {
        write!(f, "{origin}: ")?;
    }
    match (line, column) {
        (Some(l), Some(c)) => write!(f, "line {l}, column {c}: ")?,
        (Some(l), None) => write!(f, "line {l}: ")?,
        _ => {}
    }
    if !path.is_empty() {
        write!(f, "{path}: ")?;
    }
    Ok(())
}

struct ParseDisplay<'a>(&'a ConfigError);

impl fmt::Display for ParseDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let ConfigError::Parse {
            origin,
            line,
            column,
            path,
            message,
        } = self.0
        {
            write_place(f, origin, line, column, path)?;
            f.write_str(message)?;
        }
        Ok(())
    }
}

/// See [`ConfigError::UnknownPolicy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPolicy {
    /// Where the configuration came from: a file path or `LOCAL_XDS`.
    pub origin: String,
    /// 1-based line of the entry, when known.
    pub line: Option<usize>,
    /// 1-based column of the entry, when known.
    pub column: Option<usize>,
    /// The entry, like `workloads[2].authorizationPolicies[0]`.
    pub path: String,
    /// The workload, as `namespace/name`.
    pub workload: String,
    /// The name as written.
    pub policy: String,
    /// A defined policy the user probably meant (same name, or the namespace left out).
    pub suggestion: Option<String>,
}

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_place(f, &self.origin, &self.line, &self.column, &self.path)?;
        write!(
            f,
            "workload {} names policy {:?}, but no entry of `policies` has that \"<namespace>/<name>\", so the workload would run without it; ",
            self.workload, self.policy
        )?;
        match &self.suggestion {
            Some(s) => write!(f, "did you mean {s:?}?"),
            None => f.write_str("define the policy or remove the entry"),
        }
    }
}

struct InvalidDisplay<'a>(&'a ConfigError);

impl fmt::Display for InvalidDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let ConfigError::Invalid {
            origin,
            line,
            column,
            item,
            message,
        } = self.0
        {
            write_place(f, origin, line, column, item)?;
            f.write_str(message)?;
        }
        Ok(())
    }
}
