//! Logs through `tracing`: `RUST_LOG` (default `info`), `LOG_FORMAT=plain|json` in
//! ztunnel's layouts ([`crate::log_format`]), and a handle the admin endpoint uses to
//! change the level at run time.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::log_format::{Layout, ZtunnelFormat};

pub const DEFAULT_FILTER: &str = "info";

/// Changes the log filter of the running process.
#[derive(Clone)]
pub struct LogHandle {
    handle: reload::Handle<EnvFilter, Registry>,
    initial: String,
}

impl LogHandle {
    pub fn current(&self) -> String {
        self.handle
            .with_current(|f| f.to_string())
            .unwrap_or_default()
    }

    /// `spec` is a `RUST_LOG`-style filter: a level, or `target=level` clauses.
    pub fn set(&self, spec: &str) -> Result<(), String> {
        let filter =
            EnvFilter::try_new(spec).map_err(|e| format!("invalid level {spec:?}: {e}"))?;
        self.handle.reload(filter).map_err(|e| e.to_string())
    }

    pub fn reset(&self) -> Result<(), String> {
        self.set(&self.initial.clone())
    }

    /// A handle on a filter layer of its own, not installed as the process's subscriber
    /// (for tests of the admin endpoint): the layer must outlive the handle's use.
    pub fn detached(spec: &str) -> (LogHandle, reload::Layer<EnvFilter, Registry>) {
        let (layer, handle) = reload::Layer::new(EnvFilter::new(spec));
        let handle = LogHandle {
            handle,
            initial: spec.to_string(),
        };
        (handle, layer)
    }
}

/// Flushes the log writer when dropped: keep it until the process ends.
pub type LogGuard = tracing_appender::non_blocking::WorkerGuard;

/// Installs the subscriber. Lines go to stdout from a writer thread, so a worker never
/// blocks on stdout for an access log line; when its buffer is full writers wait rather
/// than drop lines.
pub fn init() -> Result<(LogHandle, LogGuard), String> {
    init_with(None, None)
}

/// [`init`] with a filter and a layout chosen by the caller (command-line flags); `None`
/// falls back to `RUST_LOG` and `LOG_FORMAT`.
pub fn init_with(
    filter: Option<String>,
    json: Option<bool>,
) -> Result<(LogHandle, LogGuard), String> {
    let spec = filter.unwrap_or_else(|| {
        std::env::var("RUST_LOG").unwrap_or_else(|_| DEFAULT_FILTER.to_string())
    });
    let filter =
        EnvFilter::try_new(&spec).map_err(|e| format!("log filter {spec:?} is not valid: {e}"))?;
    let (filter, handle) = reload::Layer::new(filter);
    let json = match (json, std::env::var("LOG_FORMAT").as_deref()) {
        (Some(j), _) => j,
        (None, Err(_) | Ok("plain")) => false,
        (None, Ok("json")) => true,
        (None, Ok(other)) => {
            return Err(format!(
                "LOG_FORMAT={other:?} is not valid: expected plain or json"
            ))
        }
    };
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(10_000)
        .thread_name("ambit-log")
        // The worker flushes whenever it has drained its queue: through a BufWriter the lines
        // that queued up meanwhile reach stdout in one write, not one write each (at high
        // connection rates, a write per access log line was a syscall per connection).
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stdout(),
        ));
    let layout = if json { Layout::Json } else { Layout::Plain };
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .event_format(ZtunnelFormat(layout))
                .with_writer(writer),
        )
        .init();
    Ok((
        LogHandle {
            handle,
            initial: spec,
        },
        guard,
    ))
}
