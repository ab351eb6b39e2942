//! Bad input at `ambit waypoint`, each bounded with nothing else harmed, sent as raw bytes
//! by a client in the client node (through its node proxy and HBONE, as any app's would):
//! HTTP/1.1 request smuggling shapes, oversized and too many headers, a body larger than
//! any buffer; HTTP/2 rapid reset, a CONTINUATION flood and an HPACK bomb. After each, a
//! well-formed request on a new connection is still served.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::l7::L7Lab;
use ambit_netns_lab::mesh::{SERVICE_PORT, SERVICE_VIP};

fn launch(tag: &str) -> L7Lab {
    L7Lab::launch(tag, Path::new(env!("CARGO_BIN_EXE_ambit")), "").unwrap()
}

fn raw(lab: &L7Lab) -> TcpStream {
    let s = lab
        .nodes
        .connect_from_client(SocketAddr::from((SERVICE_VIP, SERVICE_PORT)))
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Sends `bytes` and reads what comes back until the connection closes (or 20 s pass).
fn exchange(lab: &L7Lab, bytes: &[u8]) -> String {
    let mut s = raw(lab);
    // The server may answer and close before it has read everything: that is fine.
    let _ = s.write_all(bytes);
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    String::from_utf8_lossy(&back).into_owned()
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

fn still_serves(lab: &L7Lab) {
    let r = lab.http1(&[("GET", "/after")]).unwrap();
    assert_eq!(r[0].status, 200, "{r:?}\n{}", lab.waypoint_log());
}

#[test]
fn http1_smuggling_shapes_and_oversized_heads_are_refused() {
    let lab = launch("wp-bad1");
    let host = "Host: echo.default.svc.cluster.local\r\n";
    let big_header = format!("X-Big: {}\r\n", "a".repeat(70 * 1024));
    let many_headers: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "two different Content-Lengths",
            format!("POST / HTTP/1.1\r\n{host}Content-Length: 4\r\nContent-Length: 40\r\n\r\nping"),
            "HTTP/1.1 400",
        ),
        (
            "an obs-fold continuation line",
            format!("GET / HTTP/1.1\r\n{host}X-A: one\r\n two\r\n\r\n"),
            "HTTP/1.1 400",
        ),
        (
            "a header over the head limit",
            format!("GET / HTTP/1.1\r\n{host}{big_header}\r\n"),
            "HTTP/1.1 431",
        ),
        (
            "more headers than allowed",
            format!("GET / HTTP/1.1\r\n{host}{many_headers}\r\n"),
            "HTTP/1.1 431",
        ),
        (
            "a lower-case method",
            format!("get / HTTP/1.1\r\n{host}\r\n"),
            "HTTP/1.1 400",
        ),
        (
            "a NUL in the path",
            format!("GET /a%00b HTTP/1.1\r\n{host}\r\n"),
            "HTTP/1.1 400",
        ),
    ];
    for (what, request, want) in cases {
        let answer = exchange(&lab, request.as_bytes());
        assert!(
            status_line(&answer).starts_with(want),
            "{what}: {answer:?}\n{}",
            lab.waypoint_log()
        );
        assert!(
            !answer.contains("smuggled"),
            "{what}: a second request was read out of the first's body: {answer:?}"
        );
        still_serves(&lab);
    }
}

/// Both framings: the chunked one is read (RFC 9112 §6.1), Content-Length dropped, and the
/// connection closed after the answer, so the bytes after the chunked body are never read
/// as a second request. (Envoy answers 400 instead; either way nothing is smuggled.)
#[test]
fn content_length_beside_transfer_encoding_smuggles_nothing() {
    let lab = launch("wp-bad5");
    let host = "Host: echo.default.svc.cluster.local\r\n";
    let answer = exchange(
        &lab,
        format!("POST / HTTP/1.1\r\n{host}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n{host}\r\n").as_bytes(),
    );
    assert_eq!(
        answer.matches("HTTP/1.1 ").count(),
        1,
        "one request, one answer: {answer:?}"
    );
    assert!(answer.contains("connection: close"), "{answer:?}");
    assert!(
        answer.contains(" POST / 0 "),
        "the app got an empty body: {answer:?}"
    );
    assert!(!answer.contains("smuggled"), "{answer:?}");
    still_serves(&lab);
}

#[test]
fn a_body_larger_than_any_buffer_streams_through() {
    let lab = launch("wp-bad2");
    let size = 8 * 1024 * 1024;
    let mut s = raw(&lab);
    let head = format!(
        "POST /big HTTP/1.1\r\nHost: echo.default.svc.cluster.local\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    for _ in 0..size / chunk.len() {
        s.write_all(&chunk).unwrap();
    }
    let mut back = String::new();
    s.read_to_string(&mut back).unwrap();
    assert!(status_line(&back).starts_with("HTTP/1.1 200"), "{back}");
    assert!(
        back.contains(&format!("POST /big {size} ")),
        "the app got every byte: {back}"
    );
    still_serves(&lab);
}

#[test]
fn a_client_slow_to_send_its_head_is_closed() {
    let lab = launch("wp-bad3");
    let mut s = raw(&lab);
    s.write_all(b"GET / HTTP/1.1\r\nHost: echo").unwrap();
    // The waypoint allows 10 s for a head; the read gives up after 30.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut back = Vec::new();
    let closed = s.read_to_end(&mut back);
    assert!(
        closed.is_ok(),
        "the connection was closed, not left open: {closed:?}"
    );
    still_serves(&lab);
}

// --- HTTP/2, as raw frames -------------------------------------------------------------

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK block for `GET /` on the service, literals without indexing (no Huffman).
fn request_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x84, 0x86]; // :method GET, :path /, :scheme http
    let authority = b"echo.default.svc.cluster.local";
    b.push(0x01); // :authority, literal without indexing, indexed name 1
    b.push(authority.len() as u8);
    b.extend_from_slice(authority);
    b
}

/// How a connection ended, as seen by the client.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The server sent GOAWAY with this error code.
    GoAway(u32),
    /// The server closed (or reset) the connection without one.
    Closed,
    /// Nothing for 20 s: the server kept the connection open.
    StillOpen,
}

/// Reads frames until a GOAWAY or the end of the connection.
fn read_until_goaway(s: &mut TcpStream) -> End {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let kind = buf[3];
            if kind == GOAWAY && len >= 8 {
                return End::GoAway(u32::from_be_bytes(buf[13..17].try_into().unwrap()));
            }
            buf.drain(..9 + len);
        }
        match s.read(&mut chunk) {
            Ok(0) => return End::Closed,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return End::StillOpen
            }
            Err(_) => return End::Closed,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

const DATA: u8 = 0x0;
/// Not a frame type: the connection closed.
const CLOSED: u8 = 0xff;

/// Every frame (type, stream, flags) until the connection closes (then a [`CLOSED`] entry)
/// or is quiet for 5 s.
fn frames_until_quiet(s: &mut TcpStream) -> Vec<(u8, u32, u8)> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut seen = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let stream = u32::from_be_bytes(buf[5..9].try_into().unwrap()) & 0x7fff_ffff;
            seen.push((buf[3], stream, buf[4]));
            buf.drain(..9 + len);
        }
        match s.read(&mut chunk) {
            Ok(0) => {
                seen.push((CLOSED, 0, 0));
                return seen;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return seen
            }
            Err(_) => {
                seen.push((CLOSED, 0, 0));
                return seen;
            }
        }
    }
}

fn h2_connection(lab: &L7Lab) -> TcpStream {
    let mut s = raw(lab);
    s.write_all(PREFACE).unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    s
}

#[test]
fn http2_abuse_is_bounded() {
    let lab = launch("wp-bad4");
    const ENHANCE_YOUR_CALM: u32 = 0xb;

    // Rapid reset: streams opened and reset at once, far past the allowance.
    let mut s = h2_connection(&lab);
    let mut burst = Vec::new();
    for i in 0..400u32 {
        let id = 1 + 2 * i;
        burst.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &request_block(),
        ));
        burst.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes())); // CANCEL
    }
    let _ = s.write_all(&burst);
    let end = read_until_goaway(&mut s);
    assert_eq!(
        end,
        End::GoAway(ENHANCE_YOUR_CALM),
        "rapid reset ends the connection"
    );
    still_serves(&lab);

    // A CONTINUATION flood: one header block that never ends.
    let mut s = h2_connection(&lab);
    let _ = s.write_all(&frame(HEADERS, END_STREAM, 1, &request_block()));
    let junk_block: Vec<u8> = {
        // Literal headers without indexing, new names: 16 KiB per frame.
        let mut b = Vec::new();
        while b.len() < 16 * 1024 - 64 {
            b.extend_from_slice(&[0x00, 0x05]);
            b.extend_from_slice(b"x-pad");
            b.push(40);
            b.extend_from_slice(&[b'v'; 40]);
        }
        b
    };
    let mut flooded = false;
    for _ in 0..512 {
        if s.write_all(&frame(CONTINUATION, 0, 1, &junk_block))
            .is_err()
        {
            flooded = true;
            break;
        }
    }
    let end = read_until_goaway(&mut s);
    eprintln!("CONTINUATION flood: refused while sending: {flooded}, then {end:?}");
    assert!(
        flooded || end != End::StillOpen,
        "a header block past the limit ends the connection: {end:?}"
    );
    still_serves(&lab);

    // An HPACK bomb: one 4 KiB header put in the dynamic table, then referenced 2,000
    // times in a small block (8 MiB once decoded).
    let mut s = h2_connection(&lab);
    let mut block = request_block();
    block.push(0x40); // literal with incremental indexing, new name
    block.push(5);
    block.extend_from_slice(b"x-big");
    block.extend_from_slice(&[0x7f, 0x81, 0x1f]); // length 4096 (127 + 3969)
    block.extend_from_slice(&[b'b'; 4096]);
    block.extend(std::iter::repeat_n(0xbe, 2000)); // indexed: dynamic entry 62
    let _ = s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
    // Refused one way or another (the stream reset or answered without a body, or the
    // connection ended), and never an app's answer: no DATA on the stream.
    let seen = frames_until_quiet(&mut s);
    assert!(
        !seen
            .iter()
            .any(|&(kind, stream, _)| kind == DATA && stream == 1),
        "the bomb's request reached an app: {seen:?}"
    );
    let refused = seen.iter().any(|&(kind, stream, flags)| {
        (kind == RST_STREAM && stream == 1)
            || kind == GOAWAY
            || (kind == HEADERS && stream == 1 && flags & END_STREAM != 0)
            || kind == CLOSED
    });
    assert!(refused, "the bomb was neither refused nor ended: {seen:?}");
    still_serves(&lab);
}
