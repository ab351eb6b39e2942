//! A network namespace for one test, deleted when dropped.

use std::path::PathBuf;
use std::process::Command;

use crate::{run, Result};

pub struct TestNetns {
    name: String,
}

impl TestNetns {
    /// `ip netns add <prefix>-<pid>-<n>`: unique within the machine while this process lives.
    pub fn new(prefix: &str) -> Result<Self> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        run(
            "ip netns add (needs root)",
            Command::new("ip").args(["netns", "add", &name]),
        )?;
        Ok(TestNetns { name })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's file, for `podman run --network ns:<path>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
