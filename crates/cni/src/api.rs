//! The node agent's "pod events" API.
//!
//! Transport: a Unix stream socket (default [`DEFAULT_AGENT_SOCKET`]). One request per
//! connection: the client writes one JSON [`AgentRequest`] followed by `\n`, the agent
//! answers with one JSON [`AgentResponse`] followed by `\n` and closes.
//!
//! ```text
//! -> {"op":"add","uid":"…","name":"web-0","namespace":"shop","serviceAccount":"web",
//!     "netns":"/var/run/netns/cni-…","ips":["10.1.0.5","fd00::5"],"containerId":"…"}
//! <- {"ok":true,"pods":[]}
//! -> {"op":"check","uid":"…"}
//! <- {"ok":false,"error":"pod … is not enrolled","pods":[]}
//! ```
//!
//! Meaning of the operations (what the agent implements):
//!
//! - `add`: enroll the pod (rules in its netns, hand it to the node proxy). Must be
//!   idempotent: the runtime retries failed ADDs. `ok` only once capture is in place.
//! - `remove`: forget the pod. Unknown uids are not an error.
//! - `check`: `ok: true` iff the uid is enrolled (`pods` may carry its [`PodInfo`]);
//!   `ok: false` with an `error` saying why otherwise.
//! - `list`: `ok: true` with every enrolled pod in `pods`.
//!
//! Unknown fields are ignored on both sides so either end can grow.

use std::io::{self, BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Where the node agent listens for pod events unless configured otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = ambit_wellknown::paths::AGENT_EVENTS_SOCKET;

/// How long the plugin waits for the agent by default (connect + request + answer).
/// The agent answers an ADD only after the pod is captured, which includes a round trip
/// to the node proxy; Istio's plugin uses the same 5 s budget.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest request the agent accepts (one line, newline excluded).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Largest response the client accepts (a `list` on a busy node can be large).
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A request to the node agent.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum AgentRequest {
    /// Enroll a pod (idempotent).
    Add(PodInfo),
    /// Forget a pod (unknown uids are fine).
    Remove { uid: String },
    /// Is this pod enrolled?
    Check { uid: String },
    /// Every enrolled pod.
    List,
}

/// What the agent needs to know to enroll a pod.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    /// Kubernetes pod UID (the container id for runtimes that give none).
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    /// Path of the pod's network namespace, as the runtime gave it (`CNI_NETNS`).
    pub netns: String,
    /// The pod's addresses (no prefix length), IPv4-mapped IPv6 already unmapped.
    pub ips: Vec<IpAddr>,
    /// The sandbox container id (`CNI_CONTAINERID`), when known.
    #[serde(default)]
    pub container_id: String,
}

/// The agent's answer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentResponse {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub pods: Vec<PodInfo>,
}

impl AgentResponse {
    /// `{"ok": true}`.
    pub fn ok() -> Self {
        AgentResponse {
            ok: true,
            error: None,
            pods: Vec::new(),
        }
    }

    /// `{"ok": true, "pods": [...]}`.
    pub fn with_pods(pods: Vec<PodInfo>) -> Self {
        AgentResponse {
            ok: true,
            error: None,
            pods,
        }
    }

    /// `{"ok": false, "error": msg}`.
    pub fn error(msg: impl Into<String>) -> Self {
        AgentResponse {
            ok: false,
            error: Some(msg.into()),
            pods: Vec::new(),
        }
    }
}

/// Why [`call`] did not get a positive answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentCallError {
    /// Could not connect: the agent is not running (no socket, connection refused) or
    /// the path is unusable. Retrying later can help.
    #[error("cannot connect to the agent: {0}")]
    Unreachable(#[source] io::Error),
    /// The agent did not finish within the time budget. Retrying later can help.
    #[error("no answer from the agent within {after:?} (while {stage})")]
    Timeout {
        after: Duration,
        stage: &'static str,
    },
    /// The connection broke after it was established (the agent crashed or closed
    /// early). Retrying later can help.
    #[error("connection to the agent broke while {stage}: {source}")]
    Broken {
        stage: &'static str,
        #[source]
        source: io::Error,
    },
    /// The agent answered something that is not an [`AgentResponse`] (version skew?).
    #[error("the agent sent an invalid response: {0}")]
    Protocol(String),
    /// The agent answered `ok: false`; the message is the agent's `error`.
    #[error("{0}")]
    Rejected(String),
}

impl AgentCallError {
    /// Whether trying again later may succeed without anyone changing anything
    /// (the agent was down, slow or restarting).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AgentCallError::Unreachable(_)
                | AgentCallError::Timeout { .. }
                | AgentCallError::Broken { .. }
        )
    }
}

/// Sends `req` to the agent at `socket` and waits for the answer, all within `timeout`
/// (connect, write and read share the budget). `ok: false` answers become
/// [`AgentCallError::Rejected`].
pub fn call(
    socket: &Path,
    req: &AgentRequest,
    timeout: Duration,
) -> Result<AgentResponse, AgentCallError> {
    let deadline = Instant::now() + timeout;
    let remaining = |stage: &'static str| -> Result<Duration, AgentCallError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(AgentCallError::Timeout {
                after: timeout,
                stage,
            })
        } else {
            Ok(left)
        }
    };

    let stream = connect_within(socket, remaining("connecting")?, timeout)?;

    let mut line = serde_json::to_vec(req)
        .map_err(|e| AgentCallError::Protocol(format!("cannot encode the request: {e}")))?;
    line.push(b'\n');
    let io_err = |stage: &'static str, e: io::Error| -> AgentCallError {
        if is_timeout(&e) {
            AgentCallError::Timeout {
                after: timeout,
                stage,
            }
        } else {
            AgentCallError::Broken { stage, source: e }
        }
    };
    stream
        .set_write_timeout(Some(remaining("sending the request")?))
        .map_err(|e| io_err("sending the request", e))?;
    (&stream)
        .write_all(&line)
        .map_err(|e| io_err("sending the request", e))?;
    // Tell servers that read to EOF that the request is complete. Not fatal if it fails.
    let _ = stream.shutdown(std::net::Shutdown::Write);

    let mut reader = BufReader::new(&stream);
    let mut before_read = || -> Result<(), AgentCallError> {
        let left = remaining("waiting for the answer")?;
        reader_timeout(&stream, left).map_err(|e| io_err("waiting for the answer", e))
    };
    let (buf, _) = read_line_capped(&mut reader, MAX_RESPONSE_BYTES, &mut before_read).map_err(
        |e| match e {
            LineError::TooLarge => AgentCallError::Protocol(format!(
                "the answer is larger than {MAX_RESPONSE_BYTES} bytes"
            )),
            LineError::Io(e) => io_err("waiting for the answer", e),
            LineError::Hook(e) => e,
        },
    )?;
    let text = trim_line(&buf);
    if text.is_empty() {
        return Err(AgentCallError::Protocol(
            "the agent closed the connection without answering".into(),
        ));
    }
    let resp: AgentResponse = serde_json::from_slice(text)
        .map_err(|e| AgentCallError::Protocol(format!("{e} (answer: {})", preview(text))))?;
    if resp.ok {
        Ok(resp)
    } else {
        Err(AgentCallError::Rejected(match resp.error {
            Some(msg) if !msg.trim().is_empty() => msg,
            _ => "the agent refused the request without saying why".into(),
        }))
    }
}

fn reader_timeout(stream: &UnixStream, left: Duration) -> io::Result<()> {
    stream.set_read_timeout(Some(left))
}

/// `UnixStream::connect` has no timeout, and a listener that stopped accepting (full
/// backlog) makes it block. Connect on a helper thread and stop waiting at the budget;
/// a late connection is dropped by the thread itself.
fn connect_within(
    socket: &Path,
    left: Duration,
    total: Duration,
) -> Result<UnixStream, AgentCallError> {
    let (tx, rx) = mpsc::sync_channel(1);
    let path: PathBuf = socket.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("ambit-cni-connect".into())
        .spawn(move || {
            let _ = tx.send(UnixStream::connect(&path));
        });
    if spawned.is_err() {
        // No thread available: connect inline (almost always immediate on Unix sockets).
        return UnixStream::connect(socket).map_err(AgentCallError::Unreachable);
    }
    match rx.recv_timeout(left) {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(AgentCallError::Unreachable(e)),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(AgentCallError::Timeout {
            after: total,
            stage: "connecting",
        }),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(AgentCallError::Unreachable(
            io::Error::other("the connecting thread ended without a result"),
        )),
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Why the agent could not read a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    #[error("request is larger than {MAX_REQUEST_BYTES} bytes")]
    TooLarge,
    #[error("empty request")]
    Empty,
    #[error("cannot read the request: {0}")]
    Io(#[from] io::Error),
    #[error("not a valid ambit agent request: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// Server side: reads one request line (at most [`MAX_REQUEST_BYTES`]; a missing final
/// newline at EOF is tolerated) and decodes it. Set a read timeout on the socket first.
pub fn read_request(stream: &mut impl BufRead) -> Result<AgentRequest, RequestError> {
    let (buf, _) = read_line_capped(stream, MAX_REQUEST_BYTES, &mut || {
        Ok::<(), std::convert::Infallible>(())
    })
    .map_err(|e| match e {
        LineError::TooLarge => RequestError::TooLarge,
        LineError::Io(e) => RequestError::Io(e),
        LineError::Hook(never) => match never {},
    })?;
    parse_request(&buf)
}

/// Decodes one request line (for agents that do their own, e.g. async, I/O).
pub fn parse_request(line: &[u8]) -> Result<AgentRequest, RequestError> {
    if line.len() > MAX_REQUEST_BYTES + 2 {
        return Err(RequestError::TooLarge);
    }
    let text = trim_line(line);
    if text.is_empty() {
        return Err(RequestError::Empty);
    }
    Ok(serde_json::from_slice(text)?)
}

/// Encodes a response line, newline included (for agents that do their own I/O).
pub fn encode_response(resp: &AgentResponse) -> Vec<u8> {
    let mut out = match serde_json::to_vec(resp) {
        Ok(v) => v,
        // Serializing these plain types cannot fail; answer something valid anyway.
        Err(_) => {
            br#"{"ok":false,"error":"internal error: cannot encode response","pods":[]}"#.to_vec()
        }
    };
    out.push(b'\n');
    out
}

/// Server side: writes one response line and flushes.
pub fn write_response(stream: &mut impl Write, resp: &AgentResponse) -> io::Result<()> {
    stream.write_all(&encode_response(resp))?;
    stream.flush()
}

enum LineError<H> {
    TooLarge,
    Io(io::Error),
    Hook(H),
}

/// Reads up to the first `\n` (excluded) or EOF, refusing more than `cap` bytes.
/// `before_read` runs before every read (deadline bookkeeping). Returns the bytes and
/// whether a newline ended them.
fn read_line_capped<R: BufRead + ?Sized, H>(
    r: &mut R,
    cap: usize,
    before_read: &mut dyn FnMut() -> Result<(), H>,
) -> Result<(Vec<u8>, bool), LineError<H>> {
    let mut buf = Vec::new();
    loop {
        before_read().map_err(LineError::Hook)?;
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(LineError::Io(e)),
        };
        if avail.is_empty() {
            return Ok((buf, false));
        }
        if let Some(pos) = avail.iter().position(|&b| b == b'\n') {
            if buf.len() + pos > cap {
                return Err(LineError::TooLarge);
            }
            buf.extend_from_slice(&avail[..pos]);
            r.consume(pos + 1);
            return Ok((buf, true));
        }
        let n = avail.len();
        if buf.len() + n > cap {
            return Err(LineError::TooLarge);
        }
        buf.extend_from_slice(avail);
        r.consume(n);
    }
}

fn trim_line(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |p| p + 1);
    &b[start..end.max(start)]
}

fn preview(b: &[u8]) -> String {
    const MAX: usize = 200;
    let s = String::from_utf8_lossy(&b[..b.len().min(MAX)]);
    if b.len() > MAX {
        format!("{s}…")
    } else {
        s.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread;

    /// A unique temporary directory removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "ambit-cni-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn pod() -> PodInfo {
        PodInfo {
            uid: "1234-abcd".into(),
            name: "web-0".into(),
            namespace: "shop".into(),
            service_account: "web".into(),
            netns: "/var/run/netns/cni-1".into(),
            ips: vec!["10.1.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
            container_id: "c0ffee".into(),
        }
    }

    /// Serves `n` connections with `handler`, in a thread.
    fn serve(
        dir: &TempDir,
        n: usize,
        handler: impl Fn(AgentRequest) -> AgentResponse + Send + 'static,
    ) -> (PathBuf, thread::JoinHandle<Vec<AgentRequest>>) {
        let path = dir.0.join("agent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let h = thread::spawn(move || {
            let mut seen = Vec::new();
            for _ in 0..n {
                let (s, _) = listener.accept().unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut r = BufReader::new(&s);
                let req = read_request(&mut r).unwrap();
                seen.push(req.clone());
                write_response(&mut &s, &handler(req)).unwrap();
            }
            seen
        });
        (path, h)
    }

    #[test]
    fn wire_format() {
        let add = serde_json::to_value(AgentRequest::Add(pod())).unwrap();
        assert_eq!(
            add,
            serde_json::json!({"op":"add","uid":"1234-abcd","name":"web-0","namespace":"shop",
                "serviceAccount":"web","netns":"/var/run/netns/cni-1",
                "ips":["10.1.0.5","fd00::5"],"containerId":"c0ffee"})
        );
        assert_eq!(
            serde_json::to_string(&AgentRequest::Remove { uid: "u".into() }).unwrap(),
            r#"{"op":"remove","uid":"u"}"#
        );
        assert_eq!(
            serde_json::to_string(&AgentRequest::Check { uid: "u".into() }).unwrap(),
            r#"{"op":"check","uid":"u"}"#
        );
        assert_eq!(
            serde_json::to_string(&AgentRequest::List).unwrap(),
            r#"{"op":"list"}"#
        );
        assert_eq!(
            serde_json::to_string(&AgentResponse::ok()).unwrap(),
            r#"{"ok":true,"pods":[]}"#
        );
        assert_eq!(
            serde_json::to_string(&AgentResponse::error("nope")).unwrap(),
            r#"{"ok":false,"error":"nope","pods":[]}"#
        );
        // Defaults and unknown fields.
        let r: AgentResponse = serde_json::from_str(r#"{"ok":true,"future":1}"#).unwrap();
        assert_eq!(r, AgentResponse::ok());
        let req: AgentRequest = serde_json::from_str(
            r#"{"op":"add","uid":"u","name":"n","namespace":"ns","serviceAccount":"sa",
                "netns":"/x","ips":[],"extra":true}"#,
        )
        .unwrap();
        match req {
            AgentRequest::Add(p) => assert_eq!(p.container_id, ""),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn read_request_limits() {
        let mut ok = Cursor::new(b"{\"op\":\"list\"}\n{\"op\":\"garbage\"}\n".to_vec());
        assert_eq!(read_request(&mut ok).unwrap(), AgentRequest::List);
        // No newline at EOF is tolerated, and CRLF too.
        let mut c = Cursor::new(b"{\"op\":\"check\",\"uid\":\"x\"}\r\n".to_vec());
        assert_eq!(
            read_request(&mut c).unwrap(),
            AgentRequest::Check { uid: "x".into() }
        );
        let mut c = Cursor::new(b"{\"op\":\"list\"}".to_vec());
        assert_eq!(read_request(&mut c).unwrap(), AgentRequest::List);
        let mut c = Cursor::new(b"\n".to_vec());
        assert!(matches!(read_request(&mut c), Err(RequestError::Empty)));
        let mut c = Cursor::new(b"{\"op\":\"fly\"}\n".to_vec());
        assert!(matches!(
            read_request(&mut c),
            Err(RequestError::Invalid(_))
        ));
        let mut big = vec![b' '; MAX_REQUEST_BYTES + 1];
        big.push(b'\n');
        let mut c = Cursor::new(big);
        assert!(matches!(read_request(&mut c), Err(RequestError::TooLarge)));
        // Exactly at the cap is fine (whitespace-padded valid request).
        let mut exact = b"{\"op\":\"list\"}".to_vec();
        exact.resize(MAX_REQUEST_BYTES, b' ');
        exact.push(b'\n');
        assert_eq!(
            read_request(&mut Cursor::new(exact)).unwrap(),
            AgentRequest::List
        );
        // Small BufReader capacity: the line spans many fill_buf calls.
        let line = serde_json::to_vec(&AgentRequest::Add(pod())).unwrap();
        let mut r = BufReader::with_capacity(3, Cursor::new([line, b"\n".to_vec()].concat()));
        assert_eq!(read_request(&mut r).unwrap(), AgentRequest::Add(pod()));
    }

    #[test]
    fn round_trip_over_unix_socket() {
        let dir = TempDir::new();
        let (path, server) = serve(&dir, 3, |req| match req {
            AgentRequest::Add(_) => AgentResponse::ok(),
            AgentRequest::List => AgentResponse::with_pods(vec![pod()]),
            _ => AgentResponse::error("pod u is not enrolled"),
        });
        let t = Duration::from_secs(5);
        assert_eq!(
            call(&path, &AgentRequest::Add(pod()), t).unwrap(),
            AgentResponse::ok()
        );
        assert_eq!(
            call(&path, &AgentRequest::List, t).unwrap().pods,
            vec![pod()]
        );
        match call(&path, &AgentRequest::Check { uid: "u".into() }, t) {
            Err(AgentCallError::Rejected(m)) => assert_eq!(m, "pod u is not enrolled"),
            other => panic!("{other:?}"),
        }
        let seen = server.join().unwrap();
        assert_eq!(
            seen,
            vec![
                AgentRequest::Add(pod()),
                AgentRequest::List,
                AgentRequest::Check { uid: "u".into() }
            ]
        );
    }

    #[test]
    fn unreachable_when_no_socket() {
        let dir = TempDir::new();
        let err = call(
            &dir.0.join("missing.sock"),
            &AgentRequest::List,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(err, AgentCallError::Unreachable(_)), "{err:?}");
        assert!(err.is_transient());
    }

    #[test]
    fn unreachable_when_socket_file_is_stale() {
        let dir = TempDir::new();
        let path = dir.0.join("stale.sock");
        drop(UnixListener::bind(&path).unwrap()); // file stays, nobody listens
        let err = call(&path, &AgentRequest::List, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, AgentCallError::Unreachable(_)), "{err:?}");
    }

    /// An agent that accepts and never answers: the call gives up on its own budget. The
    /// agent holds the connection until the call has returned (a minute at most, only to
    /// end a hang): without the budget the call would end only with the close, and not as a
    /// timeout.
    #[test]
    fn timeout_when_agent_is_silent() {
        let dir = TempDir::new();
        let path = dir.0.join("silent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (returned, wait_return) = mpsc::channel::<()>();
        let h = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let _ = wait_return.recv_timeout(Duration::from_secs(60));
            drop(s);
        });
        let err = call(&path, &AgentRequest::List, Duration::from_millis(200)).unwrap_err();
        let _ = returned.send(());
        h.join().unwrap();
        match err {
            AgentCallError::Timeout { after, stage } => {
                assert_eq!(after, Duration::from_millis(200));
                assert_eq!(stage, "waiting for the answer");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn protocol_errors() {
        let dir = TempDir::new();
        let path = dir.0.join("bad.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let h = thread::spawn(move || {
            for answer in [&b"not json\n"[..], b"", b"{\"ok\":false}\n"] {
                let (mut s, _) = listener.accept().unwrap();
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                s.write_all(answer).unwrap();
            }
        });
        let t = Duration::from_secs(5);
        let e = call(&path, &AgentRequest::List, t).unwrap_err();
        assert!(matches!(e, AgentCallError::Protocol(_)), "{e:?}");
        assert!(e.to_string().contains("not json"), "{e}");
        let e = call(&path, &AgentRequest::List, t).unwrap_err();
        assert!(matches!(e, AgentCallError::Protocol(_)), "{e:?}");
        let e = call(&path, &AgentRequest::List, t).unwrap_err();
        assert!(matches!(e, AgentCallError::Rejected(_)), "{e:?}");
        assert!(!e.is_transient());
        h.join().unwrap();
    }

    #[test]
    fn fuzz_parse_request_never_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let base = serde_json::to_vec(&AgentRequest::Add(pod())).unwrap();
        for _ in 0..5000 {
            let mut b = base.clone();
            for _ in 0..(next() % 8) {
                let i = (next() as usize) % b.len();
                match next() % 3 {
                    0 => b[i] = next() as u8,
                    1 => {
                        b.remove(i);
                    }
                    _ => b.insert(i, b"{}[]\":,\n\\0"[(next() % 10) as usize]),
                }
                if b.is_empty() {
                    b.push(b'{');
                }
            }
            let _ = parse_request(&b);
            let _ = read_request(&mut Cursor::new(b));
        }
    }
}
