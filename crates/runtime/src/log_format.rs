//! Log lines in ztunnel's layout, so what parses ztunnel's logs parses ours:
//!
//! - plain: `<RFC 3339 UTC time>\t<level>\t<scope>[:<span>{fields}]…\t<message>\t<k=v …>`,
//!   level in lower case, string values quoted, numbers, addresses and other displayed
//!   values bare;
//! - JSON: one object per line, `level`, `time`, `scope`, `message`, then the fields.
//!
//! The scope is the event's target without our crate prefix (`ambit::app` → `app`,
//! `ambit_nodeproxy::inbound` → `proxy::inbound`), as ztunnel strips `ztunnel::`.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Which of ztunnel's two layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Plain,
    Json,
}

pub struct ZtunnelFormat(pub Layout);

/// The scope ztunnel would print for a target of ours.
pub fn scope(target: &str) -> &str {
    if let Some(rest) = target.strip_prefix("ambit::") {
        return rest;
    }
    match target.strip_prefix("ambit_") {
        // ztunnel's own module is `proxy`; keep its scope names for log filters
        // and dashboards written against them.
        Some(rest) if rest == "nodeproxy" || rest.starts_with("nodeproxy::") => &rest[4..],
        Some(rest) if !rest.is_empty() => rest,
        _ => target,
    }
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    }
}

/// A field's value as recorded: strings keep their type so the plain layout can quote
/// them, everything formatted (`%x`, `?x`) is kept as its text.
#[derive(Debug, PartialEq)]
enum Value {
    Str(String),
    Text(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
}

#[derive(Default)]
struct Collect {
    message: String,
    fields: Vec<(&'static str, Value)>,
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.fields
                .push((field.name(), Value::Str(value.to_string())));
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.fields.push((field.name(), Value::Text(text)));
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.push((field.name(), Value::U64(value)));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.push((field.name(), Value::I64(value)));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.push((field.name(), Value::F64(value)));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.push((field.name(), Value::Bool(value)));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.fields
            .push((field.name(), Value::Str(value.to_string())));
    }
}

impl Collect {
    fn of(event: &Event<'_>) -> Collect {
        let mut c = Collect::default();
        event.record(&mut c);
        c
    }

    /// `k=v k="s" …`, ztunnel's plain field list.
    fn plain_fields(&self) -> String {
        let mut out = String::new();
        for (i, (name, value)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            let _ = match value {
                Value::Str(s) => write!(out, "{name}={s:?}"),
                Value::Text(t) => write!(out, "{name}={t}"),
                Value::U64(v) => write!(out, "{name}={v}"),
                Value::I64(v) => write!(out, "{name}={v}"),
                Value::F64(v) => write!(out, "{name}={v}"),
                Value::Bool(v) => write!(out, "{name}={v}"),
            };
        }
        out
    }

    fn json_fields(&self, obj: &mut serde_json::Map<String, serde_json::Value>) {
        for (name, value) in &self.fields {
            let v = match value {
                Value::Str(s) | Value::Text(s) => serde_json::Value::String(s.clone()),
                Value::U64(v) => (*v).into(),
                Value::I64(v) => (*v).into(),
                Value::F64(v) => serde_json::Number::from_f64(*v)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
                Value::Bool(v) => (*v).into(),
            };
            obj.insert((*name).to_string(), v);
        }
    }
}

impl<S, N> FormatEvent<S, N> for ZtunnelFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let collected = Collect::of(event);
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        match self.0 {
            Layout::Plain => {
                write!(
                    writer,
                    "{time}\t{}\t{}",
                    level_name(meta.level()),
                    scope(meta.target())
                )?;
                if let Some(spans) = ctx.event_scope() {
                    for span in spans.from_root() {
                        write!(writer, ":{}", span.name())?;
                        let ext = span.extensions();
                        if let Some(fields) = ext.get::<FormattedFields<N>>() {
                            if !fields.is_empty() {
                                write!(writer, "{{{fields}}}")?;
                            }
                        }
                    }
                }
                writeln!(
                    writer,
                    "\t{}\t{}",
                    collected.message,
                    collected.plain_fields()
                )
            }
            Layout::Json => {
                let mut obj = serde_json::Map::new();
                obj.insert("level".into(), level_name(meta.level()).into());
                obj.insert("time".into(), time.into());
                obj.insert("scope".into(), scope(meta.target()).into());
                obj.insert("message".into(), collected.message.clone().into());
                collected.json_fields(&mut obj);
                let line = serde_json::Value::Object(obj).to_string();
                writeln!(writer, "{line}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn capture(layout: Layout, f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(ZtunnelFormat(layout))
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, f);
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    fn access_line() {
        let addr: std::net::SocketAddr = "10.0.0.1:80".parse().unwrap();
        tracing::info!(
            target: "access",
            direction = "outbound",
            src.addr = %addr,
            src.workload = "client",
            bytes_sent = 11u64,
            duration = "5ms",
            "connection complete"
        );
    }

    #[test]
    fn plain_lines_have_ztunnels_columns_and_quoting() {
        let out = capture(Layout::Plain, access_line);
        let cols: Vec<&str> = out.trim_end_matches('\n').split('\t').collect();
        assert_eq!(cols.len(), 5, "{out:?}");
        assert!(cols[0].ends_with('Z') && cols[0].contains('T'), "{out:?}");
        assert_eq!(cols[1..4], ["info", "access", "connection complete"]);
        assert_eq!(
            cols[4],
            "direction=\"outbound\" src.addr=10.0.0.1:80 src.workload=\"client\" bytes_sent=11 duration=\"5ms\""
        );
        // No fields: the message still ends with a tab, as ztunnel's do.
        let out = capture(
            Layout::Plain,
            || tracing::warn!(target: "ambit_nodeproxy::inbound", "ready"),
        );
        assert!(
            out.ends_with("\twarn\tproxy::inbound\tready\t\n"),
            "{out:?}"
        );
    }

    #[test]
    fn json_lines_use_ztunnels_keys() {
        let out = capture(Layout::Json, access_line);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["scope"], "access");
        assert_eq!(v["message"], "connection complete");
        assert_eq!(v["src.addr"], "10.0.0.1:80");
        assert_eq!(v["src.workload"], "client");
        assert_eq!(v["bytes_sent"], 11);
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn scopes_drop_our_crate_prefix() {
        assert_eq!(scope("ambit::app"), "app");
        assert_eq!(scope("ambit_nodeproxy::inbound"), "proxy::inbound");
        assert_eq!(scope("ambit_nodeproxy"), "proxy");
        assert_eq!(scope("ambit_nodeproxyx::a"), "nodeproxyx::a");
        assert_eq!(scope("ambit_zds::x"), "zds::x");
        assert_eq!(scope("access"), "access");
        assert_eq!(scope("ambit"), "ambit");
        assert_eq!(scope("hyper_util::x"), "hyper_util::x");
    }
}
