//! Apps at the ends of the interop wires: a server that reads its client's whole request to
//! end of stream and only then answers (so a half-close must cross the mesh in one
//! direction while the other stays open), and the client that drives it. Payloads are
//! pseudo-random bytes from a seed, so a lost, repeated or reordered chunk shows.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

pub const MIB: usize = 1 << 20;

/// `len` bytes of xorshift64* output from `seed`.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    // Any seed, odd or even, gives a non-zero state of its own.
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The seed the server answers with, derived from the client's so the two directions differ.
pub fn answer_seed(seed: u64) -> u64 {
    seed.rotate_left(17) ^ 0x5eed
}

/// What the server saw of one connection.
#[derive(Debug, Clone)]
pub struct Served {
    pub peer: SocketAddr,
    /// Whether the request was exactly the expected payload, up to end of stream.
    pub request_ok: bool,
    pub request_len: usize,
}

/// Serves each connection on `listener`: reads to end of stream, checks the bytes against
/// `payload(seed, len)`, then writes `payload(answer_seed(seed), len)` and closes.
pub fn serve_half_close(listener: TcpListener, seed: u64, len: usize) -> mpsc::Receiver<Served> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let expected = payload(seed, len);
        let answer = payload(answer_seed(seed), len);
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let tx = tx.clone();
            let (expected, answer) = (expected.clone(), answer.clone());
            std::thread::spawn(move || {
                let peer = conn
                    .peer_addr()
                    .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
                let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                let mut got = Vec::with_capacity(expected.len());
                let ok = conn.read_to_end(&mut got).is_ok();
                let request_ok = ok && got == expected;
                let _ = tx.send(Served {
                    peer,
                    request_ok,
                    request_len: got.len(),
                });
                if request_ok {
                    let _ = conn.write_all(&answer);
                }
                let _ = conn.shutdown(Shutdown::Both);
            });
        }
    });
    rx
}

/// Writes `payload(seed, len)` on `conn`, half-closes, reads the answer to end of stream
/// and checks it against `payload(answer_seed(seed), len)`.
pub fn exchange_half_close(mut conn: TcpStream, seed: u64, len: usize) -> anyhow::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    conn.write_all(&payload(seed, len))
        .context("writing the request")?;
    conn.shutdown(Shutdown::Write).context("half-closing")?;
    let mut got = Vec::with_capacity(len);
    conn.read_to_end(&mut got).context("reading the answer")?;
    let want = payload(answer_seed(seed), len);
    if got != want {
        let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
        bail!(
            "the answer is {} bytes, {} expected; first difference at {:?}",
            got.len(),
            want.len(),
            first_diff
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_deterministic_and_differ_by_seed() {
        assert_eq!(payload(7, 1000), payload(7, 1000));
        assert_ne!(payload(7, 1000), payload(8, 1000));
        assert_ne!(payload(42, 1000), payload(43, 1000));
        assert_eq!(payload(7, 13).len(), 13);
        assert_ne!(answer_seed(7), 7);
    }

    #[test]
    fn half_close_exchange_on_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = serve_half_close(listener, 42, 300_000);
        exchange_half_close(TcpStream::connect(addr).unwrap(), 42, 300_000).unwrap();
        let s = served.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(s.request_ok);
        assert_eq!(s.request_len, 300_000);
        // A wrong request gets no answer, and the client says so.
        let err = exchange_half_close(TcpStream::connect(addr).unwrap(), 43, 300_000);
        assert!(err.is_err());
        assert!(
            !served
                .recv_timeout(Duration::from_secs(5))
                .unwrap()
                .request_ok
        );
    }
}
