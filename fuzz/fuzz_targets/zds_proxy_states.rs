//! Sequences of ZDS messages (and reconnects, retries, start failures) into the node
//! proxy's state machine, `ambit_inpod::WorkloadStates`, checked against the caller's view
//! of which pod proxies run. Input layout: `zds_sequences::proxy`.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod zds_sequences;

fuzz_target!(|data: &[u8]| {
    zds_sequences::proxy(data);
});
