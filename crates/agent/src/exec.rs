//! Running the network tools (`iptables-restore`, `ipset`, ...) in a network
//! namespace. For a pod, the calling thread switches into the pod's netns just long enough
//! to start the tool, which inherits it (one process per tool, not `nsenter` and then the
//! tool: enrollment runs a dozen of them per pod). Blocking: call from a blocking thread
//! (`spawn_blocking`).

use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use ambit_zds::Netns;

/// A tool that could not be run, or that failed. Always names the netns and the command,
/// and carries the tool's stderr.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The program could not be started (missing binary, or a netns that cannot be
    /// entered).
    #[error("cannot run `{command}` in netns {netns}: {source} (is it installed and on PATH, and the netns there?)")]
    Spawn {
        netns: String,
        command: String,
        #[source]
        source: io::Error,
    },
    /// The program ran and failed.
    #[error("`{command}` in netns {netns} failed ({status}): {stderr}")]
    Failed {
        netns: String,
        command: String,
        status: String,
        stderr: String,
    },
}

impl ExecError {
    /// The tool's stderr (empty for [`ExecError::Spawn`]).
    pub fn stderr(&self) -> &str {
        match self {
            ExecError::Failed { stderr, .. } => stderr,
            ExecError::Spawn { .. } => "",
        }
    }
}

/// How a netns is named in messages: its path, or `host` for the agent's own.
pub fn netns_label(netns: Option<&Path>) -> String {
    match netns {
        Some(p) => p.display().to_string(),
        None => "host (the agent's own)".to_owned(),
    }
}

/// Runs `program args...` in `netns` (the current one when `None`), feeding `stdin`, and
/// returns its stdout. A non-zero exit is an [`ExecError::Failed`].
pub fn run(
    netns: Option<&Path>,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ExecError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let spawn_err = |source| ExecError::Spawn {
        netns: netns_label(netns),
        command: command.clone(),
        source,
    };
    let mut child = match netns {
        Some(path) => Netns::open(path)
            .and_then(|ns| ns.enter(|| cmd.spawn())?)
            .map_err(spawn_err)?,
        None => cmd.spawn().map_err(spawn_err)?,
    };
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // The tools read all of stdin before writing much, so writing first cannot
        // deadlock on our inputs (a few KiB). A write error shows up as a failed exit.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if stderr.is_empty() {
            stderr = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        }
        Err(ExecError::Failed {
            netns: netns_label(netns),
            command,
            status: out.status.to_string(),
            stderr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_stdin_and_failures() {
        assert_eq!(run(None, "cat", &[], Some("hi\n")).unwrap(), "hi\n");
        let err = run(None, "sh", &["-c", "echo oops >&2; exit 3"], None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("oops") && msg.contains("host"), "{msg}");
        assert_eq!(err.stderr(), "oops");
        let err = run(Some(Path::new("/nonexistent/netns")), "true", &[], None).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/netns"), "{err}");
        let err = run(None, "/no/such/tool", &[], None).unwrap_err();
        assert!(matches!(err, ExecError::Spawn { .. }), "{err}");
    }
}
