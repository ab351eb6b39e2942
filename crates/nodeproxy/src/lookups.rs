//! What the data path asks of the xDS client in on-demand mode, apart from how it is used
//! ([`crate::on_demand`]), so that the proxy's inputs can hold one without a circle.

use std::future::Future;
use std::pin::Pin;

/// The xDS client's on-demand side, as the data path needs it.
pub trait OnDemandLookups: Send + Sync + 'static {
    /// Asks for `name` and waits until the answer was applied to the store (or fails:
    /// no answer in time, too many pending). `pin`: never unsubscribed for idleness.
    fn fetch<'a>(
        &'a self,
        name: &'a str,
        pin: bool,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
    /// A lookup of `name` hit: keeps it subscribed.
    fn touch(&self, name: &str);
}
