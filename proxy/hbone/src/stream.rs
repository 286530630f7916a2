//! [`HboneStream`]: one tunnel (HTTP/2 stream) as an `AsyncRead + AsyncWrite` byte stream.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::{Reason, RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::conn::StreamGuard;
use crate::error::h2_to_io;

/// Largest single write handed to HTTP/2 at once (one max-size DATA frame).
const MAX_WRITE: usize = crate::MAX_FRAME_SIZE as usize;

/// A proxied TCP connection carried as one HTTP/2 stream.
///
/// - `read` returns the peer's bytes; `Ok(0)` once the peer half-closed (END_STREAM);
///   `ConnectionReset` when the peer reset the stream (RST_STREAM) or the connection died.
/// - `write` sends DATA within HTTP/2 flow control (it waits for window).
/// - `shutdown` sends END_STREAM (our half-close); reading goes on.
/// - Dropping the stream before `shutdown` resets it (RST_STREAM CANCEL), as closing a TCP
///   socket with unsent state would; [`HboneStream::reset`] does so explicitly
///   (CONNECT_ERROR, "the TCP connection was reset").
pub struct HboneStream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    buf: Bytes,
    /// The peer's chunk after the one last handed out, taken from HTTP/2
    /// while looking for END_STREAM (its window is released when it is
    /// handed out, so at most one more frame is held than without it).
    ahead: Bytes,
    /// An error found while looking ahead, for the next read.
    ahead_err: Option<io::Error>,
    read_eof: bool,
    write_closed: bool,
    /// Bytes sent with the CONNECT, before the stream was open.
    sent_first: u32,
    _guard: Option<StreamGuard>,
}

impl HboneStream {
    pub(crate) fn new(
        send: SendStream<Bytes>,
        recv: RecvStream,
        guard: Option<StreamGuard>,
    ) -> Self {
        HboneStream {
            send,
            recv,
            buf: Bytes::new(),
            ahead: Bytes::new(),
            ahead_err: None,
            read_eof: false,
            write_closed: false,
            sent_first: 0,
            _guard: guard,
        }
    }

    pub(crate) fn with_sent_first(mut self, n: usize) -> Self {
        self.sent_first = u32::try_from(n).unwrap_or(u32::MAX);
        self
    }

    /// How many bytes went out with the CONNECT request
    /// ([`crate::Pool::connect_with_data`]), before the stream was open:
    /// the caller counts them as sent.
    pub fn sent_first(&self) -> u64 {
        u64::from(self.sent_first)
    }

    /// Resets the stream (RST_STREAM CONNECT_ERROR): the peer resets its upstream.
    pub fn reset(mut self) {
        self.send.send_reset(Reason::CONNECT_ERROR);
        self.write_closed = true;
    }

    /// The HTTP/2 stream id (for logs).
    pub fn stream_id(&self) -> u32 {
        self.send.stream_id().as_u32()
    }

    /// The peer's next bytes as they arrived (no copy, never empty): `None`
    /// once the peer half-closed (END_STREAM). For pumps that write each
    /// chunk straight to a socket instead of reading into a buffer of their own.
    ///
    /// Each chunk handed out is followed by a look at what HTTP/2 already
    /// holds for the stream, without waiting: when that is END_STREAM,
    /// [`HboneStream::at_end`] says so before the chunk is written on, so
    /// the writer can send the chunk and its FIN in one segment.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        if !self.buf.is_empty() {
            return Poll::Ready(Ok(Some(std::mem::take(&mut self.buf))));
        }
        let data = if !self.ahead.is_empty() {
            std::mem::take(&mut self.ahead)
        } else {
            loop {
                if let Some(e) = self.ahead_err.take() {
                    return Poll::Ready(Err(e));
                }
                if self.read_eof {
                    return Poll::Ready(Ok(None));
                }
                match ready!(self.recv.poll_data(cx)) {
                    // An empty DATA frame is not an EOF: wait for the next one.
                    Some(Ok(data)) if data.is_empty() => {}
                    Some(Ok(data)) => break data,
                    Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                    None => self.read_eof = true,
                }
            }
        };
        let _ = self.recv.flow_control().release_capacity(data.len());
        self.look_ahead(cx);
        Poll::Ready(Ok(Some(data)))
    }

    /// Takes what HTTP/2 already holds after the chunk just handed out
    /// (empty DATA frames skipped): END_STREAM, the next chunk or an error.
    /// Pending leaves the waker registered, as the next read would.
    fn look_ahead(&mut self, cx: &mut Context<'_>) {
        while self.ahead.is_empty() && self.ahead_err.is_none() && !self.read_eof {
            match self.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => self.ahead = data,
                Poll::Ready(Some(Err(e))) => self.ahead_err = Some(h2_to_io(e)),
                Poll::Ready(None) => self.read_eof = true,
                Poll::Pending => return,
            }
        }
    }

    /// Whether the peer's END_STREAM came right after the last chunk handed
    /// out (nothing else to read): the reader's next call returns `None`.
    pub fn at_end(&self) -> bool {
        self.read_eof && self.buf.is_empty() && self.ahead.is_empty() && self.ahead_err.is_none()
    }

    /// Sends `data` (no copy: the frames share it) within flow control;
    /// ready once all of it is handed to HTTP/2, with `data` then empty.
    pub fn poll_send(&mut self, cx: &mut Context<'_>, data: &mut Bytes) -> Poll<io::Result<()>> {
        while !data.is_empty() {
            let cap = ready!(self.poll_window(cx, data.len()))?;
            let chunk = data.split_to(cap.min(data.len()));
            self.send.send_data(chunk, false).map_err(h2_to_io)?;
        }
        Poll::Ready(Ok(()))
    }

    /// Waits for send window for up to `want` bytes (at most one max-size
    /// frame); ready with the window granted (never 0). A reset while waiting
    /// ends the wait with its error.
    fn poll_window(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "tunnel stream already shut down",
            )));
        }
        self.send.reserve_capacity(want.min(MAX_WRITE));
        loop {
            match self.send.poll_capacity(cx) {
                Poll::Pending => {
                    if let Poll::Ready(r) = self.send.poll_reset(cx) {
                        return Poll::Ready(Err(match r {
                            Ok(reason) => io::Error::new(
                                io::ErrorKind::ConnectionReset,
                                format!("tunnel stream reset by peer: {reason}"),
                            ),
                            Err(e) => h2_to_io(e),
                        }));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(0))) => continue,
                Poll::Ready(Some(Ok(cap))) => return Poll::Ready(Ok(cap)),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(h2_to_io(e))),
                Poll::Ready(None) => return Poll::Ready(Err(self.reset_error(cx))),
            }
        }
    }

    /// Sends END_STREAM (our half-close), once.
    pub fn finish(&mut self) -> io::Result<()> {
        if !self.write_closed {
            self.write_closed = true;
            self.send.send_data(Bytes::new(), true).map_err(h2_to_io)?;
        }
        Ok(())
    }

    fn reset_error(&mut self, cx: &mut Context<'_>) -> io::Error {
        match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("tunnel stream reset by peer: {reason}"),
            ),
            Poll::Ready(Err(e)) => h2_to_io(e),
            Poll::Pending => io::Error::new(io::ErrorKind::BrokenPipe, "tunnel stream closed"),
        }
    }
}

impl fmt::Debug for HboneStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HboneStream")
            .field("stream_id", &self.stream_id())
            .field("read_eof", &self.read_eof)
            .field("write_closed", &self.write_closed)
            .finish()
    }
}

impl AsyncRead for HboneStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            match ready!(this.poll_chunk(cx))? {
                Some(chunk) => this.buf = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        // At most one frame is held here and one looked ahead (its window
        // not yet released), so the window still bounds memory.
        let n = this.buf.len().min(out.remaining());
        out.put_slice(&this.buf.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for HboneStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let cap = ready!(this.poll_window(cx, buf.len()))?;
        let n = cap.min(buf.len());
        this.send
            .send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Frames are written by the connection task as soon as they have window.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().finish())
    }
}

impl Drop for HboneStream {
    fn drop(&mut self) {
        if !self.write_closed {
            self.send.send_reset(Reason::CANCEL);
        }
    }
}
