//! Shared by the integration tests: a raw HTTPS client (so tests see the exact bytes the
//! server sends) and checks that the independent clients are installed.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ambit_fake_apiserver::ApiServer;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A response read to the end of the connection.
pub struct Raw {
    pub status: u16,
    pub head: String,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// Whether a chunked body ended with its terminating chunk (a clean end).
    pub complete: bool,
}

impl Raw {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Newline-delimited JSON (watch events).
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("a JSON line"))
            .collect()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

fn dechunk(mut b: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(nl) = b.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap_or("x").trim(), 16);
        let Ok(size) = size else { return (out, false) };
        if size == 0 {
            return (out, true);
        }
        let start = nl + 2;
        if b.len() < start + size {
            out.extend_from_slice(&b[start..]);
            return (out, false);
        }
        out.extend_from_slice(&b[start..start + size]);
        b = b.get(start + size + 2..).unwrap_or_default();
    }
}

/// Sends one request (`Connection: close`) and reads the response to the end.
pub async fn raw(
    api: &ApiServer,
    method: &str,
    target: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Raw {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(api.ca_pem().as_bytes()) {
        roots.add(c.expect("a CA PEM")).expect("a CA");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(api.addr())
        .await
        .expect("connect");
    let name = ServerName::IpAddress(api.addr().ip().into());
    let mut tls = connector
        .connect(name, tcp)
        .await
        .expect("TLS to the API server");
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        api.addr(),
        body.len()
    );
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(ct) = content_type {
        req.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    req.push_str("\r\n");
    tls.write_all(req.as_bytes()).await.unwrap();
    tls.write_all(body).await.unwrap();
    let mut buf = Vec::new();
    // A connection cut mid-stream ends in an error after the bytes that did arrive.
    let _ = tls.read_to_end(&mut buf).await;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let rest = &buf[split + 4..];
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let (body, complete) = if chunked {
        dechunk(rest)
    } else {
        (rest.to_vec(), true)
    };
    Raw {
        status,
        head,
        body,
        complete,
    }
}

/// Waits until `f` holds, polling; panics with `what` after 20 s.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Panics, naming the Debian package, when `tool` is not on PATH.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed: install the Debian package {package} (scripts/test does)"
    );
}
