//! The accept step of a TCP listener whose connections go through a [`Gate`]: each
//! accepted connection is admitted (perhaps evicting a stalled one) or reset at once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use crate::gate::{Gate, Ticket};

/// The pause after a failed `accept` (out of file descriptors, say).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// The least time between two reports of refused or evicted connections.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Says when a repeated event is due to be reported again: the first time, then at most
/// once per interval, so a flood is one log line every few seconds.
#[derive(Debug, Default)]
pub struct ReportThrottle {
    last: Mutex<Option<Instant>>,
}

impl ReportThrottle {
    /// Whether to report an event at `now`; a `true` starts a new interval.
    pub fn due(&self, now: Instant, interval: Duration) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| now.saturating_duration_since(at) >= interval);
        if due {
            *last = Some(now);
        }
        due
    }
}

/// A connection let in, with its place in the gate.
#[derive(Debug)]
pub struct Accepted {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub ticket: Ticket,
}

/// Accepts the next connection the gate lets in; those it refuses are reset (never
/// queued) and reported through `reports`, naming `what` listens.
pub async fn accept(
    listener: &TcpListener,
    gate: &Arc<Gate>,
    reports: &ReportThrottle,
    what: &str,
) -> Accepted {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("{what}: accept failed: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        // A v4 client of a dual-stack listener counts as its v4 address.
        let source = peer.ip().to_canonical();
        match gate.admit(source) {
            Ok(admitted) => {
                if let Some(victim) = admitted.evicted {
                    if reports.due(Instant::now(), REPORT_EVERY) {
                        tracing::warn!(
                            "{what}: full; closed an idle or stalled connection from {victim} for a new one from {peer} (more are closed quietly for {}s)",
                            REPORT_EVERY.as_secs()
                        );
                    }
                }
                return Accepted {
                    stream,
                    peer,
                    ticket: admitted.ticket,
                };
            }
            Err(full) => {
                reset(&stream);
                if reports.due(Instant::now(), REPORT_EVERY) {
                    tracing::warn!(
                        "{what}: {full}; reset the one from {peer} (more are reset quietly for {}s)",
                        REPORT_EVERY.as_secs()
                    );
                }
            }
        }
    }
}

/// Makes closing `stream` send a reset rather than a FIN: the client learns at once, and
/// no TIME_WAIT is left behind.
pub fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::choose::Limits;

    #[test]
    fn reports_at_most_once_per_interval() {
        let t = ReportThrottle::default();
        let t0 = Instant::now();
        let every = Duration::from_secs(10);
        assert!(t.due(t0, every));
        assert!(!t.due(t0 + Duration::from_secs(9), every));
        assert!(t.due(t0 + Duration::from_secs(10), every));
    }

    #[tokio::test]
    async fn a_refused_connection_is_reset_and_an_admitted_one_kept() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Gate::new(Limits {
            total: 1,
            per_source: 1,
        });
        let reports = ReportThrottle::default();
        let first = TcpStream::connect(addr).await.unwrap();
        let held = accept(&listener, &gate, &reports, "test").await;
        held.ticket.prove();
        // The only place is held by a proven connection: the next is reset, and the
        // accept step goes on to the one after, admitted once the place is free.
        let mut refused = TcpStream::connect(addr).await.unwrap();
        let serve = tokio::spawn(async move {
            let second = accept(&listener, &gate, &reports, "test").await;
            (second, listener, gate)
        });
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        let got = tokio::time::timeout(Duration::from_secs(10), refused.read(&mut buf))
            .await
            .expect("the refused connection is closed at once");
        assert!(
            matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "refused with a reset: {got:?}"
        );
        drop(held);
        let third = TcpStream::connect(addr).await.unwrap();
        let (second, _listener, gate) = tokio::time::timeout(Duration::from_secs(10), serve)
            .await
            .expect("admitted once the place is free")
            .unwrap();
        assert_eq!(second.peer, third.local_addr().unwrap());
        assert_eq!(gate.held(), 1);
        drop(first);
    }
}
