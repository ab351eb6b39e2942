//! The shared snapshot every reader of a process's mesh state takes: readers take an `Arc`
//! per decision; a writer applies a whole batch at once, so no reader sees half an update;
//! a generation counter tells those who re-check what an earlier state decided.

use std::sync::{Arc, RwLock};

/// State of type `T` shared between one writer at a time and any number of readers.
pub struct Shared<T> {
    current: Arc<RwLock<Arc<T>>>,
    /// Bumped after every change, for those who re-check what the state decided before
    /// (open connections against new policies, certificate prefetch).
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared {
            current: self.current.clone(),
            generation: self.generation.clone(),
        }
    }
}

impl<T> Shared<T> {
    pub fn new(state: T) -> Shared<T> {
        Shared {
            current: Arc::new(RwLock::new(Arc::new(state))),
            generation: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// The state now; it stays as it is for as long as the caller holds it.
    pub fn get(&self) -> Arc<T> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the state outright.
    pub fn replace(&self, state: T) {
        {
            let mut guard = match self.current.write() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            // A new state outright: nothing of the old one needs copying.
            *guard = Arc::new(state);
        }
        self.generation.send_modify(|g| *g += 1);
    }

    /// A receiver that sees the generation change after every update.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

impl<T: Clone> Shared<T> {
    /// Applies `f` as one batch. Copy-on-write: the state is cloned only while a reader
    /// still holds the previous snapshot.
    pub fn update<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let result = {
            let mut guard = match self.current.write() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            f(Arc::make_mut(&mut guard))
        };
        self.generation.send_modify(|g| *g += 1);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_keeps_its_snapshot_while_a_batch_applies() {
        let shared = Shared::new(vec![1]);
        let mut changes = shared.subscribe();
        let before = shared.get();
        shared.update(|v| v.push(2));
        assert_eq!(
            *before,
            [1],
            "the reader's snapshot did not change under it"
        );
        assert_eq!(*shared.get(), [1, 2]);
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        shared.replace(vec![3]);
        assert_eq!(*shared.get(), [3]);
        assert!(changes.has_changed().unwrap());
    }
}
