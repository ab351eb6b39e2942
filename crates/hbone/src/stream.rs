//! [`H2Stream`]: one HBONE tunnel (an HTTP/2 CONNECT stream) as a byte stream implementing
//! tokio's `AsyncRead + AsyncWrite`.
//!
//! - Writes reserve HTTP/2 send capacity and wait for it, so a writer never buffers more than
//!   the flow-control window lets through.
//! - `shutdown` sends an empty DATA frame with END_STREAM: a TCP half-close.
//! - Reads release flow-control capacity as bytes are handed to the reader, skip zero-length
//!   DATA frames, and treat END_STREAM and RST_STREAM `NO_ERROR`/`CANCEL` as EOF; other resets
//!   are I/O errors: `STREAM_CLOSED` is `BrokenPipe` (a peer that went away), an error
//!   reason (protocol, flow control, internal, ...) is `ConnectionAborted` (a failure).
//! - Dropping a stream that was not shut down for writing resets it with `CANCEL`.

use std::any::Any;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h2::{Reason, RecvStream, SendStream};
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes taken from one `poll_write` call. Bounds the capacity one stream asks for at a
/// time so one writer cannot starve the others on the connection.
pub(crate) const MAX_WRITE: usize = 1024 * 1024;

/// Something kept alive for as long as the stream (the pool's slot on its connection).
pub(crate) type Guard = Box<dyn Any + Send + Sync>;

/// One HBONE tunnel over an HTTP/2 stream.
pub struct H2Stream {
    pub(crate) send: SendStream<Bytes>,
    pub(crate) recv: RecvStream,
    /// The unread rest of the last DATA frame.
    pub(crate) pending: Bytes,
    /// We sent END_STREAM (or gave up sending).
    pub(crate) write_closed: bool,
    /// The peer finished its side (END_STREAM or a graceful reset).
    pub(crate) read_eof: bool,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    response_headers: HeaderMap,
    _guard: Option<Guard>,
}

impl H2Stream {
    pub(crate) fn new(send: SendStream<Bytes>, recv: RecvStream) -> H2Stream {
        H2Stream {
            send,
            recv,
            pending: Bytes::new(),
            write_closed: false,
            read_eof: false,
            bytes_sent: 0,
            bytes_received: 0,
            response_headers: HeaderMap::new(),
            _guard: None,
        }
    }

    pub(crate) fn with_guard(mut self, guard: Guard) -> H2Stream {
        self._guard = Some(guard);
        self
    }

    pub(crate) fn with_response_headers(mut self, headers: HeaderMap) -> H2Stream {
        self.response_headers = headers;
        self
    }

    /// Payload bytes written into the tunnel so far.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// Payload bytes read out of the tunnel so far.
    pub fn bytes_received(&self) -> u64 {
        self.bytes_received
    }

    /// Client side: the headers of the 200 response (e.g. the destination's `baggage`).
    /// Server side: empty.
    pub fn response_headers(&self) -> &HeaderMap {
        &self.response_headers
    }

    /// Resets the stream with `reason` (a no-op once it is closed both ways): how a proxy
    /// tells the peer its TCP connection failed (`CONNECT_ERROR`, RFC 9113 §8.5).
    pub fn abort(&mut self, reason: Reason) {
        self.send.send_reset(reason);
        // Nothing more to send: no second reset (CANCEL) on drop.
        self.write_closed = true;
    }

    /// The HTTP/2 stream id (for logs).
    pub fn stream_id(&self) -> u32 {
        self.send.stream_id().as_u32()
    }

    /// Why a send-side operation is impossible: the reset reason if the peer reset us.
    fn send_closed_error(&mut self, cx: &mut Context<'_>) -> io::Error {
        if self.write_closed {
            return io::Error::new(
                io::ErrorKind::BrokenPipe,
                "HBONE stream already shut down for writing",
            );
        }
        match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => reset_to_io(reason, "peer reset the HBONE stream"),
            Poll::Ready(Err(e)) => h2_to_io(e),
            Poll::Pending => io::Error::new(
                io::ErrorKind::BrokenPipe,
                "HBONE stream is closed for sending",
            ),
        }
    }
}

impl fmt::Debug for H2Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("H2Stream")
            .field("stream_id", &self.stream_id())
            .field("write_closed", &self.write_closed)
            .field("read_eof", &self.read_eof)
            .field("bytes_sent", &self.bytes_sent)
            .field("bytes_received", &self.bytes_received)
            .finish()
    }
}

/// Maps a reset reason to an I/O error (for writes, where even a graceful reset means the
/// peer will not take more bytes). A graceful reason reads as a peer that went away; an
/// error reason (protocol, flow control, internal, keepalive timeout) as an aborted
/// connection, so the proxy reports it as a failure rather than a close.
fn reset_to_io(reason: Reason, what: &str) -> io::Error {
    io::Error::new(reset_kind(reason), format!("{what}: {reason}"))
}

fn reset_kind(reason: Reason) -> io::ErrorKind {
    match reason {
        Reason::NO_ERROR | Reason::CANCEL | Reason::STREAM_CLOSED => io::ErrorKind::BrokenPipe,
        _ => io::ErrorKind::ConnectionAborted,
    }
}

/// Maps an h2 error to an I/O error, keeping the kind of underlying I/O errors.
pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("HTTP/2 I/O error"));
    }
    match e.reason() {
        Some(reason) => io::Error::new(reset_kind(reason), e),
        None => io::Error::other(e),
    }
}

/// What a receive-side error means: end of stream, or a real error.
pub(crate) fn classify_recv_error(e: h2::Error) -> Result<(), io::Error> {
    if e.is_reset() && matches!(e.reason(), Some(Reason::NO_ERROR | Reason::CANCEL)) {
        return Ok(());
    }
    Err(h2_to_io(e))
}

impl AsyncRead for H2Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                this.bytes_received += n as u64;
                if let Err(e) = this.recv.flow_control().release_capacity(n) {
                    tracing::debug!(error = %e, "releasing HBONE receive capacity failed");
                }
                return Poll::Ready(Ok(()));
            }
            if this.read_eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.recv.poll_data(cx)) {
                // Zero-length non-final frames loop around as an empty `pending`.
                Some(Ok(data)) => this.pending = data,
                None => this.read_eof = true,
                Some(Err(e)) => {
                    classify_recv_error(e)?;
                    this.read_eof = true;
                }
            }
        }
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.write_closed {
            return Poll::Ready(Err(this.send_closed_error(cx)));
        }
        let want = buf.len().min(MAX_WRITE);
        loop {
            let capacity = this.send.capacity();
            if capacity > 0 {
                let n = capacity.min(want);
                let mut payload = crate::payload::payload_buffer(n);
                payload.extend_from_slice(&buf[..n]);
                if let Err(e) = this.send.send_data(payload.freeze(), false) {
                    // Prefer the peer's reset reason over h2's "inactive stream".
                    if let Poll::Ready(Ok(reason)) = this.send.poll_reset(cx) {
                        return Poll::Ready(Err(reset_to_io(
                            reason,
                            "peer reset the HBONE stream",
                        )));
                    }
                    return Poll::Ready(Err(h2_to_io(e)));
                }
                this.bytes_sent += n as u64;
                return Poll::Ready(Ok(n));
            }
            this.send.reserve_capacity(want);
            match ready!(this.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => return Poll::Ready(Err(this.send_closed_error(cx))),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Data handed to h2 is written by the connection task, within flow control.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.write_closed {
            return Poll::Ready(Ok(()));
        }
        this.write_closed = true;
        // Return any capacity we reserved but did not use to the connection.
        this.send.reserve_capacity(0);
        match this.send.send_data(Bytes::new(), true) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(e) => {
                // Finishing a stream the peer already ended gracefully is not an error.
                if let Poll::Ready(Ok(Reason::NO_ERROR | Reason::CANCEL)) = this.send.poll_reset(cx)
                {
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Err(h2_to_io(e)))
            }
        }
    }
}

impl Drop for H2Stream {
    /// Not shut down for writing: abort with RST_STREAM `CANCEL` now (the peer reads EOF).
    /// Shut down but the peer still sending: h2 resets the stream once our handles are gone
    /// (server: `NO_ERROR` after our queued data and END_STREAM are flushed; client: `CANCEL`).
    fn drop(&mut self) {
        if !self.write_closed {
            self.send.send_reset(Reason::CANCEL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}
    fn assert_sync<T: Sync>() {}

    #[test]
    fn stream_is_send_and_sync() {
        assert_send::<H2Stream>();
        assert_sync::<H2Stream>();
    }

    #[test]
    fn error_mapping() {
        assert_eq!(
            classify_recv_error(h2::Error::from(Reason::PROTOCOL_ERROR))
                .unwrap_err()
                .kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert_eq!(
            reset_to_io(Reason::STREAM_CLOSED, "x").kind(),
            io::ErrorKind::BrokenPipe
        );
        assert_eq!(
            reset_to_io(Reason::INTERNAL_ERROR, "x").kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert_eq!(
            h2_to_io(h2::Error::from(Reason::FLOW_CONTROL_ERROR)).kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert_eq!(
            h2_to_io(h2::Error::from(Reason::STREAM_CLOSED)).kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}
