//! The `pod_cgroup` target: what the agent reads from `/proc/<pid>/` when it looks for a
//! pod's netns: the `cgroup` file (which pod a process belongs to) and the `stat` file (its
//! start time), written by processes' own names and the runtime's paths.

use ambit_agent::k8s::procscan::{pod_uid_from_cgroup, start_time_from_stat};

/// What the text came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The pod UID read as a cgroup file.
    pub pod_uid: Option<String>,
    /// The start time read as a stat file.
    pub start_time: Option<u64>,
}

/// Input: the file's text (lossily decoded, as a read of a foreign file would be).
///
/// Checks: a UID found is a 36-character UUID or a 32-digit static-pod hash, of hex digits
/// and dashes only.
pub fn run(data: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(data);
    let pod_uid = pod_uid_from_cgroup(&text);
    if let Some(uid) = &pod_uid {
        assert!(uid.len() == 36 || uid.len() == 32, "{uid:?}");
        assert!(
            uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'),
            "{uid:?}"
        );
    }
    Outcome {
        pod_uid,
        start_time: start_time_from_stat(&text),
    }
}
