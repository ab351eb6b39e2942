//! Moves bytes between an HBONE tunnel and a plain byte stream (the app's TCP connection)
//! without the extra copy that `AsyncRead`/`AsyncWrite` would force: bytes read from the
//! stream go to HTTP/2 as the very buffer they were read into, and DATA frames received
//! from the peer are written to the stream as h2 hands them over.
//!
//! Half-close is kept both ways (EOF becomes END_STREAM and END_STREAM becomes a write
//! shutdown); an error in either direction aborts both (`RST_STREAM(CONNECT_ERROR)` on the
//! tunnel, a TCP reset on the stream).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use futures_util::future::poll_fn;
use h2::Reason;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::payload::payload_buffer;
use crate::stream::{classify_recv_error, h2_to_io, H2Stream, MAX_WRITE};

/// Read sizes grow with the traffic, as in a plain copy: small for chatty connections,
/// large for bulk transfer.
fn read_size(copied: u64) -> usize {
    match copied {
        0..=262_143 => 8 * 1024,
        262_144..=16_777_215 => 64 * 1024,
        _ => 256 * 1024,
    }
}

impl H2Stream {
    /// The two directions, borrowed separately so a splice can drive both at once.
    pub(crate) fn halves(&mut self) -> (SendHalf<'_>, RecvHalf<'_>) {
        (
            SendHalf {
                send: &mut self.send,
                write_closed: &mut self.write_closed,
                bytes_sent: &mut self.bytes_sent,
            },
            RecvHalf {
                recv: &mut self.recv,
                pending: &mut self.pending,
                read_eof: &mut self.read_eof,
                bytes_received: &mut self.bytes_received,
            },
        )
    }

    /// Copies `io` <-> this tunnel until both directions finished, counting bytes as they
    /// move: `to_tunnel` (read from `io`, sent to the peer) and `from_tunnel`.
    ///
    /// A failure on either side aborts both, as RFC 9113 §8.5 asks of a CONNECT proxy: the
    /// stream is reset with `CONNECT_ERROR`, and on `Err` the caller resets `io` too
    /// (`SO_LINGER` 0), so neither end mistakes the abort for a clean end of stream.
    pub async fn splice<IO>(
        &mut self,
        io: IO,
        to_tunnel: &AtomicU64,
        from_tunnel: &AtomicU64,
    ) -> io::Result<()>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let copied = self.copy_both_ways(io, to_tunnel, from_tunnel).await;
        if copied.is_err() {
            self.abort(Reason::CONNECT_ERROR);
        }
        copied
    }

    async fn copy_both_ways<IO>(
        &mut self,
        io: IO,
        to_tunnel: &AtomicU64,
        from_tunnel: &AtomicU64,
    ) -> io::Result<()>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut io_r, mut io_w) = tokio::io::split(io);
        let (mut send, mut recv) = self.halves();
        let outgoing = async {
            let mut copied = 0u64;
            let mut buf = BytesMut::new();
            loop {
                let want = read_size(copied);
                if buf.capacity() - buf.len() < want {
                    buf = payload_buffer(want);
                }
                // A read error (the app reset its connection) is no end of stream: it is
                // reported, and the stream reset, never finished with END_STREAM.
                let n = io_r.read_buf(&mut buf).await?;
                if n == 0 {
                    return send.finish_ok();
                }
                send.send_all(buf.split().freeze()).await?;
                to_tunnel.fetch_add(n as u64, Ordering::Relaxed);
                copied += n as u64;
            }
        };
        let incoming = async {
            loop {
                // A peer reset that is not graceful is an error here, and the caller resets
                // `io`: no write shutdown first, or the app would read a clean EOF.
                let Some(chunk) = recv.next_chunk().await? else {
                    return match io_w.shutdown().await {
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
                        other => other,
                    };
                };
                let n = chunk.len();
                io_w.write_all(&chunk).await?;
                recv.release(n);
                from_tunnel.fetch_add(n as u64, Ordering::Relaxed);
            }
        };
        tokio::try_join!(outgoing, incoming).map(|_| ())
    }
}

/// The sending side of a tunnel, borrowed for a splice.
pub(crate) struct SendHalf<'a> {
    pub(crate) send: &'a mut h2::SendStream<Bytes>,
    pub(crate) write_closed: &'a mut bool,
    pub(crate) bytes_sent: &'a mut u64,
}

/// The receiving side of a tunnel, borrowed for a splice.
pub(crate) struct RecvHalf<'a> {
    pub(crate) recv: &'a mut h2::RecvStream,
    pub(crate) pending: &'a mut Bytes,
    pub(crate) read_eof: &'a mut bool,
    pub(crate) bytes_received: &'a mut u64,
}

impl SendHalf<'_> {
    /// Sends all of `data`, as flow control lets it through, without copying it.
    async fn send_all(&mut self, mut data: Bytes) -> io::Result<()> {
        while !data.is_empty() {
            let want = data.len().min(MAX_WRITE);
            self.send.reserve_capacity(want);
            let capacity = poll_fn(|cx| self.send.poll_capacity(cx)).await;
            match capacity {
                Some(Ok(0)) => continue,
                Some(Ok(n)) => {
                    let chunk = data.split_to(n.min(data.len()));
                    let len = chunk.len();
                    self.send.send_data(chunk, false).map_err(h2_to_io)?;
                    *self.bytes_sent += len as u64;
                }
                Some(Err(e)) => return Err(h2_to_io(e)),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "HBONE stream is closed for sending",
                    ))
                }
            }
        }
        Ok(())
    }

    /// END_STREAM: the half-close of the tunnel. A peer that already ended the stream
    /// gracefully is not an error.
    fn finish_ok(&mut self) -> io::Result<()> {
        if *self.write_closed {
            return Ok(());
        }
        *self.write_closed = true;
        self.send.reserve_capacity(0);
        match self.send.send_data(Bytes::new(), true) {
            Ok(()) => Ok(()),
            Err(e) if e.is_reset() => Ok(()),
            Err(e) => Err(h2_to_io(e)),
        }
    }
}

impl RecvHalf<'_> {
    /// The next non-empty DATA payload, `None` at the peer's END_STREAM or graceful reset.
    async fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        if !self.pending.is_empty() {
            return Ok(Some(std::mem::take(self.pending)));
        }
        while !*self.read_eof {
            match poll_fn(|cx| self.recv.poll_data(cx)).await {
                Some(Ok(data)) if data.is_empty() => continue,
                Some(Ok(data)) => return Ok(Some(data)),
                None => *self.read_eof = true,
                Some(Err(e)) => {
                    classify_recv_error(e)?;
                    *self.read_eof = true;
                }
            }
        }
        Ok(None)
    }

    /// Gives `n` consumed bytes of window back to the peer.
    fn release(&mut self, n: usize) {
        *self.bytes_received += n as u64;
        if let Err(e) = self.recv.flow_control().release_capacity(n) {
            tracing::debug!(error = %e, "releasing HBONE receive capacity failed");
        }
    }
}
