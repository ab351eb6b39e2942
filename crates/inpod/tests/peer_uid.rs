//! The node proxy's check of the agent it connects to, against a listener really run by
//! another uid (root only: the listener is a child process started as `nobody`).
//!
//! The child is this test binary run again with `CHILD_ENV` set, as uid/gid 65534; it
//! listens, prints `READY_LINE`, and exits when its stdin closes.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ambit_inpod::{PeerPolicy, ZdsListener, ZdsSocket};

const CHILD_ENV: &str = "AMBIT_INPOD_PEER_CHILD_LISTEN";
const READY_LINE: &str = "AMBIT-CHILD-READY";
const NOBODY: u32 = 65534;

/// The child's role; a no-op in a normal test run.
#[test]
fn child_process_role() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = match ZdsListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                // The parent shows this line; exiting closes our stdout so it never waits.
                println!("\nAMBIT-CHILD-ERROR bind {path}: {e}");
                std::process::exit(1);
            }
        };
        println!("\n{READY_LINE}");
        // Hold the listener until the parent closes our stdin.
        tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        })
        .await
        .unwrap();
        drop(listener);
    });
}

/// Kills the child when the test ends, however it ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn listen_as_nobody(path: &Path) -> ChildGuard {
    let exe = std::env::current_exe().unwrap();
    let mut child = ChildGuard(
        Command::new(&exe)
            .args(["--exact", "child_process_role", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, path)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {} as uid 65534: {e}", exe.display())),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("AMBIT-CHILD") {
                let _ = tx.send(line);
                return;
            }
        }
        let _ = tx.send("the child exited without a word".into());
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the child listener (uid 65534) said nothing within 20 s");
    assert_eq!(
        line.trim(),
        READY_LINE,
        "the child listener (uid 65534) did not start; can uid 65534 run {} ?",
        exe.display()
    );
    child
}

#[tokio::test]
async fn an_agent_run_by_another_uid_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "test `an_agent_run_by_another_uid_is_refused` needs root (it starts a listener as \
         uid 65534); run the test suite as root"
    );
    let dir = tempfile::tempdir().unwrap();
    // nobody must reach its own directory inside ours.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let home = dir.path().join("nobody");
    std::fs::create_dir(&home).unwrap();
    nix::unistd::chown(
        &home,
        Some(nix::unistd::Uid::from_raw(NOBODY)),
        Some(nix::unistd::Gid::from_raw(NOBODY)),
    )
    .unwrap();
    let path = home.join("ztunnel.sock");
    let _child = listen_as_nobody(&path);

    let err = ZdsSocket::connect_to_agent(&path, &PeerPolicy::new(None))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("node agent") && msg.contains("uid 65534") && msg.contains("ztunnel.sock"),
        "{msg}"
    );

    // The same listener is fine once its uid is allowed.
    let sock = ZdsSocket::connect_to_agent(&path, &PeerPolicy::new(Some(NOBODY)))
        .await
        .unwrap();
    assert_eq!(sock.peer_credentials().unwrap().uid, NOBODY);
}
