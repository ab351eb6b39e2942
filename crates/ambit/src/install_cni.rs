//! `install-cni`: the name Istio's istio-cni DaemonSet runs. As that, ambit runs its node
//! agent in Kubernetes mode, configured from the chart's environment, and accepts the flags
//! the chart passes (`--log_output_level`, `--log_as_json`). The installer half (copying
//! the plugin, the CNI config) runs beside the agent: `/readyz` waits on it. `-h`/`--help`
//! prints the usage.

/// The flags of Istio's `install-cni` command that ambit understands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Flags {
    /// A `tracing` filter from `--log_output_level`.
    pub log_filter: Option<String>,
    /// `--log_as_json`.
    pub log_as_json: bool,
    /// `-h`, `--help` (also Go's `-help`): print [`USAGE`] and exit.
    pub help: bool,
}

/// What `install-cni --help` prints.
pub const USAGE: &str = "\
install-cni: ambit's node agent in Kubernetes mode, with the CNI plugin's installer beside
it, as Istio's istio-cni DaemonSet runs it.

Usage: install-cni [--log_output_level <level>|<scope:level,...>] [--log_as_json[=true|false]]

Everything else comes from the environment (the istio-cni-config ConfigMap and the
DaemonSet's env): AMBIENT_ENABLED, AMBIENT_ENABLEMENT_SELECTOR, NODE_NAME,
CNI_AGENT_RUN_DIR, ZTUNNEL_UDS_ADDRESS, AMBIENT_DNS_CAPTURE, AMBIENT_IPV6,
MOUNTED_CNI_NET_DIR, CNI_CONF_NAME, CHAINED_CNI_PLUGIN, KUBECONFIG_MODE, ... (see the
README); ambit's own: AMBIT_CNI_PLUGIN_UID and AMBIT_ZDS_PROXY_UID (the uids the CNI
plugin and the node proxy run as, when not root).

Options:
  --log_output_level <level>  none, error, warn, info or debug, or scope:level pairs
                              (the default scope sets the level; Istio's other scopes
                              are accepted and ignored)
  --log_as_json[=<bool>]      log JSON lines
  -h, --help                  print this help
";

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
        let flag = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .ok_or_else(|| {
                format!(
                    "unexpected argument {arg:?}: install-cni takes only flags \
                     (--log_output_level, --log_as_json; --help)"
                )
            })?;
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (flag.to_owned(), None),
        };
        match name.as_str() {
            "h" | "help" if value.is_none() => flags.help = true,
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
            _ => {
                return Err(format!(
                "unknown flag {arg:?}: install-cni accepts --log_output_level and --log_as_json \
                     (--help for the usage); everything else comes from the environment (the \
                     istio-cni-config ConfigMap)"
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
    if flags.help {
        print!("{USAGE}");
        return Ok(());
    }
    let (_logs, _flush) =
        ambit_runtime::logging::init_with(flags.log_filter, Some(flags.log_as_json))
            .map_err(anyhow::Error::msg)?;
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    let install = ambit_agent::install::InstallConfig::from_env(
        &ambit_agent::install::InstallConfig::process_env(),
    )?;
    crate::agent_cli::run_kubernetes(kubeconfig, Some(install), Default::default())
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
        for help in ["-h", "--help", "-help"] {
            assert!(parse(&[help]).unwrap().help, "{help}");
        }
        assert!(parse(&["--log_as_json", "-h"]).unwrap().help);
    }

    #[test]
    fn bad_flags_are_named() {
        for (args, want) in [
            (&["--log_output_level=loud"][..], "\"loud\""),
            (
                &["--cni-bin-dir=/opt"],
                "unknown flag \"--cni-bin-dir=/opt\"",
            ),
            (&["-x"], "unknown flag \"-x\""),
            (&["--help=yes"], "unknown flag \"--help=yes\""),
            (&["serve"], "unexpected argument \"serve\""),
            (&["--log_output_level"], "needs a value"),
            (&["--log_as_json=yes"], "--log_as_json=yes"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
