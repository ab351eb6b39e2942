//! One record per proxied connection: metrics when it opens and closes, and the access log
//! line (target `access`). Recorded on drop too, so a close is never lost.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ambit_identity::SpiffeId;
use ambit_state::{Service, Workload};

use crate::connections::{Connection, Direction, OpenConnections, Tracked};
use crate::error::Error;
use crate::metrics::{Metrics, Reporter, TrafficLabels};
use ambit_telemetry::or_unknown;

pub use ambit_telemetry::ResponseFlag;

/// Who the two ends are, as far as the proxy knows.
#[derive(Default)]
pub struct Endpoints {
    pub src_addr: Option<SocketAddr>,
    pub src_workload: Option<Arc<Workload>>,
    /// Only set when the source proved it with mTLS (or is us, outbound over HBONE).
    pub src_identity: Option<SpiffeId>,
    pub dst_addr: Option<SocketAddr>,
    pub dst_hbone_addr: Option<String>,
    pub dst_workload: Option<Arc<Workload>>,
    pub dst_service: Option<Arc<Service>>,
    pub dst_identity: Option<SpiffeId>,
    pub mtls: bool,
}

/// Byte counters updated by the copy loop as data moves, so a reset keeps what was counted.
#[derive(Default, Debug)]
pub struct ByteCounters {
    pub client_to_server: AtomicU64,
    pub server_to_client: AtomicU64,
}

pub struct ConnectionResult {
    metrics: Metrics,
    labels: TrafficLabels,
    reporter: Reporter,
    endpoints: Endpoints,
    started: Instant,
    pub bytes: Arc<ByteCounters>,
    recorded: bool,
    /// The connection's entry in its proxy's open-connection list, while it lasts.
    tracked: Option<Tracked>,
}

fn region_and_zone(w: &Workload) -> (&str, &str) {
    (&w.locality.region, &w.locality.zone)
}

/// The workload's name for metrics and baggage: its workload (deployment) name, as
/// configured; metrics report an empty one as `unknown`, as ztunnel does.
pub(crate) fn workload_name(w: &Workload) -> &str {
    &w.workload_name
}

impl ConnectionResult {
    /// Counts the connection as opened and logs it at debug.
    pub fn open(metrics: &Metrics, reporter: Reporter, endpoints: Endpoints) -> ConnectionResult {
        let mut l = TrafficLabels::new(reporter);
        if let Some(w) = &endpoints.src_workload {
            l.source_workload = or_unknown(workload_name(w));
            l.source_canonical_service = or_unknown(&w.canonical_name);
            l.source_canonical_revision = or_unknown(&w.canonical_revision);
            l.source_workload_namespace = or_unknown(&w.namespace);
            l.source_app = or_unknown(&w.canonical_name);
            l.source_version = or_unknown(&w.canonical_revision);
            l.source_cluster = or_unknown(&w.cluster_id);
        }
        if let Some(id) = &endpoints.src_identity {
            l.source_principal = id.to_string();
        }
        if let Some(s) = &endpoints.dst_service {
            l.destination_service = or_unknown(&s.hostname);
            l.destination_service_namespace = or_unknown(&s.namespace);
            l.destination_service_name = or_unknown(&s.name);
        }
        if let Some(w) = &endpoints.dst_workload {
            l.destination_workload = or_unknown(workload_name(w));
            l.destination_canonical_service = or_unknown(&w.canonical_name);
            l.destination_canonical_revision = or_unknown(&w.canonical_revision);
            l.destination_workload_namespace = or_unknown(&w.namespace);
            l.destination_app = or_unknown(&w.canonical_name);
            l.destination_version = or_unknown(&w.canonical_revision);
            l.destination_cluster = or_unknown(&w.cluster_id);
        }
        if let Some(id) = &endpoints.dst_identity {
            l.destination_principal = id.to_string();
        }
        if endpoints.mtls {
            l.connection_security_policy = "mutual_tls";
        }
        if endpoints.src_workload.is_some() || endpoints.dst_workload.is_some() {
            l.set_locality(
                endpoints.src_workload.as_deref().map(region_and_zone),
                endpoints.dst_workload.as_deref().map(region_and_zone),
            );
        }
        metrics.connections_opened.get_or_create(&l).inc();
        tracing::event!(
            target: "access",
            tracing::Level::DEBUG,
            src.addr = endpoints.src_addr.map(tracing::field::display),
            dst.addr = endpoints.dst_addr.map(tracing::field::display),
            direction = direction(reporter),
            "connection opened"
        );
        ConnectionResult {
            metrics: metrics.clone(),
            labels: l,
            reporter,
            endpoints,
            started: Instant::now(),
            bytes: Arc::new(ByteCounters::default()),
            recorded: false,
            tracked: None,
        }
    }

    /// Lists the connection among `open`'s until it is recorded.
    pub fn track(&mut self, open: &Arc<OpenConnections>, direction: Direction, c: Connection) {
        self.tracked = Some(open.track(direction, c));
    }

    /// Keeps an allowed inbound connection's authorization inputs for re-checks when
    /// policies change (see [`OpenConnections::recheck`]).
    pub fn watch_policy(
        &self,
        ctx: ambit_state::RbacContext,
        dst: std::sync::Arc<ambit_state::Workload>,
        policy_generation: u64,
    ) -> Option<crate::connections::Revoked> {
        self.tracked
            .as_ref()
            .map(|t| t.watch_policy(ctx, dst, policy_generation))
    }

    /// Records the close with the outcome.
    pub fn finish(mut self, outcome: Result<(), Error>) {
        self.record(outcome);
    }

    fn record(&mut self, outcome: Result<(), Error>) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        self.tracked = None;
        let c2s = self.bytes.client_to_server.load(Ordering::Relaxed);
        let s2c = self.bytes.server_to_client.load(Ordering::Relaxed);
        // Istio's orientation for both reporters: received = client to server. The byte
        // counters keep the labels the connection opened with (no response flag), as
        // ztunnel's do; only the close and the failure carry the outcome.
        self.metrics
            .received_bytes
            .get_or_create(&self.labels)
            .inc_by(c2s);
        self.metrics
            .sent_bytes
            .get_or_create(&self.labels)
            .inc_by(s2c);
        let mut labels = self.labels.clone();
        let flag = outcome
            .as_ref()
            .err()
            .map_or(ResponseFlag::None, Error::response_flag);
        labels.response_flags = flag;
        self.metrics.connections_closed.get_or_create(&labels).inc();
        if flag != ResponseFlag::None {
            self.metrics.connections_failed.get_or_create(&labels).inc();
        }
        // The log speaks for the local workload: what it sent and what it received.
        let (bytes_sent, bytes_recv) = match self.reporter {
            Reporter::Source => (c2s, s2c),
            // A waypoint, like a destination, serves the client's connection.
            Reporter::Destination | Reporter::Waypoint => (s2c, c2s),
        };
        let e = &self.endpoints;
        let src_workload = e.src_workload.as_deref();
        let dst_workload = e.dst_workload.as_deref();
        let duration = format!("{}ms", self.started.elapsed().as_millis());
        // Identities are logged only when mTLS proved them.
        let src_identity = e
            .src_identity
            .as_ref()
            .filter(|_| e.mtls)
            .map(|i| i.to_string());
        let dst_identity = e
            .dst_identity
            .as_ref()
            .filter(|_| e.mtls)
            .map(|i| i.to_string());
        // ztunnel's fields, order and formatting: addresses bare, names quoted.
        macro_rules! access {
            ($level:expr, $($extra:tt)*) => {
                tracing::event!(
                    target: "access",
                    $level,
                    src.addr = e.src_addr.map(tracing::field::display),
                    src.workload = src_workload.map(|w| w.name.as_str()),
                    src.namespace = src_workload.map(|w| w.namespace.as_str()),
                    src.identity = src_identity.as_deref(),
                    src.cluster = cluster(src_workload),
                    dst.addr = e.dst_addr.map(tracing::field::display),
                    dst.hbone_addr = e.dst_hbone_addr.as_deref().map(tracing::field::display),
                    dst.service = e.dst_service.as_ref().map(|s| s.hostname.as_str()),
                    dst.workload = dst_workload.map(|w| w.name.as_str()),
                    dst.namespace = dst_workload.map(|w| w.namespace.as_str()),
                    dst.identity = dst_identity.as_deref(),
                    dst.cluster = cluster(dst_workload),
                    direction = direction(self.reporter),
                    bytes_sent,
                    bytes_recv,
                    duration = duration.as_str(),
                    $($extra)*
                )
            };
        }
        match outcome {
            Ok(()) => access!(tracing::Level::INFO, "connection complete"),
            Err(error) => {
                let error = error.to_string();
                access!(
                    tracing::Level::ERROR,
                    error = error.as_str(),
                    "connection complete"
                )
            }
        }
    }
}

impl Drop for ConnectionResult {
    fn drop(&mut self) {
        self.record(Err(Error::Dropped));
    }
}

/// A connection that failed before there was enough context for metrics: one warning
/// line, as ztunnel logs them (no metrics). `dst` is the listener it arrived on, inbound.
pub(crate) fn early_failure(
    reporter: Reporter,
    src: SocketAddr,
    dst: Option<SocketAddr>,
    error: &Error,
) {
    let error = error.to_string();
    tracing::event!(
        target: "access",
        tracing::Level::WARN,
        src.addr = %src,
        dst.addr = dst.map(tracing::field::display),
        direction = direction(reporter),
        error = error.as_str(),
        "connection failed"
    );
}

/// A workload's cluster id for the access log; an empty one is left out.
fn cluster(w: Option<&Workload>) -> Option<&str> {
    w.map(|w| w.cluster_id.as_str()).filter(|c| !c.is_empty())
}

fn direction(reporter: Reporter) -> &'static str {
    match reporter {
        Reporter::Source => "outbound",
        Reporter::Destination | Reporter::Waypoint => "inbound",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    use std::sync::Mutex;

    const MESH: &str = r#"
workloads:
- uid: c1
  name: client-7d9
  workloadName: client
  namespace: shop
  serviceAccount: client
  workloadIps: [10.0.0.1]
  canonicalName: client
  canonicalRevision: v1
  locality: {region: eu-west, zone: eu-west-1a}
- uid: s1
  name: server-5f6
  namespace: shop
  serviceAccount: server
  workloadIps: [10.0.0.2]
  protocol: HBONE
"#;

    fn workloads() -> (Arc<Workload>, Arc<Workload>) {
        let mut cfg = ambit_state::parse_local_config("test", MESH).unwrap();
        let server = Arc::new(cfg.workloads.pop().unwrap());
        let client = Arc::new(cfg.workloads.pop().unwrap());
        (client, server)
    }

    /// The JSON lines `f` logs, with the metrics text it left behind.
    fn run_logged(f: impl FnOnce(&Metrics)) -> (Vec<serde_json::Value>, String) {
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, "test");
        tracing::subscriber::with_default(subscriber, || f(&metrics));
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        let out = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let logged = out
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect();
        (logged, text)
    }

    fn outbound_hbone() -> Endpoints {
        let (client, server) = workloads();
        Endpoints {
            src_addr: Some("10.0.0.1:40000".parse().unwrap()),
            src_identity: Some(client.identity()),
            src_workload: Some(client),
            dst_addr: Some("10.0.0.2:8080".parse().unwrap()),
            dst_hbone_addr: Some("10.0.0.2:15008".into()),
            dst_identity: Some(server.identity()),
            dst_workload: Some(server),
            dst_service: None,
            mtls: true,
        }
    }

    #[test]
    fn a_completed_connection_logs_one_info_line_with_ztunnel_fields() {
        let (logs, metrics) = run_logged(|m| {
            let c = ConnectionResult::open(m, Reporter::Source, outbound_hbone());
            c.bytes.client_to_server.store(100, Ordering::Relaxed);
            c.bytes.server_to_client.store(7, Ordering::Relaxed);
            c.finish(Ok(()));
        });
        assert_eq!(logs.len(), 1, "{logs:?}");
        let line = &logs[0];
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["target"], "access");
        let f = &line["fields"];
        assert_eq!(f["message"], "connection complete");
        assert_eq!(f["direction"], "outbound");
        assert_eq!(f["src.addr"], "10.0.0.1:40000");
        // The access log names the pod; metrics name its workload (deployment).
        assert_eq!(f["src.workload"], "client-7d9");
        assert_eq!(f["src.namespace"], "shop");
        assert_eq!(
            f["src.identity"],
            "spiffe://cluster.local/ns/shop/sa/client"
        );
        assert_eq!(f["dst.addr"], "10.0.0.2:8080");
        assert_eq!(f["dst.hbone_addr"], "10.0.0.2:15008");
        assert_eq!(f["dst.workload"], "server-5f6");
        assert_eq!(
            f["dst.identity"],
            "spiffe://cluster.local/ns/shop/sa/server"
        );
        // The outbound side sent what the client sent.
        assert_eq!(f["bytes_sent"], 100);
        assert_eq!(f["bytes_recv"], 7);
        assert!(f["duration"].as_str().unwrap().ends_with("ms"));
        assert!(f.get("error").is_none());
        // Istio's orientation in metrics: received = client to server.
        let received = metrics
            .lines()
            .find(|l| l.starts_with("istio_tcp_received_bytes_total{"))
            .unwrap();
        assert!(received.ends_with(" 100"), "{received}");
        assert!(received.contains("source_workload=\"client\",source_canonical_service=\"client\",source_canonical_revision=\"v1\""));
        // A workload without a workload name is reported as unknown, as ztunnel does.
        assert!(
            received.contains("destination_workload=\"unknown\""),
            "{received}"
        );
        assert!(received.contains("connection_security_policy=\"mutual_tls\",source_region=\"eu-west\",source_zone=\"eu-west-1a\",destination_region=\"unknown\",destination_zone=\"unknown\""), "{received}");
    }

    #[test]
    fn a_failed_connection_logs_at_error_and_counts_as_failed() {
        let (logs, metrics) = run_logged(|m| {
            let c = ConnectionResult::open(m, Reporter::Source, outbound_hbone());
            c.finish(Err(Error::UpstreamConnect {
                target: "10.0.0.2:8080".parse().unwrap(),
                source: std::io::Error::other("upstream refused"),
            }));
        });
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert_eq!(logs[0]["level"], "ERROR");
        assert_eq!(
            logs[0]["fields"]["error"],
            "connect to 10.0.0.2:8080: upstream refused"
        );
        let failed = metrics
            .lines()
            .find(|l| l.starts_with("istio_tcp_connections_failed_total{"))
            .expect("a failed-connection sample");
        assert!(failed.contains("response_flags=\"CONNECT\""), "{failed}");
    }

    #[test]
    fn identities_are_logged_only_when_mtls_proved_them() {
        let (logs, metrics) = run_logged(|m| {
            let mut e = outbound_hbone();
            e.mtls = false;
            e.src_workload = None;
            e.dst_workload = None;
            ConnectionResult::open(m, Reporter::Destination, e).finish(Ok(()));
        });
        let f = &logs[0]["fields"];
        assert_eq!(f["direction"], "inbound");
        assert!(f.get("src.identity").is_none(), "{f}");
        assert!(f.get("dst.identity").is_none(), "{f}");
        // No workload information: no locality labels.
        let closed = metrics
            .lines()
            .find(|l| l.starts_with("istio_tcp_connections_closed_total{"))
            .unwrap();
        assert!(!closed.contains("region"), "{closed}");
    }
}
