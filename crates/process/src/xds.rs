//! The xDS client's settings: the channel to the server and the node it announces.

use crate::env::Env;
use crate::ConfigError;

/// What the xDS client needs besides the address: the channel (`XDS_ROOT_CA`,
/// `ALT_XDS_HOSTNAME`, `AUTH_TOKEN`, the cluster id, `XDS_HEADER_*`) and the node it
/// announces (`POD_NAME`, `POD_NAMESPACE`, `INSTANCE_IP`, `NODE_NAME`, `ISTIO_META_*`,
/// `ISTIO_METAJSON_*`).
#[derive(Clone, Debug)]
pub struct XdsConfig {
    pub channel: ambit_grpc::ChannelConfig,
    pub node: ambit_xds::NodeConfig,
}

pub fn xds_config(
    env: &Env<'_>,
    address: &str,
    cluster_id: &str,
) -> Result<XdsConfig, ConfigError> {
    let mut headers: Vec<(String, String)> = env
        .vars
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("XDS_HEADER_")?.to_string(), v.clone())))
        .filter(|(k, _)| !k.is_empty())
        .collect();
    headers.sort();
    let channel = ambit_grpc::ChannelConfig {
        server_identity: None,
        address: address.to_string(),
        root: ambit_grpc::RootCa::from_env_value(env.get("XDS_ROOT_CA")),
        alt_hostname: env
            .get("ALT_XDS_HOSTNAME")
            .filter(|h| !h.is_empty())
            .map(str::to_string),
        token: ambit_grpc::Token::from_env_value(env.get("AUTH_TOKEN")),
        cluster_id: cluster_id.to_string(),
        headers,
    };
    // Named through `get` so a value that is not UTF-8 is refused (see from_process_env).
    let named = ["POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "NODE_NAME"]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), env.get(k)?.to_string())));
    let prefixed = env
        .vars
        .iter()
        .filter(|(k, _)| k.starts_with("ISTIO_META_") || k.starts_with("ISTIO_METAJSON_"))
        .map(|(k, v)| (k.clone(), v.clone()));
    let node = ambit_xds::NodeConfig::from_vars(named.chain(prefixed)).map_err(|e| {
        ConfigError::Invalid {
            var: "ISTIO_METAJSON_*",
            value: e.var.clone(),
            expected: "a JSON value in every ISTIO_METAJSON_<NAME> variable",
        }
    })?;
    Ok(XdsConfig { channel, node })
}
