//! The access log (`AMBIT_ACCESS_LOG=true`; off by default, as a waypoint's is until
//! MeshConfig `accessLogFile` or a Telemetry resource turns it on): one line per request
//! under the `access` scope, with the fields of Istio's default text format (reference
//! waypoint.md §4.2) as key=value pairs in ztunnel's log layout.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Request};
use hyper::body::Incoming;

use crate::downstream::Downstream;
use crate::metrics::RequestLabels;

/// What the line says beyond the metric labels, taken as the request arrives.
#[derive(Debug, Clone)]
pub struct Entry {
    pub start: SystemTime,
    pub method: String,
    /// The path as the client sent it (`X-ENVOY-ORIGINAL-PATH` else `PATH`).
    pub path: String,
    pub protocol: &'static str,
    pub authority: String,
    pub user_agent: String,
    pub forwarded_for: String,
    pub request_id: String,
    pub downstream: SocketAddr,
    /// The service port dialed, for the upstream cluster's name.
    pub port: u16,
    pub status: u16,
    /// Why the waypoint answered itself, when it did.
    pub details: Option<&'static str>,
}

impl Entry {
    pub fn of(req: &Request<Incoming>, down: &Downstream) -> Entry {
        let headers = req.headers();
        Entry {
            start: SystemTime::now(),
            method: req.method().to_string(),
            path: req
                .uri()
                .path_and_query()
                .map_or_else(|| "-".into(), |p| p.as_str().to_string()),
            protocol: match req.version() {
                http::Version::HTTP_2 => "HTTP/2",
                http::Version::HTTP_10 => "HTTP/1.0",
                _ => "HTTP/1.1",
            },
            authority: req
                .uri()
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_else(|| header_text(headers, "host")),
            user_agent: header_text(headers, "user-agent"),
            forwarded_for: header_text(headers, "x-forwarded-for"),
            request_id: header_text(headers, "x-request-id"),
            downstream: SocketAddr::new(down.peer_ip, 0),
            port: down.fronted.port(),
            status: 0,
            details: None,
        }
    }

    /// Writes the line.
    pub fn log(
        &self,
        labels: &RequestLabels,
        upstream: Option<SocketAddr>,
        bytes_received: u64,
        bytes_sent: u64,
        duration: Duration,
    ) {
        let start = humantime_rfc3339(self.start);
        tracing::info!(
            target: "access",
            start_time = %start,
            method = %self.method,
            path = %self.path,
            protocol = self.protocol,
            response_code = self.status,
            response_flags = labels.traffic.response_flags.as_str(),
            response_code_details = self.details.unwrap_or("via_upstream"),
            bytes_received,
            bytes_sent,
            duration_ms = duration.as_millis() as u64,
            x_forwarded_for = %self.forwarded_for,
            user_agent = %self.user_agent,
            x_request_id = %self.request_id,
            authority = %self.authority,
            upstream_host = %upstream.map_or_else(|| "-".to_string(), |u| u.to_string()),
            upstream_cluster = %format!(
                "inbound-vip|{}|http|{}",
                self.port,
                labels.traffic.destination_service
            ),
            downstream_remote_address = %self.downstream.ip(),
            src.identity = %labels.traffic.source_principal,
            dst.identity = %labels.traffic.destination_principal,
            "request complete"
        );
    }
}

/// A header's value as text (`-` when absent or not text), for the access log.
pub fn header_text(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

/// `2006-01-02T15:04:05.000Z`, as Envoy writes `START_TIME`.
fn humantime_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    format!(
        "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_are_envoys_format() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_763_200_123);
        assert_eq!(humantime_rfc3339(t), "2025-12-03T12:00:00.123Z");
        assert_eq!(
            humantime_rfc3339(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000Z"
        );
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(humantime_rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
