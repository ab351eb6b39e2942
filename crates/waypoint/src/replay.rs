//! Request bodies that can be sent more than once: the first try streams the body as it
//! comes (a streaming gRPC call never waits on a buffer), keeping a copy of up to
//! [`RETRY_BUFFER`] bytes for a retry, and feeding each mirror through a small bounded
//! queue. A body larger than the copy's bound is not retried; a mirror that falls behind
//! is abandoned, never waited for: the primary request is never slowed by either.
//! Also the response body that ends at the route's deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use crate::upstream::{Body, BoxError};

/// The most of a request body kept for a retry.
pub const RETRY_BUFFER: usize = 64 * 1024;
/// Frames queued for a mirror before it is abandoned.
pub const MIRROR_QUEUE: usize = 16;

/// The copy of a request body kept for retries.
#[derive(Debug, Default)]
struct Copy {
    chunks: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    bytes: usize,
    complete: bool,
    /// Past [`RETRY_BUFFER`]: no retry can send it.
    overflowed: bool,
}

/// A handle on the copy a [`Tee`] keeps.
#[derive(Debug, Clone, Default)]
pub struct Recording(Arc<Mutex<Copy>>);

impl Recording {
    /// The whole body again, if it was read to its end within the bound.
    pub fn replay(&self) -> Option<Body> {
        let copy = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !copy.complete || copy.overflowed {
            return None;
        }
        let mut frames: Vec<Frame<Bytes>> = copy.chunks.iter().cloned().map(Frame::data).collect();
        if let Some(t) = &copy.trailers {
            frames.push(Frame::trailers(t.clone()));
        }
        Some(frames_body(frames))
    }

    /// Whether the body was read to its end within the bound (so a retry can send it).
    pub fn replayable(&self) -> bool {
        let copy = self.0.lock().unwrap_or_else(|p| p.into_inner());
        copy.complete && !copy.overflowed
    }
}

fn frames_body(frames: Vec<Frame<Bytes>>) -> Body {
    let stream = futures_util::stream::iter(frames.into_iter().map(Ok::<_, BoxError>));
    http_body_util::StreamBody::new(stream).boxed_unsync()
}

/// A mirror's copy of the request body, fed by the primary's [`Tee`].
pub struct MirrorBody {
    rx: mpsc::Receiver<Frame<Bytes>>,
    complete: Arc<AtomicBool>,
}

/// The feeding end of a [`MirrorBody`].
struct MirrorFeed {
    tx: mpsc::Sender<Frame<Bytes>>,
    complete: Arc<AtomicBool>,
}

/// A queue for one mirror: its feed goes to [`Tee::new`], its body to the mirrored
/// request.
pub fn mirror_channel() -> (MirrorSender, MirrorBody) {
    let (tx, rx) = mpsc::channel(MIRROR_QUEUE);
    let complete = Arc::new(AtomicBool::new(false));
    (
        MirrorSender(MirrorFeed {
            tx,
            complete: complete.clone(),
        }),
        MirrorBody { rx, complete },
    )
}

/// The feeding end of a mirror's queue, given to [`Tee::new`].
pub struct MirrorSender(MirrorFeed);

impl http_body::Body for MirrorBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(f)) => Poll::Ready(Some(Ok(f))),
            Poll::Ready(None) if self.complete.load(Ordering::Acquire) => Poll::Ready(None),
            Poll::Ready(None) => Poll::Ready(Some(Err(
                "the mirrored request fell behind the original, or the original was cut off".into(),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The request body on its first try: passed on as it comes, copied for retries and
/// mirrors on the way.
pub struct Tee {
    inner: Body,
    recording: Option<Recording>,
    mirrors: Vec<MirrorFeed>,
}

impl Tee {
    pub fn new(inner: Body, recording: Option<Recording>, mirrors: Vec<MirrorSender>) -> Tee {
        let mut tee = Tee {
            inner,
            recording,
            mirrors: mirrors.into_iter().map(|m| m.0).collect(),
        };
        // An empty body is never polled: it is whole already.
        if tee.inner.is_end_stream() {
            tee.ended();
        }
        tee
    }

    fn copy(&mut self, frame: &Frame<Bytes>) {
        if let Some(r) = &self.recording {
            let mut copy = r.0.lock().unwrap_or_else(|p| p.into_inner());
            if !copy.overflowed {
                if let Some(data) = frame.data_ref() {
                    copy.bytes += data.len();
                    if copy.bytes > RETRY_BUFFER {
                        copy.overflowed = true;
                        copy.chunks = Vec::new();
                    } else {
                        copy.chunks.push(data.clone());
                    }
                } else if let Some(t) = frame.trailers_ref() {
                    copy.trailers = Some(t.clone());
                }
            }
        }
        // A mirror whose queue is full is dropped: its body then ends in an error.
        self.mirrors.retain(|m| {
            let copy = match (frame.data_ref(), frame.trailers_ref()) {
                (Some(d), _) => Frame::data(d.clone()),
                (None, Some(t)) => Frame::trailers(t.clone()),
                (None, None) => return true,
            };
            m.tx.try_send(copy).is_ok()
        });
    }

    fn ended(&mut self) {
        if let Some(r) = &self.recording {
            r.0.lock().unwrap_or_else(|p| p.into_inner()).complete = true;
        }
        for m in self.mirrors.drain(..) {
            m.complete.store(true, Ordering::Release);
        }
    }
}

impl http_body::Body for Tee {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.copy(frame);
                // A sender may stop polling once the body says it has ended.
                if self.inner.is_end_stream() {
                    self.ended();
                }
            }
            Poll::Ready(None) => self.ended(),
            // Cut off: the mirrors see their queue close before the end.
            Poll::Ready(Some(Err(_))) => self.mirrors.clear(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body cut off (an error, so the client sees a reset, not a short answer
/// taken for whole) when the route's request timeout expires.
pub struct Deadline {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Deadline {
    pub fn new(inner: Body, at: tokio::time::Instant) -> Deadline {
        Deadline {
            inner,
            sleep: Box::pin(tokio::time::sleep_until(at)),
        }
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(f) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(f);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err("the route's request timeout expired".into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(chunks: &[&'static [u8]]) -> Body {
        frames_body(
            chunks
                .iter()
                .map(|c| Frame::data(Bytes::from_static(c)))
                .collect(),
        )
    }

    async fn read(
        b: impl http_body::Body<Data = Bytes, Error = BoxError>,
    ) -> Result<Vec<u8>, BoxError> {
        Ok(b.collect().await?.to_bytes().to_vec())
    }

    #[tokio::test]
    async fn a_body_read_whole_within_the_bound_replays_and_feeds_mirrors() {
        let recording = Recording::default();
        let (feed, mirror) = mirror_channel();
        let tee = Tee::new(
            body_of(&[b"he", b"llo"]),
            Some(recording.clone()),
            vec![feed],
        );
        assert!(
            recording.replay().is_none(),
            "nothing to replay before the end"
        );
        assert_eq!(read(tee).await.unwrap(), b"hello");
        assert_eq!(read(recording.replay().unwrap()).await.unwrap(), b"hello");
        assert_eq!(read(recording.replay().unwrap()).await.unwrap(), b"hello");
        assert_eq!(read(mirror).await.unwrap(), b"hello");
    }

    /// Senders stop polling a body that says it has ended (so its end is never seen as
    /// `None`), and never poll an empty one.
    #[tokio::test]
    async fn bodies_that_announce_their_end_replay() {
        use http_body::Body as _;
        let recording = Recording::default();
        let full = http_body_util::Full::new(Bytes::from_static(b"ping"))
            .map_err(|never| match never {})
            .boxed_unsync();
        let mut tee = Tee::new(full, Some(recording.clone()), vec![]);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(
            Pin::new(&mut tee).poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(tee.is_end_stream());
        assert_eq!(read(recording.replay().unwrap()).await.unwrap(), b"ping");

        let empty = Recording::default();
        let (feed, mirror) = mirror_channel();
        let nothing = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        let _tee = Tee::new(nothing, Some(empty.clone()), vec![feed]);
        assert_eq!(read(empty.replay().unwrap()).await.unwrap(), b"");
        assert_eq!(read(mirror).await.unwrap(), b"");
    }

    #[tokio::test]
    async fn a_body_past_the_bound_is_not_replayed() {
        static BIG: [u8; RETRY_BUFFER] = [7; RETRY_BUFFER];
        let recording = Recording::default();
        let tee = Tee::new(body_of(&[&BIG, b"x"]), Some(recording.clone()), vec![]);
        assert_eq!(read(tee).await.unwrap().len(), RETRY_BUFFER + 1);
        assert!(!recording.replayable());
        assert!(recording.replay().is_none());
    }

    #[tokio::test]
    async fn a_mirror_that_falls_behind_is_abandoned_not_waited_for() {
        static CHUNK: [u8; 10] = [1; 10];
        let chunks: Vec<&'static [u8]> = vec![&CHUNK; MIRROR_QUEUE + 4];
        let (feed, mirror) = mirror_channel();
        // The primary reads everything while the mirror reads nothing.
        let tee = Tee::new(body_of(&chunks), None, vec![feed]);
        assert_eq!(read(tee).await.unwrap().len(), 10 * (MIRROR_QUEUE + 4));
        let err = read(mirror).await.unwrap_err();
        assert!(err.to_string().contains("fell behind"), "{err}");
    }

    #[tokio::test]
    async fn a_response_past_its_deadline_is_cut_off() {
        use http_body::Body as _;
        let (_tx, rx) = mpsc::channel::<Frame<Bytes>>(1);
        let never = MirrorBody {
            rx,
            complete: Arc::new(AtomicBool::new(false)),
        };
        let at = tokio::time::Instant::now() + std::time::Duration::from_millis(50);
        let mut body = Deadline::new(never.boxed_unsync(), at);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        let err = read(body).await.unwrap_err();
        assert!(err.to_string().contains("timeout"), "{err}");
    }
}
