//! The local configuration as a value: the workloads, services and policies a local config
//! file (or `LOCAL_XDS`) holds, read by [`crate::parse_local_config`] and built into a
//! store by [`crate::ProxyState::from_config`].

use serde::{Deserialize, Deserializer, Serialize};

use crate::policy::Authorization;
use crate::service::Service;
use crate::workload::Workload;

/// The whole local configuration: workloads, services and policies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalConfig {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub workloads: Vec<Workload>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub services: Vec<Service>,
    /// Read through [`crate::local::policies`], so that a bad policy can be skipped.
    #[serde(default, deserialize_with = "crate::local::policies")]
    pub policies: Vec<Authorization>,
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}
