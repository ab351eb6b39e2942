//! What the agent reads from `/proc/<pid>/cgroup` and `stat`. The body, its input layout and
//! its checks: `ambit_fuzz::pod_cgroup::run`, which `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::pod_cgroup::run(data);
});
