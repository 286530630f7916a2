//! The TLS buffer pool under the tunnels: a tunnel's TLS reads go through
//! a `TLS_READ_BUF` buffer only while it holds bytes TLS has not taken
//! ([`LazyBufIo`]), taken from and given back to the worker thread's spares;
//! and the bound on what TLS may hold unwritten (`TLS_WRITE_LIMIT`).

use std::io;

use tokio::net::TcpStream;

/// Read buffer under each tunnel's TLS: rustls reads one record (16 KiB) per
/// call; through this, one syscall brings several. Held by an HTTP/2
/// connection only while it has bytes TLS has not taken (see [`LazyBufIo`]).
const TLS_READ_BUF: usize = 256 * 1024;

/// How much TLS may hold of records not yet written to the socket. rustls'
/// default (64 KiB) is less than one HTTP/2 DATA frame of a full read
/// (`READ_CHUNK` (`outbound`), 256 KiB) with its 9-byte header and 16 records' 22
/// bytes of framing each, which would then take several `writev`s and a
/// tiny TLS record per frame; with this a frame is one. Bounded per HTTP/2
/// connection, and held only while the socket is full.
pub(super) const TLS_WRITE_LIMIT: usize = 256 * 1024 + 1024;

/// Spare TLS read buffers kept per worker thread (more are freed).
const SPARE_TLS_BUFS: usize = 4;

thread_local! {
    /// TLS read buffers not holding bytes of any connection: a connection
    /// holds one only while it has read bytes that TLS has not taken yet.
    static SPARE_BUFS: std::cell::RefCell<Vec<bytes::BytesMut>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty buffer with room for [`TLS_READ_BUF`] bytes: a spare when the
/// worker has one, else a new allocation, never zeroed (the socket's bytes
/// are read into its spare capacity).
fn take_tls_buf() -> bytes::BytesMut {
    let mut buf = SPARE_BUFS
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_default();
    // A spare is empty, so this only moves its start back (no allocation);
    // a new one is allocated here, uninitialised.
    buf.reserve(TLS_READ_BUF);
    buf
}

/// Frees this worker thread's spare TLS read buffers (the idle trim's
/// hook: new ones are allocated when reads need them again).
pub fn drop_spare_tls_bufs() {
    let _ = SPARE_BUFS.try_with(|s| s.borrow_mut().clear());
}

fn give_tls_buf(mut buf: bytes::BytesMut) {
    if buf.capacity() == 0 {
        return;
    }
    buf.clear();
    // During thread exit the spares may be gone already: then it is freed.
    let _ = SPARE_BUFS.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_TLS_BUFS {
            s.push(buf);
        }
    });
}

/// A tunnel socket under TLS: reads go straight to the socket until
/// `LazyBufIo::buffer` (on the server side: after the handshake), then
/// through a `TLS_READ_BUF` buffer taken from the worker's spares for one
/// read and given back as soon as TLS has taken every byte of it. An idle
/// tunnel, and one that never authenticates, holds no read buffer.
#[derive(Debug)]
pub struct LazyBufIo<T = TcpStream> {
    pub(super) tcp: T,
    buffered: bool,
    /// Bytes read from the socket that TLS has not taken yet (none: no
    /// buffer held).
    buf: bytes::BytesMut,
    /// A dial of this proxy's, registered while the connection lives.
    mark: Option<super::state::DialMark>,
}

impl<T> LazyBufIo<T> {
    pub(super) fn new(tcp: T) -> Self {
        LazyBufIo {
            tcp,
            buffered: false,
            buf: bytes::BytesMut::new(),
            mark: None,
        }
    }

    /// Keeps `mark` until the connection is dropped.
    pub(super) fn hold(&mut self, mark: super::state::DialMark) {
        self.mark = Some(mark);
    }

    /// Reads through the buffer from now on.
    pub(super) fn buffer(&mut self) {
        self.buffered = true;
    }

    /// Whether the connection holds a read buffer now (tests).
    pub fn holds_buffer(&self) -> bool {
        self.buf.capacity() > 0
    }
}

impl<T> Drop for LazyBufIo<T> {
    fn drop(&mut self) {
        give_tls_buf(std::mem::take(&mut self.buf));
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for LazyBufIo<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::future::Future;
        use std::task::Poll;
        use tokio::io::AsyncReadExt;
        let this = self.get_mut();
        if !this.buffered {
            return std::pin::Pin::new(&mut this.tcp).poll_read(cx, out);
        }
        // (rustls reads at most one record, about 16 KiB, per call: always
        // through the buffer once buffered.)
        if this.buf.is_empty() {
            let mut buf = take_tls_buf();
            match std::pin::pin!(this.tcp.read_buf(&mut buf)).poll(cx) {
                Poll::Ready(Ok(n)) if n > 0 => this.buf = buf,
                other => {
                    // Nothing read (pending, EOF or an error): nothing to keep.
                    give_tls_buf(buf);
                    return other.map_ok(|_| ());
                }
            }
        }
        let n = this.buf.len().min(out.remaining());
        out.put_slice(&this.buf[..n]);
        // Moves the start only (no copy, no allocation).
        bytes::Buf::advance(&mut this.buf, n);
        if this.buf.is_empty() {
            // All taken: the buffer goes back to the worker's spares.
            give_tls_buf(std::mem::take(&mut this.buf));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for LazyBufIo<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that sends a few bytes and then goes quiet, on thousands of
    /// tunnels, must not make each hold a TLS read buffer: the buffer is
    /// given back once TLS has taken every byte read into it, and a read
    /// that finds nothing holds none.
    #[test]
    fn adversarial_quiet_tunnel_holds_no_tls_read_buffer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut peer, ours) = tokio::io::duplex(4096);
            let mut io = LazyBufIo::new(ours);
            io.buffer();
            peer.write_all(&[7u8; 100]).await.unwrap();
            // TLS takes a record header first: the rest waits in the buffer.
            let mut head = [0u8; 5];
            io.read_exact(&mut head).await.unwrap();
            assert!(io.holds_buffer(), "unread bytes are kept");
            let mut rest = [0u8; 95];
            io.read_exact(&mut rest).await.unwrap();
            assert_eq!(rest, [7u8; 95]);
            assert!(
                !io.holds_buffer(),
                "a tunnel whose bytes were all taken still holds a TLS read buffer"
            );
            // A read that finds nothing (the peer is quiet) keeps none either.
            let mut one = [0u8; 1];
            let mut rb = tokio::io::ReadBuf::new(&mut one);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let polled =
                tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut io), &mut cx, &mut rb);
            assert!(polled.is_pending(), "nothing was sent");
            assert!(!io.holds_buffer(), "a pending read holds a TLS read buffer");
            // Bytes arriving later are read whole (nothing lost on the way).
            peer.write_all(b"later").await.unwrap();
            let mut later = [0u8; 5];
            io.read_exact(&mut later).await.unwrap();
            assert_eq!(&later, b"later");
            assert!(!io.holds_buffer());
        });
    }

    /// More tunnels holding unread TLS bytes at once than the worker keeps
    /// spare buffers: each gets every byte back in order whatever the read
    /// sizes, and once all are drained the worker keeps at most
    /// `SPARE_TLS_BUFS` buffers (the rest are freed, none is leaked or
    /// handed out twice).
    #[test]
    fn many_tunnels_share_the_spare_tls_buffers_without_mixing_bytes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let n = SPARE_TLS_BUFS * 3;
            let mut ends = Vec::new();
            for i in 0..n {
                let (mut peer, ours) = tokio::io::duplex(64 * 1024);
                let mut io = LazyBufIo::new(ours);
                io.buffer();
                let msg: Vec<u8> = (0..40_000u32).map(|k| (k as usize * 7 + i) as u8).collect();
                peer.write_all(&msg).await.unwrap();
                // A first small read makes each hold a buffer with the rest.
                let mut head = [0u8; 3];
                io.read_exact(&mut head).await.unwrap();
                assert_eq!(head, msg[..3]);
                assert!(io.holds_buffer());
                ends.push((peer, io, msg));
            }
            for (k, (_peer, io, msg)) in ends.iter_mut().enumerate() {
                let mut rest = vec![0u8; msg.len() - 3];
                let step = 1 + k * 997 % 5000;
                let mut at = 0;
                while at < rest.len() {
                    let end = (at + step).min(rest.len());
                    io.read_exact(&mut rest[at..end]).await.unwrap();
                    at = end;
                }
                assert!(rest == msg[3..], "tunnel {k} got bytes of another");
                assert!(!io.holds_buffer());
            }
            drop(ends);
            let spares = SPARE_BUFS.with(|s| s.borrow().len());
            assert!(spares <= SPARE_TLS_BUFS, "{spares} spare buffers kept");
        });
    }
}
