//! What the agent reads from `/proc/<pid>/` when it looks for a pod's netns: the `cgroup`
//! file (which pod a process belongs to) and the `stat` file (its start time), written by
//! processes' own names and the runtime's paths.
//!
//! Input: the file's text (lossily decoded, as a read of a foreign file would be).
#![no_main]

use ambit_agent::k8s::procscan::{pod_uid_from_cgroup, start_time_from_stat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(uid) = pod_uid_from_cgroup(&text) {
        // A UUID (dashes restored) or a static pod's 32-digit hash, and nothing else.
        assert!(uid.len() == 36 || uid.len() == 32, "{uid:?}");
        assert!(
            uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'),
            "{uid:?}"
        );
    }
    let _ = start_time_from_stat(&text);
});
