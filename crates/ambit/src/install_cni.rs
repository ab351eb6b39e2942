//! `install-cni`: the name Istio's istio-cni DaemonSet runs. As that, ambit runs its node
//! agent in Kubernetes mode, configured from the chart's environment, and accepts the flags
//! the chart passes (`--log_output_level`, `--log_as_json`). The installer half (copying
//! the plugin, the CNI config) is not part of this entry yet: `/readyz` does not wait on it.

/// The flags of Istio's `install-cni` command that ambit understands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Flags {
    /// A `tracing` filter from `--log_output_level`.
    pub log_filter: Option<String>,
    /// `--log_as_json`.
    pub log_as_json: bool,
}

/// Istio's level names to `tracing`'s.
fn level(name: &str) -> Option<&'static str> {
    Some(match name {
        "none" => "off",
        "fatal" | "error" => "error",
        "warn" | "warning" => "warn",
        "info" => "info",
        "debug" => "debug",
        _ => return None,
    })
}

/// `--log_output_level=<level>` or `<scope:level,...>`: the `default` (or `all`) scope, or
/// a bare level, sets the level; Istio's other scopes name Go packages ambit does not have,
/// so they are accepted and ignored.
fn parse_levels(value: &str) -> Result<Option<String>, String> {
    let mut global = None;
    for clause in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let (scope, name) = clause.rsplit_once(':').unwrap_or(("default", clause));
        let lvl = level(name).ok_or_else(|| {
            format!(
                "--log_output_level: {name:?} in {clause:?} is not a level (none, error, warn, info, debug)"
            )
        })?;
        if matches!(scope, "default" | "all") {
            global = Some(lvl.to_owned());
        }
    }
    Ok(global)
}

/// Parses the arguments after argv0.
pub fn parse_flags<I: IntoIterator<Item = String>>(args: I) -> Result<Flags, String> {
    let mut flags = Flags::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')).map(str::to_owned).ok_or_else(|| {
            format!("unexpected argument {arg:?}: install-cni takes only flags (--log_output_level, --log_as_json)")
        })?;
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        match name.as_str() {
            "log_output_level" => {
                let v = match value {
                    Some(v) => v,
                    None => args.next().ok_or("--log_output_level needs a value")?,
                };
                flags.log_filter = parse_levels(&v)?;
            }
            "log_as_json" => {
                flags.log_as_json = match value.as_deref() {
                    None | Some("true") => true,
                    Some("false") => false,
                    Some(v) => return Err(format!("--log_as_json={v}: expected true or false")),
                }
            }
            other => {
                return Err(format!(
                    "unknown flag --{other}: install-cni accepts --log_output_level and --log_as_json; \
                     everything else comes from the environment (the istio-cni-config ConfigMap)"
                ))
            }
        }
    }
    Ok(flags)
}

/// The `install-cni` entry: parses the flags, sets up logging and runs the agent in
/// Kubernetes mode until SIGTERM/SIGINT.
pub fn main(args: Vec<String>) -> anyhow::Result<()> {
    let flags = parse_flags(args).map_err(anyhow::Error::msg)?;
    let (_logs, _flush) = crate::logging::init_with(flags.log_filter, Some(flags.log_as_json))
        .map_err(anyhow::Error::msg)?;
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    let install = ambit_agent::install::InstallConfig::from_env(
        &ambit_agent::install::InstallConfig::process_env(),
    )?;
    crate::agent_cli::run_kubernetes(kubeconfig, Some(install))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, String> {
        parse_flags(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn the_charts_flags() {
        assert_eq!(parse(&[]).unwrap(), Flags::default());
        let f = parse(&["--log_output_level=info", "--log_as_json"]).unwrap();
        assert_eq!(f.log_filter.as_deref(), Some("info"));
        assert!(f.log_as_json);
        let f = parse(&["--log_output_level", "default:debug,cni-agent:warn"]).unwrap();
        assert_eq!(f.log_filter.as_deref(), Some("debug"));
        let f = parse(&["--log_output_level=ambient:debug"]).unwrap();
        assert_eq!(f.log_filter, None);
        assert_eq!(
            parse(&["--log_output_level=none"])
                .unwrap()
                .log_filter
                .as_deref(),
            Some("off")
        );
        assert!(!parse(&["--log_as_json=false"]).unwrap().log_as_json);
    }

    #[test]
    fn bad_flags_are_named() {
        for (args, want) in [
            (&["--log_output_level=loud"][..], "\"loud\""),
            (&["--cni-bin-dir=/opt"], "unknown flag --cni-bin-dir"),
            (&["serve"], "unexpected argument \"serve\""),
            (&["--log_output_level"], "needs a value"),
            (&["--log_as_json=yes"], "--log_as_json=yes"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
