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
pub struct Upstream(Inner, Option<Box<dyn Send>>);

enum Inner {
    Tcp(TcpStream),
    Io(Box<dyn AsyncIo>),
}

impl Upstream {
    /// Any byte stream; a reset drops it.
    pub fn new(io: impl AsyncIo + 'static) -> Self {
        Upstream(Inner::Io(Box::new(io)), None)
    }

    /// A TCP stream; a reset sends RST.
    pub fn tcp(stream: TcpStream) -> Self {
        Upstream(Inner::Tcp(stream), None)
    }

    /// Keeps `guard` alive exactly as long as the upstream (e.g. a registration
    /// that lets another thread reset it).
    pub fn with_guard(mut self, guard: impl Send + 'static) -> Self {
        self.1 = Some(Box::new(guard));
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
        match &mut self.get_mut().0 {
            Inner::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Io(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            Inner::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Io(s) => Pin::new(s).poll_write(cx, buf),
        }
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
