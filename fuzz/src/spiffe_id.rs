//! The `spiffe_id` target: SPIFFE ids (`spiffe://<td>/ns/<ns>/sa/<sa>`), as read from peer
//! certificates, policies and configuration.

use ambit_identity::SpiffeId;

/// Input: text; invalid UTF-8 is replaced. Returns the id, or the error's variant.
///
/// Checks: `parse(id.to_string()) == id`; byte-exact (the id displays as the very string
/// it came from); `SpiffeId::new(parts) == id`.
pub fn run(data: &[u8]) -> Result<SpiffeId, String> {
    let s = String::from_utf8_lossy(data);
    let id = match SpiffeId::parse(&s) {
        Ok(id) => id,
        Err(e) => {
            let _ = e.to_string();
            return Err(crate::variant(&e));
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
    Ok(id)
}
