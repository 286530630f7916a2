//! Sockets of the datapath: the readiness abstraction over the two event
//! loops (io_uring polls or epoll), and how listeners and upstream sockets
//! are made inside a pod's network namespace.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use socket2::{Domain, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;

use crate::uring::op::{self, Interest};

/// Which event loop a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// tokio-uring: accept and connect through the ring; readiness of the
    /// data phase from tokio's epoll reactor (see [`Sock`]).
    Uring,
    /// tokio's epoll reactor (fallback when io_uring is unavailable).
    Epoll,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Uring => "io_uring",
            Backend::Epoll => "epoll",
        })
    }
}

/// A non-blocking socket owned by one worker, with its readiness source.
///
/// Readiness always comes from tokio's epoll reactor once bytes move: on
/// the epoll backend the socket is registered when wrapped; on io_uring it
/// is registered on its first [`Sock::wait`] (accept and connect go through
/// the ring, and a listener is never registered). An epoll registration is
/// persistent (edge-triggered), so a direction that waits after every
/// message costs no syscall to re-arm and one `epoll_wait` can return the
/// readiness of both hops; a one-shot `IORING_OP_POLL_ADD` per wait cost
/// twice the syscalls, context switches and CPU per message (benches/HISTORY.md,
/// "Plaintext per-hop latency"). If the registration fails, the wait falls
/// back to the ring's poll.
#[derive(Debug)]
pub struct Sock {
    fd: Arc<OwnedFd>,
    epoll: Option<AsyncFd<Arc<OwnedFd>>>,
    /// io_uring backend: the data phase's epoll registration, made on the
    /// first wait.
    data: std::cell::OnceCell<Option<AsyncFd<Arc<OwnedFd>>>>,
}

impl Sock {
    /// Wraps a non-blocking socket for `backend` (registers it with epoll
    /// when that is the backend).
    pub fn new(fd: OwnedFd, backend: Backend) -> io::Result<Sock> {
        Self::from_shared(Arc::new(fd), backend)
    }

    /// [`Sock::new`] for a socket already shared (e.g. with the pod registry).
    pub fn from_shared(fd: Arc<OwnedFd>, backend: Backend) -> io::Result<Sock> {
        let epoll = match backend {
            Backend::Uring => None,
            Backend::Epoll => Some(crate::sys::register_epoll(fd.clone())?),
        };
        Ok(Sock {
            fd,
            epoll,
            data: std::cell::OnceCell::new(),
        })
    }

    /// The raw socket.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A shared handle to the fd (for force-closing from the pod registry).
    pub fn shared(&self) -> Arc<OwnedFd> {
        self.fd.clone()
    }

    /// Waits until the socket is ready for `interest` (or has an error).
    pub async fn wait(&self, interest: Interest) -> io::Result<()> {
        let afd = self.epoll.as_ref().or_else(|| {
            self.data
                .get_or_init(|| match crate::sys::register_epoll(self.fd.clone()) {
                    Ok(afd) => Some(afd),
                    Err(e) => {
                        tracing::debug!(error = %e, "epoll registration failed; polling through the ring");
                        None
                    }
                })
                .as_ref()
        });
        match afd {
            None => op::poll(&self.fd, interest).await.map(|_| ())?,
            Some(afd) => {
                let mut guard = match interest {
                    Interest::Readable => afd.readable().await?,
                    Interest::Writable => afd.writable().await?,
                };
                guard.clear_ready();
            }
        }
        crate::busy::note_activity();
        Ok(())
    }

    /// Accepts one connection (listener sockets only).
    pub async fn accept(&self) -> io::Result<(OwnedFd, SockAddr)> {
        if self.epoll.is_none() {
            return op::accept(&self.fd).await;
        }
        loop {
            match socket2::SockRef::from(&*self.fd).accept() {
                Ok((s, addr)) => {
                    s.set_nonblocking(true)?;
                    return Ok((s.into(), addr));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(Interest::Readable).await?
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Connects to `addr`.
    ///
    /// Success means the socket *is* connected: `IORING_OP_CONNECT` can
    /// complete with 0 on a socket that is still in SYN-SENT with an error
    /// pending (seen on 6.x kernels when an ICMP "unreachable" answers the
    /// SYN while the connect call itself is still running), so both event
    /// loops confirm with `SO_ERROR` and `getpeername` before reporting it.
    pub async fn connect(&self, addr: SockAddr) -> io::Result<()> {
        let sock = socket2::SockRef::from(&*self.fd);
        if self.epoll.is_none() {
            op::connect(&self.fd, addr).await?;
        } else {
            match sock.connect(&addr) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                Err(e) => return Err(e),
            }
        }
        // Connected (the common case: one syscall): done. Not connected:
        // the pending error, if any, is why; without one it is still in
        // SYN-SENT, so wait.
        loop {
            match sock.peer_addr() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                    if let Some(e) = sock.take_error()? {
                        return Err(e);
                    }
                    self.wait(Interest::Writable).await?
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// What a listener is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListenerKind {
    /// App -> anywhere (15001).
    Outbound,
    /// Peer -> app, plaintext (15006).
    Inbound,
    /// Peer proxy -> app through the HBONE tunnel (15008).
    Tunnel,
}

impl std::fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ListenerKind::Outbound => "outbound",
            ListenerKind::Inbound => "inbound",
            ListenerKind::Tunnel => "tunnel",
        })
    }
}

/// Creates one listener. Must run with the thread inside the pod's netns.
pub fn make_listener(
    addr: SocketAddr,
    transparent: bool,
    mark: u32,
    backlog: u32,
) -> io::Result<OwnedFd> {
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        None,
    )?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    // SO_REUSEADDR: accepted children inherit it, so an app that itself uses
    // SO_REUSEADDR can (re)bind ports that proxied connections occupy.
    sock.set_reuse_address(true)?;
    // One listener per worker and port (and the next proxy during an upgrade).
    sock.set_reuse_port(true)?;
    sock.set_mark(mark)?;
    if transparent {
        sock.set_ip_transparent(true)?;
    }
    sock.set_nodelay(true)?;
    sock.bind(&addr.into())?;
    sock.listen(backlog.min(i32::MAX as u32) as i32)?;
    Ok(sock.into())
}

/// Creates the upstream socket of a proxied connection. Must run with the
/// thread inside the pod's netns. With `spoof_source`, the socket is bound
/// transparently to that client IP (the kernel picks the port at connect),
/// so the app sees who called.
pub fn make_upstream(
    dst: SocketAddr,
    mark: u32,
    spoof_source: Option<IpAddr>,
    ports: PortSplit,
) -> io::Result<OwnedFd> {
    let sock = new_upstream(dst.is_ipv6(), mark, spoof_source.is_some(), ports)?;
    if let Some(src) = spoof_source {
        bind_spoofed(sock.as_fd(), src, dst)?;
    }
    Ok(sock)
}

/// The part of [`make_upstream`] that needs the pod's netns: an unbound
/// upstream socket of the family (`v6`) with every option set (for a
/// `spoofed` one, transparent, its port taken at connect). A socket keeps
/// the netns it was made in, so one made ahead serves a later connection
/// ([`bind_spoofed`] and the connect need no netns switch).
pub fn new_upstream(v6: bool, mark: u32, spoofed: bool, ports: PortSplit) -> io::Result<OwnedFd> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let sock = Socket::new(domain, Type::STREAM.nonblocking().cloexec(), None)?;
    sock.set_mark(mark)?;
    sock.set_nodelay(true)?;
    // The socket takes an ephemeral port inside the pod: SO_REUSEADDR lets
    // an app that uses SO_REUSEADDR itself still bind that port (it never
    // listens, so it cannot conflict with such a bind).
    sock.set_reuse_address(true)?;
    // Source ports: the proxy's own upstream connections take the lower
    // half of the pod's ephemeral range, spoofed ones the upper half. A
    // spoofed flow (client IP, port P) -> app must never share its 4-tuple
    // with a real flow from that client; between ringway proxies, the real
    // flow's port always comes from the other half.
    let (lo, hi) = if spoofed {
        ports.spoofed()
    } else {
        ports.own()
    };
    crate::sys::set_local_port_range(sock.as_fd(), lo, hi);
    if spoofed {
        sock.set_ip_transparent(true)?;
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::IpBindAddressNoPort, &true)
            .map_err(io::Error::from)?;
    }
    Ok(sock.into())
}

/// Makes the coming connect of `sock` hold back its handshake's last ACK
/// until the first bytes are written, and send it with them (Linux: a
/// connecting socket out of quick-ack mode delays that ACK; the delayed-ACK
/// timer sends it alone if nothing is written). The app's `accept` then
/// finds the connection with its first bytes: one segment fewer, and one
/// wake-up of the app fewer than an accept followed by a read that waits.
/// Only for a connect the caller writes on at once: a peer that speaks
/// first would wait for that timer. Back to normal acking after the
/// handshake. A saving only: if the option cannot be set, the connect
/// goes on as it would have.
pub fn hold_last_ack(sock: BorrowedFd<'_>) {
    if let Err(e) = socket2::SockRef::from(&sock).set_quickack(false) {
        tracing::debug!(error = %e, "TCP_QUICKACK unavailable: the handshake's last ACK goes alone");
    }
}

/// Binds a spoofed upstream socket ([`new_upstream`]) to the client's
/// address `src` (mapped to IPv6 for an IPv6 `dst`), port chosen at connect.
pub fn bind_spoofed(sock: BorrowedFd<'_>, src: IpAddr, dst: SocketAddr) -> io::Result<()> {
    let src = match (src, dst) {
        (IpAddr::V4(v4), SocketAddr::V6(_)) => IpAddr::V6(v4.to_ipv6_mapped()),
        (s, _) => s,
    };
    socket2::SockRef::from(&sock).bind(&SocketAddr::new(src, 0).into())
}

/// A pod's ephemeral port range, split between the proxy's own upstream
/// connections (lower half) and spoofed-source ones (upper half).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSplit {
    /// First port of the pod's `ip_local_port_range`.
    pub lo: u16,
    /// Last port of the range.
    pub hi: u16,
}

impl Default for PortSplit {
    fn default() -> Self {
        PortSplit {
            lo: 32768,
            hi: 60999,
        }
    }
}

impl PortSplit {
    /// Reads `net.ipv4.ip_local_port_range` of the calling thread's netns.
    pub fn current() -> PortSplit {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| {
                let mut it = s.split_whitespace().map(|v| v.parse::<u16>());
                match (it.next(), it.next()) {
                    (Some(Ok(lo)), Some(Ok(hi))) if hi > lo + 1 => Some(PortSplit { lo, hi }),
                    _ => None,
                }
            })
            .unwrap_or_default()
    }

    fn mid(&self) -> u16 {
        self.lo + (self.hi - self.lo) / 2
    }

    /// The proxy's own upstream connections.
    pub fn own(&self) -> (u16, u16) {
        (self.lo, self.mid())
    }

    /// Connections whose source is spoofed to the client's address.
    pub fn spoofed(&self) -> (u16, u16) {
        (self.mid() + 1, self.hi)
    }
}

/// The destination the client originally asked for.
pub fn original_dst(fd: BorrowedFd<'_>, nat: bool, v6: bool) -> io::Result<SocketAddr> {
    let sock = socket2::SockRef::from(&fd);
    let addr = if nat {
        if v6 {
            sock.original_dst_ipv6()?
        } else {
            sock.original_dst()?
        }
    } else {
        sock.local_addr()?
    };
    addr.as_socket().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "original destination is not an IP address",
        )
    })
}
