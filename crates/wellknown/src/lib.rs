//! The values both sides of an ambient node must agree on.
//!
//! The node agent writes rules that send traffic to the node proxy's ports and let its
//! marked sockets through; the CNI plugin and the agent meet on a socket; the agent and the
//! node proxy meet on another. Each value is Istio's (reference `ztunnel.md` §3-§5,
//! `istio-cni.md` §2), named once here so that no crate can drift from the others.
#![forbid(unsafe_code)]
#![no_std]

/// The node proxy's listening ports.
pub mod ports {
    /// Captured outbound TCP from the pod (`REDIRECT` target of `ISTIO_OUTPUT`).
    pub const OUTBOUND: u16 = 15001;
    /// Captured inbound plaintext TCP (`REDIRECT` target of `ISTIO_PRERT`).
    pub const INBOUND_PLAINTEXT: u16 = 15006;
    /// HBONE: mutual TLS HTTP/2 CONNECT, never redirected.
    pub const HBONE: u16 = 15008;
    /// The DNS proxy (UDP and TCP).
    pub const DNS: u16 = 15053;
    /// SOCKS5 (unstable in Istio), on localhost.
    pub const SOCKS5: u16 = 15080;
    /// Admin (`/config_dump`, `/quitquitquit`, `/logging`), on localhost only.
    pub const ADMIN: u16 = 15000;
    /// Prometheus metrics.
    pub const STATS: u16 = 15020;
    /// Readiness (`/healthz/ready`).
    pub const READINESS: u16 = 15021;
}

/// Packet and connection marks.
pub mod marks {
    /// `SO_MARK` on every socket the node proxy opens (1337), so capture skips them.
    pub const PROXY: u32 = 0x539;
    /// The connmark/fwmark of the spoofed-source return path.
    pub const RETURN: u32 = 0x111;
    /// The mask both marks are matched with.
    pub const MASK: u32 = 0xfff;
}

/// Policy routing of the spoofed-source return path inside a pod.
pub mod routing {
    /// The table holding the `local` default route via `lo`.
    pub const RETURN_TABLE: u32 = 100;
    /// The priority of the `ip rule` that selects it by fwmark.
    pub const RETURN_RULE_PRIORITY: u32 = 32764;
}

/// Sockets and directories.
pub mod paths {
    /// ZDS: the agent listens, the node proxy connects (`INPOD_UDS`).
    pub const ZDS_SOCKET: &str = "/var/run/ztunnel/ztunnel.sock";
    /// Pod events: the CNI plugin (and `ambit agent enroll|remove`) reach the agent here.
    pub const AGENT_EVENTS_SOCKET: &str = "/var/run/ambit/cni.sock";
    /// Where the agent keeps its enrolled pods across restarts.
    pub const AGENT_STATE_DIR: &str = "/var/lib/ambit/agent";
}

/// Host-side probe SNAT: kubelet probes reach enrolled pods from these addresses, which the
/// in-pod rules let through uncaptured.
pub mod probes {
    use core::net::{Ipv4Addr, Ipv6Addr};

    /// The source address of SNATed probes (IPv4).
    pub const SNAT_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);
    /// The source address of SNATed probes (IPv6).
    pub const SNAT_V6: Ipv6Addr = Ipv6Addr::new(
        0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff,
    );
    /// The ipset of enrolled pods' IPv4 addresses.
    pub const SET_V4: &str = "istio-inpod-probes-v4";
    /// The ipset of enrolled pods' IPv6 addresses.
    pub const SET_V6: &str = "istio-inpod-probes-v6";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_mark_is_1337_and_fits_the_mask() {
        assert_eq!(marks::PROXY, 1337);
        assert_eq!(marks::PROXY & marks::MASK, marks::PROXY);
        assert_eq!(marks::RETURN & marks::MASK, marks::RETURN);
        assert_ne!(marks::PROXY, marks::RETURN);
    }

    #[test]
    fn the_captured_ports_are_distinct() {
        let all = [
            ports::OUTBOUND,
            ports::INBOUND_PLAINTEXT,
            ports::HBONE,
            ports::DNS,
            ports::SOCKS5,
            ports::ADMIN,
            ports::STATS,
            ports::READINESS,
        ];
        for (i, a) in all.iter().enumerate() {
            assert!(!all[i + 1..].contains(a), "port {a} is used twice");
        }
    }
}
