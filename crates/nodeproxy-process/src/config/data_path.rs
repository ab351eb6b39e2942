//! What the data path reads ([`ProxyConfig`]): the packet mark, HTTP/2 and pool settings,
//! original source, TCP keepalive, the listener ports, HBONE handshake admission, the
//! network and cluster.

use ambit_nodeproxy::admission::HandshakeLimits;
use ambit_nodeproxy::settings::{Keepalive, OriginalSource, Ports, ProxyConfig};
use ambit_wellknown::{marks, ports};

use super::{ConfigError, ProxyMode};
use ambit_process::env::Env;

/// The data path's settings (its reserved ports are the operator ports', set later).
pub(super) fn settings(env: &Env<'_>, proxy_mode: ProxyMode) -> Result<ProxyConfig, ConfigError> {
    let packet_mark =
        match env.parse::<u32>("PACKET_MARK", "a 32-bit unsigned integer such as 1337")? {
            Some(m) => Some(m),
            None if proxy_mode == ProxyMode::Shared => Some(marks::PROXY),
            None => None,
        };
    let h2_defaults = ambit_hbone::H2Settings::default();
    let stream_window = env.u32_in(
        "HTTP2_STREAM_WINDOW_SIZE",
        h2_defaults.stream_window,
        65_535..=(i32::MAX as u32),
        "a window size in bytes, 65535 (HTTP/2's initial window) to 2147483647",
    )?;
    let connection_window = env.u32_in(
        "HTTP2_CONNECTION_WINDOW_SIZE",
        h2_defaults.connection_window,
        65_535..=(i32::MAX as u32),
        "a window size in bytes, 65535 (HTTP/2's initial window) to 2147483647",
    )?;
    let frame_size = env.u32_in(
        "HTTP2_FRAME_SIZE",
        h2_defaults.frame_size,
        16_384..=16_777_215,
        "a frame size in bytes, 16384 to 16777215",
    )?;
    let max_streams = env.u32_in(
        "POOL_MAX_STREAMS_PER_CONNECTION",
        ambit_hbone::ClientSettings::default().max_streams_per_connection,
        1..=u16::MAX as u32,
        "a stream count, 1 to 65535",
    )?;
    let idle = env
        .duration("POOL_UNUSED_RELEASE_TIMEOUT")?
        .unwrap_or(ambit_hbone::ClientSettings::default().idle_timeout);
    let original_source = match env.get("ENABLE_ORIG_SRC") {
        None => OriginalSource::Auto,
        Some(_) => {
            if env.bool("ENABLE_ORIG_SRC", false)? {
                OriginalSource::Required
            } else {
                OriginalSource::Off
            }
        }
    };
    let keepalive = Keepalive {
        enabled: env.bool("KEEPALIVE_ENABLED", true)?,
        time: env.keepalive_seconds("KEEPALIVE_TIME", 180)?,
        interval: env.keepalive_seconds("KEEPALIVE_INTERVAL", 180)?,
        retries: env.u32_in(
            "KEEPALIVE_RETRIES",
            9,
            1..=127,
            "a number of probes, 1 to 127",
        )?,
        user_timeout: env.bool("USER_TIMEOUT_ENABLED", false)?,
    };
    let ipv6_enabled = env.bool("IPV6_ENABLED", true)?;
    let hbone_port = env.port("AMBIT_HBONE_PORT", ports::HBONE)?;
    let ports = Ports {
        outbound: env.port("AMBIT_OUTBOUND_PORT", ports::OUTBOUND)?,
        inbound_plaintext: env.port("AMBIT_INBOUND_PLAINTEXT_PORT", ports::INBOUND_PLAINTEXT)?,
        inbound_hbone: hbone_port,
        remote_hbone: env.port("AMBIT_REMOTE_HBONE_PORT", hbone_port)?,
        socks5: env
            .bool("UNSTABLE_ENABLE_SOCKS5", false)?
            .then_some(ports::SOCKS5),
    };
    let h2 = ambit_hbone::H2Settings {
        stream_window,
        connection_window,
        frame_size,
        idle_timeout: env
            .duration("AMBIT_HBONE_IDLE_TIMEOUT")?
            .unwrap_or(h2_defaults.idle_timeout),
        max_stream_rate: env.u32_in(
            "AMBIT_HBONE_MAX_STREAM_RATE",
            h2_defaults.max_stream_rate,
            0..=u32::MAX,
            "streams per second a client may open on one connection (0: no limit)",
        )?,
        ..Default::default()
    };
    let handshakes = handshake_limits(env, proxy_mode)?;
    let pool = ambit_hbone::ClientSettings {
        h2: h2.clone(),
        max_streams_per_connection: max_streams,
        idle_timeout: idle,
        ..Default::default()
    };
    let cluster_id = env
        .get("ISTIO_META_CLUSTER_ID")
        .or(env.get("CLUSTER_ID"))
        .unwrap_or("Kubernetes")
        .to_string();
    Ok(ProxyConfig {
        ports,
        packet_mark,
        network: env.get("NETWORK").unwrap_or("").to_string(),
        cluster_id,
        ipv6_enabled,
        original_source,
        keepalive,
        h2,
        pool,
        response_baggage: env.bool("ENABLE_RESPONSE_BAGGAGE", true)?,
        localhost_app_tunnel: env.bool("LOCALHOST_APP_TUNNEL", true)?,
        handshakes,
        reserved_ports: Vec::new(),
    })
}

/// How many connections may be in their HBONE handshake at once: on the node
/// (`AMBIT_MAX_HBONE_HANDSHAKES`), per pod in shared mode
/// (`AMBIT_MAX_HBONE_HANDSHAKES_PER_POD`; in dedicated mode the node is the one instance)
/// and per source IP (`AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE`, default a quarter of the
/// instance's share).
pub(super) fn handshake_limits(env: &Env, mode: ProxyMode) -> Result<HandshakeLimits, ConfigError> {
    let count = |var, default: usize| {
        env.u32_in(
            var,
            default as u32,
            1..=1_000_000,
            "a number of connections, 1 to 1000000",
        )
        .map(|n| n as usize)
    };
    let node = count("AMBIT_MAX_HBONE_HANDSHAKES", HandshakeLimits::DEFAULT_NODE)?;
    let pod = match mode {
        ProxyMode::Dedicated => node,
        ProxyMode::Shared => count(
            "AMBIT_MAX_HBONE_HANDSHAKES_PER_POD",
            HandshakeLimits::DEFAULT_POD,
        )?,
    };
    let mut limits = HandshakeLimits::for_pod(node, pod);
    limits.source = count("AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE", limits.source)?;
    Ok(limits)
}
