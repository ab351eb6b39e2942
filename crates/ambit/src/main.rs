//! `ambit`: an ambient-mesh data plane, wire-compatible with Istio's ambient mode.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// glibc's allocator hands large buffers back to the kernel and faults them in again on
/// every reuse (a quarter of the proxy's CPU under bulk transfer). jemalloc keeps them, and
/// gives freed memory back as it decays (purged during later allocations and frees; there
/// is no background thread): with mimalloc, our allocator before, the receiving proxy's
/// peak RSS under four streams was 50-72 MiB against jemalloc's (and Istio's ztunnel's)
/// ~31 MiB, for the same CPU per GB (BENCHMARKS.md, "Beside Istio's ztunnel").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Returns every jemalloc arena's unused dirty pages to the system: what the process calls
/// once a whole mesh was decoded ([`ambit_runtime::memory`]).
#[allow(unsafe_code)]
fn purge_jemalloc() -> bool {
    // `MALLCTL_ARENAS_ALL` (4096) names every arena; "purge" reads and writes nothing.
    const PURGE_ALL: &std::ffi::CStr = c"arena.4096.purge";
    // SAFETY: a NUL-terminated name, and null pointers with zero lengths, which is how
    // mallctl takes an operation without arguments; jemalloc is this process's allocator.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0
}

use ambit::{agent_cli, control_cli};
use ambit_runtime::version;

#[derive(Parser)]
#[command(
    name = "ambit",
    version = version::VERSION,
    about = "Ambient-mesh data plane, wire-compatible with Istio's ztunnel",
    long_about = "ambit carries pod traffic between nodes in HBONE (mutual TLS + HTTP/2 CONNECT on \
                  port 15008), authorizes it on SPIFFE identities and reports Istio's metrics. \
                  It is configured with ztunnel's environment variables."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node proxy (ztunnel's replacement). Configured from the environment:
    /// PROXY_MODE, PROXY_WORKLOAD_INFO, LOCAL_XDS_PATH or LOCAL_XDS, PACKET_MARK,
    /// TRUST_DOMAIN, LOCAL_CA_DIR, HTTP2_*, POOL_*, ... (see README).
    Ztunnel,
    /// Run the L7 waypoint (HBONE in and out, AuthorizationPolicy at L7, per-request
    /// balancing, Istio's request metrics). Configured from the environment:
    /// POD_NAMESPACE, POD_NAME, SERVICE_ACCOUNT, GATEWAY_NAME, TRUST_DOMAIN, XDS_ADDRESS or
    /// LOCAL_XDS_PATH, CA_ADDRESS or LOCAL_CA_DIR, AMBIT_WAYPOINT_CONFIG, ... (see README).
    Waypoint,
    /// Istio's proxy command line: `proxy ztunnel` is `ambit ztunnel`, `proxy waypoint` is
    /// `ambit waypoint`.
    Proxy {
        /// The kind of proxy.
        #[arg(value_parser = ["ztunnel", "waypoint"], default_value = "ztunnel")]
        kind: String,
        /// pilot-agent's flags as Istio's templates pass them (`--domain`,
        /// `--serviceCluster`, `--proxyLogLevel`, ...): accepted and ignored, since ambit is
        /// configured from the environment.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        ignored: Vec<String>,
    },
    /// Build a two-node mesh in network namespaces on this machine, send real traffic
    /// through it and report what happened. Needs root, and a binary built with the `demo`
    /// feature (./scripts/demo builds one).
    #[cfg(feature = "demo")]
    Demo(ambit_demo::DemoArgs),
    /// (Not in this build: it was built without the `demo` feature. ./scripts/demo, or
    /// `cargo build -p ambit --features demo`, builds a binary with the demo.)
    #[cfg(not(feature = "demo"))]
    Demo,
    /// Run the node agent (enrolls pods into capture and hands their network namespaces to
    /// the node proxy over ZDS), or talk to a running one: `enroll`, `remove`, `list`.
    Agent(Box<agent_cli::AgentArgs>),
    /// Run a small control server: delta xDS (workloads, services, policies from YAML
    /// files) and Istio's CA (CreateCertificate) on one TLS port, for meshes without
    /// Kubernetes. Operator endpoints on --admin: /metrics, /ready, /debug.
    Control(Box<control_cli::ControlArgs>),
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    ambit_runtime::memory::set_release(purge_jemalloc);
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    let asks_help = || {
        std::env::args_os()
            .skip(1)
            .any(|a| a == "-h" || a == "--help")
    };
    // Container runtimes call CNI plugins by file name: as `ambit-cni`, or as `istio-cni`
    // (the name the installer gives it on Kubernetes), be the plugin. A runtime passes no
    // arguments and sets CNI_COMMAND; by hand, `--help` says what the plugin is.
    if name == "ambit-cni" || name == "istio-cni" {
        if std::env::var_os("CNI_COMMAND").is_none_or(|c| c.is_empty()) && asks_help() {
            print!("{}", ambit_cni::entry::usage(&name));
            return ExitCode::SUCCESS;
        }
        let code = ambit_cni::entry::main_with_process_env();
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // As Istio's istio-cni DaemonSet runs it: the node agent in Kubernetes mode.
    if name == "install-cni" {
        let args = std::env::args().skip(1).collect();
        return match ambit::install_cni::main(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("install-cni: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Installed as `ztunnel` (an image that replaces ztunnel's binary), no argument runs
    // the node proxy, as it does for ztunnel.
    let as_ztunnel = name == "ztunnel";
    if as_ztunnel && std::env::args_os().len() == 1 {
        return ambit_nodeproxy_process::main();
    }
    // Installed as `waypoint`: no argument runs the waypoint.
    if name == "waypoint" && std::env::args_os().len() == 1 {
        return ambit_waypoint::main();
    }
    let mut command = Cli::command();
    if as_ztunnel {
        command = command.override_usage(
            "ztunnel            (no argument: run the node proxy, as ztunnel does)\n       \
             ztunnel <COMMAND>",
        );
    }
    if name == "waypoint" {
        command = command.override_usage(
            "waypoint           (no argument: run the waypoint)\n       \
             waypoint <COMMAND>",
        );
    }
    let matches = command.get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Version => {
            // ztunnel's layout, so scripts that read `ztunnel version` read ours.
            println!("{}", version::line());
            ExitCode::SUCCESS
        }
        Command::Waypoint => ambit_waypoint::main(),
        Command::Proxy { kind, .. } if kind == "waypoint" => ambit_waypoint::main(),
        Command::Ztunnel | Command::Proxy { .. } => ambit_nodeproxy_process::main(),
        Command::Agent(args) => match agent_cli::run(*args, matches.subcommand_matches("agent")) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ambit agent: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Control(args) => match control_cli::run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ambit control: {e:#}");
                ExitCode::FAILURE
            }
        },
        #[cfg(feature = "demo")]
        Command::Demo(args) => match ambit_demo::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ambit demo: {e:#}");
                ExitCode::FAILURE
            }
        },
        #[cfg(not(feature = "demo"))]
        Command::Demo => {
            eprintln!(
                "ambit demo: this binary was built without the demo (a node binary carries no \
                 lab); run ./scripts/demo, or build with `cargo build -p ambit --features demo`"
            );
            ExitCode::from(2)
        }
    }
}
