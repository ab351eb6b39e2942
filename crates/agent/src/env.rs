//! What the Kubernetes-mode agent and the installer share in reading istio-cni's
//! environment: the error that names the variable, and Go's boolean syntax (Istio's
//! settings are read by Go's `strconv.ParseBool`, so `1`, `t` and `True` are true too).

/// A variable that does not parse: names it and says what it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {name}={value:?}: {problem}")]
pub struct ConfigError {
    pub name: &'static str,
    pub value: String,
    pub problem: String,
}

pub(crate) fn err(name: &'static str, value: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        name,
        value: value.to_owned(),
        problem: problem.into(),
    }
}

/// Go's `strconv.ParseBool` (surrounding blanks ignored).
pub(crate) fn parse_bool(name: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(err(
            name,
            value,
            "expected true or false (Go's syntax: 1, t, true, 0, f, false, ...)",
        )),
    }
}
