//! A resource type of the tests only, beside the node proxy's two: a `Widget` (a name
//! and its parts) into a store of its own, with a shape limit on its parts checked on
//! the encoded bytes, an estimate, a check once decoded, and a readiness of its choice.
//! It uses only what a type in another crate can (`ambit_xds`'s public items), so the
//! tests that subscribe to it show that a type needs no change to the client.

use std::collections::BTreeMap;

use prost::Message;

use crate::reject::Rejection;
use crate::resource::{message_name, Decoded, Measured, Readiness, ResourceType, Slot};
use crate::shape::{Limit, ShapeError};
use crate::wire::{self, Value};
use crate::ConvertError;

pub(crate) const WIDGET_TYPE: &str = "type.googleapis.com/ambit.test.Widget";

/// The resource: a name and its parts.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Widget {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "2")]
    pub parts: Vec<String>,
}

pub(crate) fn widget(name: &str, parts: &[&str]) -> Widget {
    Widget {
        name: name.into(),
        parts: parts.iter().map(|p| p.to_string()).collect(),
    }
}

/// The subscription: at most `max_parts` parts a widget, `budget` estimated bytes held.
pub(crate) struct Widgets {
    pub budget: u64,
    pub max_parts: usize,
    pub readiness: Readiness,
}

/// What a widget of `parts` parts holds, as [`Widgets`] estimates it (its tracking by
/// the client aside).
pub(crate) fn widget_estimate(parts: usize) -> u64 {
    100 * (1 + parts as u64)
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WidgetOp {
    Put(Widget),
    Remove(String),
}

/// The widgets' own store: name → parts.
pub(crate) type WidgetStore = BTreeMap<String, Vec<String>>;

impl ResourceType for Widgets {
    const TYPE_URL: &'static str = WIDGET_TYPE;
    type Op = WidgetOp;
    type Store = WidgetStore;

    fn budget(&self) -> u64 {
        self.budget
    }

    /// Counts the parts on the bytes, refusing a widget of too many before it is decoded.
    fn measure(&self, _name: &str, body: &[u8]) -> Result<Measured, Rejection> {
        let message = message_name(Self::TYPE_URL);
        let mut parts = 0;
        for field in wire::fields(body) {
            let (number, value) = field.map_err(|error| {
                Rejection::shape(
                    message,
                    ShapeError::Malformed {
                        field: String::new(),
                        error,
                    },
                )
            })?;
            if let (2, Value::Len(_)) = (number, value) {
                parts += 1;
                if parts > self.max_parts {
                    let limit = Limit::Other {
                        max: self.max_parts,
                        what: "parts of one widget",
                    };
                    let e = ShapeError::TooMany {
                        field: "parts".into(),
                        limit,
                    };
                    return Err(Rejection::shape(message, e));
                }
            }
        }
        Ok(Measured {
            estimate: widget_estimate(parts),
            slot: Slot::First,
        })
    }

    fn decode(&self, body: &[u8]) -> Result<Decoded<WidgetOp>, Rejection> {
        let w =
            Widget::decode(body).map_err(|e| Rejection::decode(message_name(Self::TYPE_URL), e))?;
        if let Some(i) = w.parts.iter().position(|p| p.is_empty()) {
            return Err(ConvertError::new(format!("parts[{i}]"), "must be non-empty").into());
        }
        Ok(Decoded {
            key: w.name.clone(),
            what: "widget name",
            op: WidgetOp::Put(w),
        })
    }

    fn removal(&self, name: String) -> WidgetOp {
        WidgetOp::Remove(name)
    }

    fn apply(ops: Vec<WidgetOp>, store: &mut WidgetStore) {
        for op in ops {
            match op {
                WidgetOp::Put(w) => {
                    store.insert(w.name, w.parts);
                }
                WidgetOp::Remove(name) => {
                    store.remove(&name);
                }
            }
        }
    }

    fn readiness(&self) -> Readiness {
        self.readiness
    }
}
