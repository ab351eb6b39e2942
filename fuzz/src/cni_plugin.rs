//! The `cni_plugin` target: the chained CNI plugin (`ambit_cni::plugin::run`) with an
//! in-memory node agent, plus the agent's request-line parser
//! (`ambit_cni::api::parse_request`).

use std::cell::Cell;
use std::io;

use ambit_cni::api::{self, AgentCallError, AgentRequest, AgentResponse};
use ambit_cni::plugin::{run as run_plugin, Agent, CniEnv};
use serde_json::Value;

struct FakeAgent {
    mode: u8,
    calls: Cell<usize>,
}

impl Agent for FakeAgent {
    fn call(&self, req: &AgentRequest) -> Result<AgentResponse, AgentCallError> {
        self.calls.set(self.calls.get() + 1);
        // What the plugin sends must be something the agent can read back.
        let mut line = serde_json::to_vec(req).expect("AgentRequest serializes");
        line.push(b'\n');
        match api::parse_request(&line) {
            Ok(back) => assert_eq!(&back, req),
            Err(e) => panic!("agent cannot parse the plugin's request: {e}"),
        }
        match self.mode {
            0 => Ok(AgentResponse::ok()),
            1 => Err(AgentCallError::Rejected(
                "pod refused by the fuzz agent".into(),
            )),
            2 => Err(AgentCallError::Unreachable(io::Error::from(
                io::ErrorKind::ConnectionRefused,
            ))),
            _ => Err(AgentCallError::Protocol("not json".into())),
        }
    }
}

const COMMANDS: [&str; 4] = ["ADD", "DEL", "CHECK", "VERSION"];
const ARGS: [&str; 4] = [
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=0b6c6f0e-1111-2222-3333-444455556666",
    "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1",
    "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;AMBIT_EXCLUDE=true",
    "",
];

/// What the invocation came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The plugin's exit code.
    pub exit_code: i32,
    /// How many times it called the agent.
    pub agent_calls: usize,
    /// Whether stdin, read as the agent's request line, parsed.
    pub request_line: bool,
}

/// Byte 0 picks the invocation, the rest is stdin (the network configuration):
/// - bits 0-1: `CNI_COMMAND` = ADD, DEL, CHECK, VERSION;
/// - bits 2-3: the fake agent answers OK, refuses, is unreachable, or answers garbage;
/// - bits 4-5: `CNI_ARGS` = a pod in `default`, a pod in `kube-system`, an opted-out pod,
///   no pod at all;
/// - bit 6: the runtime leaves out `CNI_NETNS` and `CNI_CONTAINERID`.
///
/// Checks: exit code 0 or 1; stdout empty or JSON; an error is a CNI error object; DEL
/// always exits 0 and prints nothing; VERSION never calls the agent; a successful ADD
/// prints a JSON object; an ADD that called a non-confirming agent fails (fail closed);
/// every request the plugin sends parses back on the agent side; the agent's request line
/// parser round-trips what it accepts.
pub fn run(data: &[u8]) -> Option<Outcome> {
    let (&sel, stdin) = data.split_first()?;
    let (exit_code, agent_calls) = plugin(sel, stdin);
    Some(Outcome {
        exit_code,
        agent_calls,
        request_line: agent_request(stdin),
    })
}

fn plugin(sel: u8, stdin: &[u8]) -> (i32, usize) {
    let command = COMMANDS[usize::from(sel & 3)];
    let bare = sel & 0x40 != 0;
    let env = CniEnv {
        command: command.into(),
        container_id: if bare { String::new() } else { "abc123".into() },
        netns: if bare {
            String::new()
        } else {
            "/var/run/netns/cni-1234".into()
        },
        ifname: "eth0".into(),
        args: ARGS[usize::from((sel >> 4) & 3)].into(),
        path: "/opt/cni/bin".into(),
    };
    let agent = FakeAgent {
        mode: (sel >> 2) & 3,
        calls: Cell::new(0),
    };
    let out = run_plugin(&env, stdin, &agent);

    assert!(
        out.exit_code == 0 || out.exit_code == 1,
        "exit code {}",
        out.exit_code
    );
    let json = if out.stdout.is_empty() {
        None
    } else {
        match serde_json::from_str::<Value>(&out.stdout) {
            Ok(v) => Some(v),
            Err(e) => panic!("{command}: stdout is not JSON ({e}): {:?}", out.stdout),
        }
    };
    match command {
        // DEL never fails and prints nothing.
        "DEL" => {
            assert_eq!(out.exit_code, 0);
            assert!(out.stdout.is_empty(), "DEL printed {:?}", out.stdout);
        }
        "VERSION" => {
            assert_eq!(out.exit_code, 0);
            assert!(json.is_some_and(|v| v.get("supportedVersions").is_some()));
            assert_eq!(agent.calls.get(), 0);
        }
        _ => {
            if out.exit_code == 1 {
                // A CNI error object: cniVersion, code, msg.
                let v = json.expect("an error result is printed");
                assert!(v.get("code").is_some_and(Value::is_u64), "{v}");
                assert!(v.get("msg").is_some_and(Value::is_string), "{v}");
                assert!(v.get("cniVersion").is_some_and(Value::is_string), "{v}");
            } else if command == "ADD" {
                // Success passes the previous result on: a JSON object.
                assert!(json.is_some_and(|v| v.is_object()), "{:?}", out.stdout);
            } else {
                assert!(out.stdout.is_empty(), "CHECK printed {:?}", out.stdout);
            }
        }
    }
    // Fail closed: with an agent that does not confirm, an ADD that called it must fail.
    if command == "ADD" && agent.mode != 0 && agent.calls.get() > 0 {
        assert_eq!(out.exit_code, 1, "ADD succeeded without the agent");
    }
    (out.exit_code, agent.calls.get())
}

/// The agent side: one request line; what parses re-encodes to the same request.
fn agent_request(line: &[u8]) -> bool {
    match api::parse_request(line) {
        Ok(req) => {
            let again = serde_json::to_vec(&req).expect("AgentRequest serializes");
            match api::parse_request(&again) {
                Ok(back) => assert_eq!(back, req),
                Err(e) => panic!("re-encoded request refused: {e}"),
            }
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    }
}
