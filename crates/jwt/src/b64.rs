//! base64url (RFC 4648 §5) as JOSE uses it: decoded with or without `=` padding (as
//! Envoy's decoder accepts both), encoded without.

use base64::alphabet::URL_SAFE;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;

const ENGINE: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The bytes `text` encodes, or `None` when it is not base64url.
pub(crate) fn decode(text: &[u8]) -> Option<Vec<u8>> {
    ENGINE.decode(text).ok()
}

/// `bytes` as unpadded base64url.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn encode(bytes: &[u8]) -> String {
    ENGINE.encode(bytes)
}
