//! The server side's upstream connection: any byte stream, with a real TCP reset when it is
//! a `TcpStream`.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Object-safe byte stream.
pub trait AsyncIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncIo for T {}

/// Where an accepted tunnel's bytes go (usually a TCP connection to the destination app).
///
/// Built with [`Upstream::tcp`] (or `From<TcpStream>`) a reset of the tunnel resets the TCP
/// connection (`SO_LINGER` 0 then close = RST); built with [`Upstream::new`] the stream is
/// just dropped.
pub struct Upstream(Inner, Option<Box<dyn Send>>, Option<Box<dyn Observer>>);

/// Watches an upstream's bytes as they move (metrics); dropped with the
/// upstream, i.e. when the stream has ended either way.
pub trait Observer: Send {
    /// `n` bytes were read from the upstream (toward the peer).
    fn read(&self, n: usize);
    /// `n` bytes were written to the upstream (from the peer).
    fn written(&self, n: usize);
}

enum Inner {
    Tcp(TcpStream),
    Io(Box<dyn AsyncIo>),
}

impl Upstream {
    /// Any byte stream; a reset drops it.
    pub fn new(io: impl AsyncIo + 'static) -> Self {
        Upstream(Inner::Io(Box::new(io)), None, None)
    }

    /// A TCP stream; a reset sends RST.
    pub fn tcp(stream: TcpStream) -> Self {
        Upstream(Inner::Tcp(stream), None, None)
    }

    /// Keeps `guard` alive exactly as long as the upstream (e.g. a registration
    /// that lets another thread reset it).
    pub fn with_guard(mut self, guard: impl Send + 'static) -> Self {
        self.1 = Some(Box::new(guard));
        self
    }

    /// Reports the upstream's bytes to `observer` as they move.
    pub fn observed(mut self, observer: impl Observer + 'static) -> Self {
        self.2 = Some(Box::new(observer));
        self
    }

    /// Resets the upstream: RST for TCP, drop otherwise.
    pub(crate) fn reset(self) {
        if let Inner::Tcp(s) = &self.0 {
            // Best effort: if it fails the close below is a FIN instead of a RST.
            let _ = s.set_zero_linger();
        }
    }
}

impl From<TcpStream> for Upstream {
    fn from(s: TcpStream) -> Self {
        Upstream::tcp(s)
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Inner::Tcp(s) => f.debug_tuple("Upstream::Tcp").field(s).finish(),
            Inner::Io(_) => f.write_str("Upstream::Io"),
        }
    }
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = match &mut this.0 {
            Inner::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Io(s) => Pin::new(s).poll_read(cx, buf),
        };
        let n = buf.filled().len() - before;
        if let (Some(o), true) = (&this.2, n > 0) {
            o.read(n);
        }
        r
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = match &mut this.0 {
            Inner::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Io(s) => Pin::new(s).poll_write(cx, buf),
        };
        if let (Some(o), Poll::Ready(Ok(n))) = (&this.2, &r) {
            o.written(*n);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Inner::Tcp(s) => Pin::new(s).poll_flush(cx),
            Inner::Io(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Inner::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Io(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
