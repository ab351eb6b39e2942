//! The process `ambit-cni` (the `ambit` binary run under that name): reads the `CNI_*`
//! environment and stdin, hands them to the mode the configuration asks for (Istio's
//! `istio-cni`, [`crate::kube_mode`], or ambit's own, [`crate::plugin`]), and writes the
//! outcome to stdout. Nothing else here touches the process.

use std::io::{Read, Write};

use crate::api::DEFAULT_AGENT_SOCKET;
use crate::plugin::{
    agent_socket_of, best_effort_version, codes, run, CniEnv, CniError, Outcome, SocketAgent,
    IMPLEMENTED_VERSION, MAX_STDIN_BYTES,
};

/// What the plugin says when a person runs it as `name` with `--help` (no `CNI_COMMAND`):
/// runtimes run it, not people.
pub fn usage(name: &str) -> String {
    format!(
        "{name}: a chained CNI plugin (CNI spec {IMPLEMENTED_VERSION}); container runtimes run it, \
         not people.

Usage: CNI_COMMAND=ADD|DEL|CHECK|VERSION CNI_CONTAINERID=<id> CNI_NETNS=<path> \
CNI_IFNAME=<if> CNI_ARGS=<K8S_POD_NAMESPACE=..;K8S_POD_NAME=..> {name} < <network config>

It reads the network configuration (with the previous plugin's result) on stdin and
prints its result, or a CNI error, on stdout. ADD returns only once the node agent has
captured the pod, so a pod never starts uncaptured.

  \"type\": \"istio-cni\"  Istio's plugin: asks the node agent in Kubernetes mode, over
                       <cni_agent_run_dir>/pluginevent.sock, to capture ambient pods.
  otherwise            ambit's own plugin: calls the node agent's events socket
                       (\"agent_socket\", default {DEFAULT_AGENT_SOCKET}).

Options:
  -h, --help  Print this help (only without CNI_COMMAND)
"
    )
}

/// The process entry point used when the `ambit` binary runs as `ambit-cni`: reads the
/// `CNI_*` environment and stdin, talks to the agent at the config's `agent_socket`
/// (or [`DEFAULT_AGENT_SOCKET`]), writes the result to stdout and returns the exit code.
pub fn main_with_process_env() -> i32 {
    let env = CniEnv::from_process_env();
    let stdin = match read_stdin() {
        Ok(b) => b,
        // VERSION needs nothing from stdin, and DEL must not fail.
        Err(_) if env.command == "VERSION" || env.command == "DEL" => Vec::new(),
        Err(e) => return emit(&e.outcome(IMPLEMENTED_VERSION)),
    };
    if crate::kube_mode::is_istio_conf(&stdin) {
        let outcome = std::panic::catch_unwind(|| crate::kube_mode::main(&env, &stdin))
            .unwrap_or_else(|_| panicked(&env, &stdin));
        return emit(&outcome);
    }
    let agent = SocketAgent::new(agent_socket_of(&stdin));
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&env, &stdin, &agent)))
            .unwrap_or_else(|_| panicked(&env, &stdin));
    emit(&outcome)
}

fn panicked(env: &CniEnv, stdin: &[u8]) -> Outcome {
    if env.command == "DEL" {
        Outcome::success(String::new())
    } else {
        CniError::new(codes::INTERNAL, "ambit-cni hit an internal error (panic)")
            .details("this is a bug in ambit-cni; please report it with the network configuration")
            .outcome(&best_effort_version(stdin))
    }
}

fn read_stdin() -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_STDIN_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| CniError::new(codes::IO_FAILURE, format!("cannot read stdin: {e}")))?;
    if buf.len() > MAX_STDIN_BYTES {
        return Err(CniError::new(
            codes::IO_FAILURE,
            format!(
                "stdin is larger than {MAX_STDIN_BYTES} bytes; that is not a network configuration"
            ),
        ));
    }
    Ok(buf)
}

fn emit(outcome: &Outcome) -> i32 {
    let mut out = std::io::stdout().lock();
    // Nothing useful to do if the runtime closed our stdout.
    let _ = out.write_all(outcome.stdout.as_bytes());
    let _ = out.flush();
    outcome.exit_code
}
