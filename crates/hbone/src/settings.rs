//! HTTP/2 settings shared by the server and the client pool.

use std::time::Duration;

/// HTTP/2 tuning. Defaults are Istio ztunnel's: 4 MiB stream window, 16 MiB connection
/// window, 1 MiB frames, 200 concurrent streams (server), PING every 10 s with a 20 s timeout.
/// Out-of-range values are clamped to what HTTP/2 allows rather than rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct H2Settings {
    /// Initial per-stream receive window (`HTTP2_STREAM_WINDOW_SIZE`).
    pub stream_window: u32,
    /// Initial connection receive window (`HTTP2_CONNECTION_WINDOW_SIZE`).
    pub connection_window: u32,
    /// Largest frame we accept (`HTTP2_FRAME_SIZE`).
    pub frame_size: u32,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` the server advertises (client: unused).
    pub max_concurrent_streams: u32,
    /// PING the peer this often (the first after one interval). Zero disables keepalive.
    pub ping_interval: Duration,
    /// Close the connection when a PING is not answered within this time.
    pub ping_timeout: Duration,
    /// Server: close a connection that had no open stream for this long (GOAWAY
    /// `NO_ERROR`). Longer than clients keep idle pooled connections, so it only ends
    /// connections their clients forgot. Zero never closes them.
    pub idle_timeout: Duration,
    /// Server: streams a client may open per second on one connection, sustained; one
    /// opening faster is abusive and gets GOAWAY `ENHANCE_YOUR_CALM`. Zero: no limit.
    pub max_stream_rate: u32,
    /// Server: streams a client may open at once before [`H2Settings::max_stream_rate`]
    /// applies.
    pub stream_burst: u32,
}

/// `HTTP2_STREAM_WINDOW_SIZE` default.
pub const DEFAULT_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// `HTTP2_CONNECTION_WINDOW_SIZE` default.
pub const DEFAULT_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// `HTTP2_FRAME_SIZE` default.
pub const DEFAULT_FRAME_SIZE: u32 = 1024 * 1024;
/// Server `SETTINGS_MAX_CONCURRENT_STREAMS`.
pub const DEFAULT_SERVER_MAX_CONCURRENT_STREAMS: u32 = 200;

/// Server idle timeout: twice the pool's default idle release (`POOL_UNUSED_RELEASE_TIMEOUT`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Server stream-open rate per connection: several times what a pooled connection
/// carries at this machine's peak connection rates (BENCHMARKS.md).
pub const DEFAULT_MAX_STREAM_RATE: u32 = 10_000;
/// Server stream-open burst per connection: ten times the concurrent-stream limit.
pub const DEFAULT_STREAM_BURST: u32 = 2_000;

/// Largest flow-control window HTTP/2 allows (2^31 - 1).
const MAX_WINDOW: u32 = (1 << 31) - 1;
/// HTTP/2 default (and smallest meaningful) window.
const MIN_WINDOW: u32 = 65_535;
/// Frame size bounds from RFC 9113 §6.5.2 (h2 panics outside them).
const MIN_FRAME: u32 = 16_384;
const MAX_FRAME: u32 = (1 << 24) - 1;

impl Default for H2Settings {
    fn default() -> Self {
        H2Settings {
            stream_window: DEFAULT_STREAM_WINDOW,
            connection_window: DEFAULT_CONNECTION_WINDOW,
            frame_size: DEFAULT_FRAME_SIZE,
            max_concurrent_streams: DEFAULT_SERVER_MAX_CONCURRENT_STREAMS,
            ping_interval: Duration::from_secs(10),
            ping_timeout: Duration::from_secs(20),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_stream_rate: DEFAULT_MAX_STREAM_RATE,
            stream_burst: DEFAULT_STREAM_BURST,
        }
    }
}

impl H2Settings {
    pub(crate) fn stream_window(&self) -> u32 {
        self.stream_window.clamp(MIN_WINDOW, MAX_WINDOW)
    }
    pub(crate) fn connection_window(&self) -> u32 {
        self.connection_window.clamp(MIN_WINDOW, MAX_WINDOW)
    }
    pub(crate) fn frame_size(&self) -> u32 {
        self.frame_size.clamp(MIN_FRAME, MAX_FRAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_ztunnel() {
        let s = H2Settings::default();
        assert_eq!(s.stream_window, 4_194_304);
        assert_eq!(s.connection_window, 16_777_216);
        assert_eq!(s.frame_size, 1_048_576);
        assert_eq!(s.max_concurrent_streams, 200);
        assert_eq!(s.ping_interval, Duration::from_secs(10));
        assert_eq!(s.ping_timeout, Duration::from_secs(20));
    }

    #[test]
    fn clamped() {
        let s = H2Settings {
            stream_window: 0,
            connection_window: u32::MAX,
            frame_size: 1,
            ..Default::default()
        };
        assert_eq!(s.stream_window(), 65_535);
        assert_eq!(s.connection_window(), (1 << 31) - 1);
        assert_eq!(s.frame_size(), 16_384);
        let s = H2Settings {
            frame_size: u32::MAX,
            ..Default::default()
        };
        assert_eq!(s.frame_size(), (1 << 24) - 1);
    }
}
