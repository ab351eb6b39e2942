//! Why the delta client refuses an xDS resource (or a whole response), whatever its type:
//! the reasons its NACKs carry, as `<resource name>: <reason>`. Every one is the control
//! plane's to fix; the proxy keeps what it had before under that name. A resource type
//! says why it refuses a body with these too ([`crate::ResourceType`]: its shape in
//! [`Rejection::Shape`], its bytes in [`Rejection::Decode`], its fields in
//! [`Rejection::Invalid`]).

use crate::convert::ConvertError;
use crate::shape::ShapeError;
use crate::wire::WireError;

/// One refusal. The Display text is what the NACK says after the resource name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The response has more entries than `Limits::max_per_response`: nothing of it is
    /// applied (named `response` in the NACK).
    #[error("{count} entries (resources, removed names and aliases) in one response, more than the limit of {limit}; nothing applied")]
    ResponseTooLarge { count: usize, limit: usize },
    /// The resources of the response would take an estimated `estimate` bytes once
    /// decoded (see [`crate::held`]), more than `Limits::max_held_per_response`: nothing
    /// of it is applied (named `response`).
    #[error("its resources would take an estimated {estimate} bytes once decoded, more than the limit of {limit} bytes for one response; nothing applied")]
    ResponseOverBudget { estimate: u64, limit: u64 },
    /// Applying the response would take what the proxy holds for its type to an
    /// estimated `estimate` bytes, more than the type's budget (`Limits::max_held_*`):
    /// nothing of it is applied (named `response`). `held` is the estimate before it.
    #[error("the {message} resources held would come to an estimated {estimate} bytes once decoded, over their budget of {budget} bytes (held before this response: {held}); nothing applied")]
    OverBudget {
        message: &'static str,
        estimate: u64,
        budget: u64,
        held: u64,
    },
    #[error("resource name is {len} bytes, more than the limit of {limit}")]
    NameTooLong { len: usize, limit: usize },
    #[error("resource version is {len} bytes, more than the limit of {limit}")]
    VersionTooLong { len: usize, limit: usize },
    #[error("XDS payload without resource")]
    NoPayload,
    /// The payload's `Any` is of another type than the response.
    #[error("payload of type {got:?} in a response of type {want}")]
    WrongType { got: String, want: &'static str },
    /// The payload is not a protobuf message of its type.
    #[error("cannot decode {message}: {error}")]
    Decode {
        message: &'static str,
        error: Undecodable,
    },
    /// The body breaks a limit on its shape (checked before it is decoded).
    #[error("{0}")]
    Shape(ShapeError),
    /// The body decoded, but a field is not valid (the type's conversion says which).
    #[error("{0}")]
    Invalid(#[from] ConvertError),
    /// The body describes another object than the resource name says
    /// ([`crate::Decoded::key`]): a workload named by its uid, a service by
    /// `namespace/hostname`, a policy by `namespace/name`.
    #[error("the body's {what} is {body:?}, not the resource name; refused so that a removal by name always removes what was announced")]
    NameMismatch { what: &'static str, body: String },
    /// A new name when `Limits::max_tracked_per_type` are already held.
    #[error("{limit} resources of this type already held, the limit")]
    TooManyTracked { limit: usize },
}

impl Rejection {
    /// A shape error of a payload of type `message`: malformed bytes read as a decode
    /// error, like `prost`'s own.
    pub fn shape(message: &'static str, e: ShapeError) -> Rejection {
        match e {
            ShapeError::Malformed { field, error } => Rejection::Decode {
                message,
                error: Undecodable::Wire { field, error },
            },
            e => Rejection::Shape(e),
        }
    }

    /// `prost` refused a payload of type `message`.
    pub fn decode(message: &'static str, e: prost::DecodeError) -> Rejection {
        Rejection::Decode {
            message,
            error: Undecodable::Protobuf(e),
        }
    }
}

/// Why a payload's bytes are not a message of its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Undecodable {
    /// The shape walk found them malformed before `prost` saw them, at `field` (a path
    /// in the body, empty for the body itself).
    #[error("{}{error}", crate::shape::at_prefix(field))]
    Wire { field: String, error: WireError },
    /// `prost` refused them.
    #[error("{0}")]
    Protobuf(prost::DecodeError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Limit;
    use ambit_proto::istio::workload as pw;
    use prost::Message;

    /// The texts a NACK carries after the resource name, one per kind of rejection: what
    /// a control plane (and its operator) reads, so they stay as they are.
    #[test]
    fn display_is_the_nack_text() {
        const A: &str = "istio.workload.Address";
        let prost_error = pw::Address::decode(&[0x0a, 0x05, 0x01][..]).unwrap_err();
        let table: Vec<(Rejection, &str)> = vec![
            (
                Rejection::shape(
                    A,
                    ShapeError::Malformed {
                        field: "workload.addresses".into(),
                        error: WireError::BadVarint,
                    },
                ),
                "cannot decode istio.workload.Address: workload.addresses: invalid varint",
            ),
            (
                Rejection::shape(
                    A,
                    ShapeError::Malformed {
                        field: String::new(),
                        error: WireError::Truncated,
                    },
                ),
                "cannot decode istio.workload.Address: a field runs past the end of its message",
            ),
            (
                Rejection::decode(A, prost_error),
                "cannot decode istio.workload.Address: failed to decode Protobuf message: Address.r#type: buffer underflow",
            ),
            (
                Rejection::shape(
                    A,
                    ShapeError::TooMany {
                        field: "addresses".into(),
                        limit: Limit::WorkloadAddresses,
                    },
                ),
                "addresses: more than 64 addresses of one workload (the limit)",
            ),
            (
                Rejection::WrongType {
                    got: "x".into(),
                    want: "type.googleapis.com/istio.workload.Address",
                },
                "payload of type \"x\" in a response of type type.googleapis.com/istio.workload.Address",
            ),
            (Rejection::NoPayload, "XDS payload without resource"),
            (
                Rejection::TooManyTracked { limit: 2 },
                "2 resources of this type already held, the limit",
            ),
        ];
        for (rejection, text) in table {
            assert_eq!(rejection.to_string(), text, "{rejection:?}");
        }
    }
}
