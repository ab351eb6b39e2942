//! Handing memory back to the system after a big, short-lived use of it: decoding a whole
//! mesh (a local config file, an initial xDS sync, a control server's mesh directory).
//!
//! jemalloc (the `ambit` binary's allocator) keeps freed pages to reuse them and returns
//! them as they decay, during later allocations and frees: a proxy that has just decoded a
//! mesh and then sits idle would keep what decoding used long after. Purging once, when
//! such a load is done, returns it at once. Pages in use are not touched, so the data
//! path's buffers stay.
//!
//! The binary that chose the allocator says how ([`set_release`]); this crate stays free
//! of `unsafe`. Where nobody did (tests, other binaries), releasing does nothing.

use std::sync::OnceLock;

static RELEASE: OnceLock<fn() -> bool> = OnceLock::new();

/// Sets how freed memory is returned (once per process; later calls are ignored).
pub fn set_release(release: fn() -> bool) {
    let _ = RELEASE.set(release);
}

/// Returns what the allocator keeps of freed memory to the system; false where no way was
/// set or the allocator refused (an optimization only: nothing depends on it).
pub fn release_freed() -> bool {
    let released = RELEASE.get().is_some_and(|release| release());
    tracing::debug!(released, "freed memory handed back to the system");
    released
}

#[cfg(test)]
mod tests {
    #[test]
    fn releases_through_what_the_binary_set() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        fn counted() -> bool {
            CALLS.fetch_add(1, Ordering::SeqCst);
            true
        }
        super::set_release(counted);
        assert!(super::release_freed());
        assert_eq!(CALLS.load(Ordering::SeqCst), 1);
    }
}
