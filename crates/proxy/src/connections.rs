//! The connections one proxy instance has open, for `/config_dump`'s `workloadState`
//! (`connections: {inbound: [...], outbound: [...]}`, as ztunnel lists them): each entry
//! lives while its [`Tracked`] guard does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// How a connection is carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Protocol {
    #[serde(rename = "HBONE")]
    Hbone,
    #[serde(rename = "TCP")]
    Tcp,
}

/// One open connection as ztunnel shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// The client: the app's socket outbound, the HBONE or plaintext peer inbound.
    pub src: SocketAddr,
    /// What the app dialed (outbound only).
    pub original_dst: Option<SocketAddr>,
    /// Where we send it: the next hop outbound, the app inbound.
    pub actual_dst: SocketAddr,
    pub protocol: Protocol,
}

impl Connection {
    pub fn new(
        src: SocketAddr,
        original_dst: Option<SocketAddr>,
        actual_dst: SocketAddr,
        protocol: Protocol,
    ) -> Connection {
        Connection {
            src,
            original_dst,
            actual_dst,
            protocol,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

#[derive(Default)]
struct Inner {
    next: u64,
    open: BTreeMap<u64, (Direction, Connection)>,
}

/// The open connections of one proxy instance, in the order they opened.
#[derive(Default)]
pub struct OpenConnections(Mutex<Inner>);

/// Removes its connection from the list when dropped.
pub struct Tracked {
    owner: Arc<OpenConnections>,
    id: u64,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ConnectionsDump {
    pub inbound: Vec<Connection>,
    pub outbound: Vec<Connection>,
}

impl OpenConnections {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn track(self: &Arc<Self>, direction: Direction, c: Connection) -> Tracked {
        let mut inner = self.inner();
        let id = inner.next;
        inner.next += 1;
        inner.open.insert(id, (direction, c));
        Tracked {
            owner: self.clone(),
            id,
        }
    }

    pub fn dump(&self) -> ConnectionsDump {
        let inner = self.inner();
        let of = |d: Direction| {
            inner
                .open
                .values()
                .filter(|(dir, _)| *dir == d)
                .map(|(_, c)| c.clone())
                .collect()
        };
        ConnectionsDump {
            inbound: of(Direction::Inbound),
            outbound: of(Direction::Outbound),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.owner.inner().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_live_as_long_as_their_guard() {
        let open = Arc::new(OpenConnections::default());
        let c = |src: &str, protocol| Connection {
            src: src.parse().unwrap(),
            original_dst: None,
            actual_dst: "10.0.0.2:8080".parse().unwrap(),
            protocol,
        };
        let a = open.track(Direction::Outbound, c("10.0.0.1:1", Protocol::Hbone));
        let b = open.track(Direction::Inbound, c("10.0.0.3:2", Protocol::Tcp));
        let d = open.track(Direction::Outbound, c("10.0.0.1:3", Protocol::Tcp));
        let dump = open.dump();
        assert_eq!(dump.outbound.len(), 2);
        assert_eq!(dump.outbound[0].src.port(), 1, "in the order they opened");
        assert_eq!(dump.inbound, vec![c("10.0.0.3:2", Protocol::Tcp)]);
        drop(a);
        assert_eq!(open.dump().outbound, vec![c("10.0.0.1:3", Protocol::Tcp)]);
        drop((b, d));
        assert_eq!(
            serde_json::to_value(open.dump()).unwrap(),
            serde_json::json!({"inbound": [], "outbound": []})
        );
        let one = serde_json::to_value(c("10.0.0.1:1", Protocol::Hbone)).unwrap();
        assert_eq!(
            one,
            serde_json::json!({"src": "10.0.0.1:1", "originalDst": null, "actualDst": "10.0.0.2:8080", "protocol": "HBONE"})
        );
    }
}
