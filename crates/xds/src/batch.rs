//! The changes one response makes to its type's store: a [`TypedBatch`] of the type's
//! ops, handed out of the client as a [`Batch`] (the client serves several types, each
//! with its own ops and store). A process takes a batch back as the typed batch of its
//! type ([`Batch::downcast`]) and applies it to that type's store, or tries a store
//! ([`Batch::try_apply`]); the node proxy, whose two types share one store, applies every
//! batch to it ([`Batch::apply`]).

use std::any::Any;
use std::fmt;

use ambit_state::ProxyState;

use crate::resource::ResourceType;

/// The changes of one response of type `T`, to apply to its store at once, in order.
pub struct TypedBatch<T: ResourceType> {
    pub ops: Vec<T::Op>,
}

impl<T: ResourceType> TypedBatch<T> {
    /// Applies the changes ([`ResourceType::apply`]).
    pub fn apply(self, store: &mut T::Store) {
        T::apply(self.ops, store);
    }
}

impl<T: ResourceType> Default for TypedBatch<T> {
    fn default() -> Self {
        TypedBatch { ops: Vec::new() }
    }
}

impl<T: ResourceType> Clone for TypedBatch<T> {
    fn clone(&self) -> Self {
        TypedBatch {
            ops: self.ops.clone(),
        }
    }
}

impl<T: ResourceType> PartialEq for TypedBatch<T> {
    fn eq(&self, other: &Self) -> bool {
        self.ops == other.ops
    }
}

impl<T: ResourceType> fmt::Debug for TypedBatch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedBatch")
            .field("type_url", &T::TYPE_URL)
            .field("ops", &self.ops)
            .finish()
    }
}

/// A [`TypedBatch`] of any type.
trait Ops: Send + fmt::Debug {
    fn type_url(&self) -> &'static str;
    fn len(&self) -> usize;
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
    fn clone_box(&self) -> Box<dyn Ops>;
    fn same(&self, other: &dyn Ops) -> bool;
    /// Applies the changes if `store` is the type's store; else gives them back.
    fn apply_to(self: Box<Self>, store: &mut dyn Any) -> Result<(), Box<dyn Ops>>;
}

impl<T: ResourceType> Ops for TypedBatch<T> {
    fn type_url(&self) -> &'static str {
        T::TYPE_URL
    }
    fn len(&self) -> usize {
        self.ops.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
    fn clone_box(&self) -> Box<dyn Ops> {
        Box::new(self.clone())
    }
    fn same(&self, other: &dyn Ops) -> bool {
        other.as_any().downcast_ref::<Self>() == Some(self)
    }
    fn apply_to(self: Box<Self>, store: &mut dyn Any) -> Result<(), Box<dyn Ops>> {
        match store.downcast_mut::<T::Store>() {
            Some(store) => {
                self.apply(store);
                Ok(())
            }
            None => Err(self),
        }
    }
}

/// The changes of one response, of whichever type it was. An empty batch (a response
/// that changes nothing, or one refused whole) is of no type in particular: it applies
/// to any store and reads as an empty batch of any type.
#[derive(Default)]
pub struct Batch {
    ops: Option<Box<dyn Ops>>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.ops.is_none()
    }

    /// The number of changes.
    pub fn len(&self) -> usize {
        self.ops.as_ref().map_or(0, |o| o.len())
    }

    /// The type URL of the changes, `None` for an empty batch.
    pub fn type_url(&self) -> Option<&'static str> {
        self.ops.as_ref().map(|o| o.type_url())
    }

    /// The changes, if they are of type `T` (an empty batch is of every type).
    pub fn ops<T: ResourceType>(&self) -> Option<&[T::Op]> {
        match &self.ops {
            None => Some(&[]),
            Some(o) => o
                .as_any()
                .downcast_ref::<TypedBatch<T>>()
                .map(|b| b.ops.as_slice()),
        }
    }

    /// The typed batch, if it is of type `T`; else the batch back.
    pub fn downcast<T: ResourceType>(self) -> Result<TypedBatch<T>, Batch> {
        match self.ops {
            None => Ok(TypedBatch::default()),
            Some(o) if o.as_any().is::<TypedBatch<T>>() => Ok(*o
                .into_any()
                .downcast::<TypedBatch<T>>()
                .expect("checked just above")),
            Some(o) => Err(Batch { ops: Some(o) }),
        }
    }

    /// Applies the changes to `store` if it is their type's store; else gives the batch
    /// back (for a process whose types keep their resources in different stores). Pass
    /// the store itself (`&mut *guard`, not `&mut guard`): its type is what is matched.
    pub fn try_apply<S: Any>(self, store: &mut S) -> Result<(), Batch> {
        match self.ops {
            None => Ok(()),
            Some(o) => o.apply_to(store).map_err(|o| Batch { ops: Some(o) }),
        }
    }

    /// Applies the changes to the node proxy's store, that of both its types
    /// ([`crate::Addresses`], [`crate::Authorizations`]).
    ///
    /// # Panics
    ///
    /// If the batch is of a type that keeps its resources elsewhere: the process hands
    /// its batches to the wrong store, a wiring mistake that its first batch of that
    /// type shows (route them with [`Batch::downcast`] or [`Batch::try_apply`]).
    pub fn apply(self, state: &mut ProxyState) {
        if let Err(b) = self.try_apply(state) {
            panic!(
                "a batch of {} applied to the node proxy's ProxyState, not its type's store",
                b.type_url().unwrap_or("?"),
            );
        }
    }
}

impl<T: ResourceType> From<TypedBatch<T>> for Batch {
    fn from(b: TypedBatch<T>) -> Batch {
        Batch {
            ops: (!b.ops.is_empty()).then(|| Box::new(b) as Box<dyn Ops>),
        }
    }
}

impl Clone for Batch {
    fn clone(&self) -> Self {
        Batch {
            ops: self.ops.as_ref().map(|o| o.clone_box()),
        }
    }
}

impl PartialEq for Batch {
    fn eq(&self, other: &Self) -> bool {
        match (&self.ops, &other.ops) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same(b.as_ref()),
            _ => false,
        }
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ops {
            None => f.write_str("Batch(empty)"),
            Some(o) => o.fmt(f),
        }
    }
}
