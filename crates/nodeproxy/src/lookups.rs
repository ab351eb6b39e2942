//! What the data path asks of others, apart from the code that asks, so that the proxy's
//! inputs can hold one without a circle: the xDS client in on-demand mode
//! ([`OnDemandLookups`], used by [`crate::on_demand`]) and the DNS proxy's resolver
//! ([`NameLookup`], used by [`crate::socks5`]).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use ambit_state::Workload;

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

/// Resolves names as the DNS proxy would answer the local workload: mesh services from
/// the mesh state, anything else from the upstream resolvers.
pub trait NameLookup: Send + Sync + 'static {
    /// The addresses of `name` (AAAA records when `ipv6`, else A), best first.
    fn lookup<'a>(
        &'a self,
        client: &'a Workload,
        name: &'a str,
        ipv6: bool,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, String>> + Send + 'a>>;
}

impl NameLookup for ambit_dns::Resolver {
    fn lookup<'a>(
        &'a self,
        client: &'a Workload,
        name: &'a str,
        ipv6: bool,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, String>> + Send + 'a>> {
        Box::pin(async move {
            ambit_dns::Resolver::lookup(self, client, name, ipv6)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
