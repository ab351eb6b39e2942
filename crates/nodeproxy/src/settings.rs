//! The data path's settings: the part of the node proxy's configuration it reads. Built
//! once by the process from the environment (`ambit_nodeproxy_process::config`).

use std::time::Duration;

use ambit_hbone::{ClientSettings, H2Settings};
use ambit_wellknown::ports;

/// Listener ports. ztunnel fixes these; ambit lets tests and side-by-side runs move them.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ports {
    pub outbound: u16,
    pub inbound_plaintext: u16,
    pub inbound_hbone: u16,
    /// The HBONE port dialed on remote nodes. Equals `inbound_hbone` except in tests that
    /// run several proxies in one network namespace.
    pub remote_hbone: u16,
    /// SOCKS5 on 127.0.0.1 (`UNSTABLE_ENABLE_SOCKS5=true`: 15080), else none.
    pub socks5: Option<u16>,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            outbound: ports::OUTBOUND,
            inbound_plaintext: ports::INBOUND_PLAINTEXT,
            inbound_hbone: ports::HBONE,
            remote_hbone: ports::HBONE,
            socks5: None,
        }
    }
}

/// `ENABLE_ORIG_SRC`: unset means "try, fall back quietly"; true means "required"; false "off".
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum OriginalSource {
    Auto,
    Required,
    Off,
}

#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Keepalive {
    pub enabled: bool,
    #[serde(with = "crate::settings::secs")]
    pub time: Duration,
    #[serde(with = "crate::settings::secs")]
    pub interval: Duration,
    pub retries: u32,
    pub user_timeout: bool,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            enabled: true,
            time: Duration::from_secs(180),
            interval: Duration::from_secs(180),
            retries: 9,
            user_timeout: false,
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    pub ports: Ports,
    /// `SO_MARK` for every socket the proxy opens, so capture rules skip them.
    pub packet_mark: Option<u32>,
    pub network: String,
    pub cluster_id: String,
    pub ipv6_enabled: bool,
    pub original_source: OriginalSource,
    pub keepalive: Keepalive,
    #[serde(skip)]
    pub h2: H2Settings,
    #[serde(skip)]
    pub pool: ClientSettings,
    /// Send destination metadata back in the CONNECT response (`ENABLE_RESPONSE_BAGGAGE`).
    pub response_baggage: bool,
    /// Deliver PROXY-protocol application tunnels to loopback rather than the pod IP
    /// (`LOCALHOST_APP_TUNNEL`).
    pub localhost_app_tunnel: bool,
    /// Connections each proxy instance lets into the HBONE handshake at once.
    pub handshakes: crate::admission::HandshakeLimits,
    /// Ports besides the three listeners that captured traffic must never reach: the
    /// stats and readiness ports in dedicated mode, where they share the node's addresses.
    pub reserved_ports: Vec<u16>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            ports: Ports::default(),
            packet_mark: None,
            network: String::new(),
            cluster_id: "Kubernetes".into(),
            ipv6_enabled: true,
            original_source: OriginalSource::Auto,
            keepalive: Keepalive::default(),
            h2: H2Settings::default(),
            pool: ClientSettings::default(),
            response_baggage: true,
            localhost_app_tunnel: true,
            handshakes: Default::default(),
            reserved_ports: Vec::new(),
        }
    }
}

impl ProxyConfig {
    /// The listeners' ports, as ztunnel lists them (`illegalPorts`).
    pub fn listener_ports(&self) -> [u16; 3] {
        [
            self.ports.outbound,
            self.ports.inbound_plaintext,
            self.ports.inbound_hbone,
        ]
    }

    /// Ports a captured connection must never be sent to: they would loop back into us.
    pub fn loop_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.listener_ports()
            .into_iter()
            .chain(self.ports.socks5)
            .chain(self.reserved_ports.iter().copied())
    }

    /// Whether `port` is one of [`ProxyConfig::loop_ports`].
    pub fn is_loop_port(&self, port: u16) -> bool {
        self.loop_ports().any(|p| p == port)
    }
}

/// Durations in `/config_dump` as seconds, e.g. `"5s"`.
pub mod secs {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}s", d.as_secs_f64()))
    }
}
