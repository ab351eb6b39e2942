//! On-demand xDS at the I/O layer (`XDS_ON_DEMAND=true`): before a decision, the names
//! it would miss in the store are asked for and waited on ([`OnDemandLookups`]), then the
//! decision (sans-IO, in [`crate::decide`]) is made on the store as it then is. Names
//! follow ztunnel: `<network>/<ip>` for an address (`/<ip>` in the default network) and
//! the workload uid for the local workload.

use std::net::IpAddr;

use ambit_state::ProxyState;

use crate::error::Error;
use crate::inputs::ProxyInputs;

pub use crate::lookups::OnDemandLookups;

/// The on-demand name of an address: `<network>/<ip>`.
pub fn address_name(network: &str, ip: IpAddr) -> String {
    format!("{network}/{ip}")
}

/// The uid the local workload is asked for by: Istio's recommended form for a pod,
/// `<cluster>//v1/Pod/<namespace>/<name>` (what istiod and `ambit control` give pods).
pub fn local_uid(cluster_id: &str, namespace: &str, name: &str) -> String {
    format!("{cluster_id}//v1/Pod/{namespace}/{name}")
}

/// What an outbound decision to `dst` would miss in `state`: the local workload's
/// uid, and the destination's address name. Sans-IO.
pub fn outbound_misses(
    state: &ProxyState,
    pi: &ProxyInputs,
    dst: IpAddr,
) -> (Option<String>, Option<String>) {
    let local = match pi.local().workload(state) {
        Ok(_) => None,
        Err(_) => Some(local_uid(
            &pi.cfg.cluster_id,
            &pi.local.namespace,
            &pi.local.name,
        )),
    };
    let ns = pi.local.namespace.as_str();
    let dst = state
        .lookup_address(&pi.cfg.network, dst, ns)
        .is_none()
        .then(|| address_name(&pi.cfg.network, dst));
    (local, dst)
}

/// Before an outbound decision: asks for what it would miss, touches what it finds.
/// Errs (fail closed) when an ask is not answered in time.
pub async fn prepare_outbound(pi: &ProxyInputs, dst: IpAddr) -> Result<(), Error> {
    let Some(od) = &pi.on_demand else {
        return Ok(());
    };
    let (local, missing) = outbound_misses(&pi.state.get(), pi, dst);
    if let Some(uid) = &local {
        od.fetch(uid, true).await.map_err(Error::OnDemand)?;
    }
    match missing {
        Some(name) => od.fetch(&name, false).await.map_err(Error::OnDemand),
        None => {
            od.touch(&address_name(&pi.cfg.network, dst));
            Ok(())
        }
    }
}

/// Before an inbound decision: the local workload, if the store lacks it.
pub async fn prepare_inbound(pi: &ProxyInputs) -> Result<(), Error> {
    let Some(od) = &pi.on_demand else {
        return Ok(());
    };
    if pi.local().workload(&pi.state.get()).is_ok() {
        return Ok(());
    }
    let uid = local_uid(&pi.cfg.cluster_id, &pi.local.namespace, &pi.local.name);
    od.fetch(&uid, true).await.map_err(Error::OnDemand)
}
