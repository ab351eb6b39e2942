//! Sequences of ZDS events (the proxy's datagrams, requests, sends, clock ticks, hang-ups)
//! into the node agent's sans-IO session, `ambit_agent::zds_session::Session`: one message
//! in flight, valid ZDS out, exactly one outcome per request. Input layout:
//! `zds_sequences::agent`.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod zds_sequences;

fuzz_target!(|data: &[u8]| {
    zds_sequences::agent(data);
});
