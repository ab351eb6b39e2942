//! SPIFFE ids (`spiffe://<td>/ns/<ns>/sa/<sa>`), as read from peer certificates, policies
//! and configuration.
//!
//! Input: text; invalid UTF-8 is replaced.
#![no_main]

use ambit_identity::SpiffeId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let id = match SpiffeId::parse(&s) {
        Ok(id) => id,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let shown = id.to_string();
    assert_eq!(
        SpiffeId::parse(&shown).as_ref(),
        Ok(&id),
        "{s:?} via {shown:?}"
    );
    // Byte-exact: no normalisation, so the id displays as the very string it came from.
    assert_eq!(shown, s, "parsing changed the id");
    assert_eq!(
        SpiffeId::new(id.trust_domain(), id.namespace(), id.service_account()).as_ref(),
        Ok(&id)
    );
});
