//! Traffic helpers: deterministic payloads verified byte for byte, and a
//! "payload server" that both receives and sends at the same time.
//!
//! Wire protocol of the payload exchange (client -> server first):
//! a 16-byte header `[u64 LE: bytes the client sends][u64 LE: bytes the server
//! sends back]`, then both sides stream their bytes concurrently, each side
//! shuts down its write half when done and reads to EOF. Client bytes follow
//! [`CLIENT_SEED`], server bytes [`SERVER_SEED`].

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// `read` that retries EINTR. A blocking socket with a receive timeout
/// (as every test socket has) returns EINTR for any signal the process
/// gets, even a stop and continue from outside: never the peer's answer.
pub trait ReadNoIntr: Read {
    /// One `read`, retried while it is interrupted.
    fn read_no_intr(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }
}

impl<R: Read + ?Sized> ReadNoIntr for R {}

/// Seed of the client -> server byte stream.
pub const CLIENT_SEED: u64 = 0x005e_edc1_1e47;
/// Seed of the server -> client byte stream.
pub const SERVER_SEED: u64 = 0x005e_ed5e_77e4;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Fills `buf` with the pattern bytes at stream offset `offset`.
pub fn pattern_fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < buf.len() {
        let block = pos / 8;
        let within = (pos % 8) as usize;
        let word = splitmix(seed ^ block.wrapping_mul(0xA076_1D64_78BD_642F)).to_le_bytes();
        let take = (8 - within).min(buf.len() - i);
        buf[i..i + take].copy_from_slice(&word[within..within + take]);
        i += take;
        pos += take as u64;
    }
}

/// Writes `len` pattern bytes of `seed`.
pub fn write_pattern(w: &mut impl Write, seed: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    while off < len {
        let n = ((len - off) as usize).min(buf.len());
        pattern_fill(seed, off, &mut buf[..n]);
        w.write_all(&buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// Reads to EOF and checks every byte against the pattern of `seed`.
/// Returns the number of bytes read, or an error naming the first bad offset.
pub fn read_verify(r: &mut impl Read, seed: u64) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut want = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(off),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        pattern_fill(seed, off, &mut want[..n]);
        if buf[..n] != want[..n] {
            let bad = buf[..n]
                .iter()
                .zip(&want[..n])
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("payload corrupted at byte {}", off + bad as u64),
            ));
        }
        off += n as u64;
    }
}

/// What the server saw of one exchange.
#[derive(Debug, Clone)]
pub struct ServerReport {
    /// The peer address the server's socket saw (the "real client IP" check).
    pub peer: SocketAddr,
    /// The server socket's local address.
    pub local: SocketAddr,
    /// Bytes the client announced.
    pub expected: u64,
    /// Bytes received and verified, or the error.
    pub received: Result<u64, String>,
}

/// Runs the client side of an exchange on an already connected stream:
/// sends `send` bytes while receiving `recv` bytes. Returns the verified
/// number of bytes received.
pub fn client_exchange(stream: TcpStream, send: u64, recv: u64) -> io::Result<u64> {
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&send.to_le_bytes());
    header[8..].copy_from_slice(&recv.to_le_bytes());
    let mut w = stream.try_clone()?;
    w.write_all(&header)?;
    let writer = std::thread::spawn(move || -> io::Result<()> {
        write_pattern(&mut w, CLIENT_SEED, send)?;
        w.shutdown(Shutdown::Write)
    });
    let mut r = stream;
    let got = read_verify(&mut r, SERVER_SEED);
    let wres = writer.join().expect("writer thread panicked");
    let got = got?;
    wres?;
    if got != recv {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("received {got} of {recv} bytes"),
        ));
    }
    Ok(got)
}

/// Handles one server-side exchange.
pub fn server_exchange(stream: TcpStream) -> ServerReport {
    let peer = stream
        .peer_addr()
        .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
    let local = stream
        .local_addr()
        .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
    let mut r = stream;
    let mut header = [0u8; 16];
    if let Err(e) = r.read_exact(&mut header) {
        return ServerReport {
            peer,
            local,
            expected: 0,
            received: Err(format!("reading header: {e}")),
        };
    }
    let expected = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
    let send = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
    let mut w = match r.try_clone() {
        Ok(w) => w,
        Err(e) => {
            return ServerReport {
                peer,
                local,
                expected,
                received: Err(e.to_string()),
            }
        }
    };
    let writer = std::thread::spawn(move || -> io::Result<()> {
        write_pattern(&mut w, SERVER_SEED, send)?;
        w.shutdown(Shutdown::Write)
    });
    let got = read_verify(&mut r, CLIENT_SEED);
    let wres = writer.join().expect("writer thread panicked");
    let received = match (got, wres) {
        (Ok(n), Ok(())) if n == expected => Ok(n),
        (Ok(n), Ok(())) => Err(format!("received {n} of {expected} bytes")),
        (Err(e), _) => Err(format!("receiving: {e}")),
        (_, Err(e)) => Err(format!("sending: {e}")),
    };
    ServerReport {
        peer,
        local,
        expected,
        received,
    }
}

/// A payload server running on its own threads; reports each exchange.
#[derive(Debug)]
pub struct PayloadServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// One report per finished exchange.
    pub reports: mpsc::Receiver<ServerReport>,
    _accept: JoinHandle<()>,
}

impl PayloadServer {
    /// Serves exchanges on `listener` (already bound, in whatever netns it was
    /// created) on a thread per connection, until `max_conns` were accepted.
    pub fn start(listener: TcpListener, max_conns: usize) -> PayloadServer {
        let addr = listener.local_addr().expect("listener address");
        let (tx, rx) = mpsc::channel();
        let accept = std::thread::spawn(move || {
            for _ in 0..max_conns {
                let Ok((s, _)) = listener.accept() else { break };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(server_exchange(s));
                });
            }
        });
        PayloadServer {
            addr,
            reports: rx,
            _accept: accept,
        }
    }

    /// Waits for the next report.
    pub fn next_report(&self, timeout: Duration) -> Option<ServerReport> {
        self.reports.recv_timeout(timeout).ok()
    }
}

/// Binds a TCP listener on `addr` (use port 0 for any).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    sock.set_reuse_address(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

/// Connects with a timeout.
pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// An echo server: every connection, on a thread of its own, gets back
/// what it sends until EOF (then its write half is shut down). Records the
/// peers it accepted and, per closed connection, how many bytes it echoed.
/// Stops accepting when dropped.
#[derive(Debug)]
pub struct EchoServer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
    peers: std::sync::Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    closed: mpsc::Receiver<(SocketAddr, u64)>,
}

impl EchoServer {
    /// Serves `l` (bound in whatever netns the caller chose).
    pub fn start(l: TcpListener) -> EchoServer {
        use std::os::fd::AsFd;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let peers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, closed) = mpsc::channel();
        let (s, p) = (stop.clone(), peers.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                // Wait for a connection for at most 50 ms, then look at `stop`.
                let mut fds = [nix::poll::PollFd::new(
                    l.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u8)).unwrap_or(0) == 0 {
                    continue;
                }
                let Ok((mut c, peer)) = l.accept() else {
                    continue;
                };
                p.lock().unwrap_or_else(|e| e.into_inner()).push(peer);
                let tx = tx.clone();
                // Small stacks: a test may hold a thousand connections.
                let _ = std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        let mut echoed = 0u64;
                        while let Ok(n @ 1..) = c.read_no_intr(&mut buf) {
                            if c.write_all(&buf[..n]).is_err() {
                                break;
                            }
                            echoed += n as u64;
                        }
                        let _ = c.shutdown(Shutdown::Write);
                        let _ = tx.send((peer, echoed));
                    });
            }
        });
        EchoServer {
            stop,
            thread: Some(thread),
            peers,
            closed,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.peers().len()
    }

    /// The peers of the connections accepted so far, in order.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The next connection to end (EOF or error): its peer and the bytes
    /// echoed; `None` when none ends within `timeout`.
    pub fn next_closed(&self, timeout: Duration) -> Option<(SocketAddr, u64)> {
        self.closed.recv_timeout(timeout).ok()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A listener that is gone when it is dropped.
///
/// Closing a listening socket does not end it while another copy of its
/// descriptor lives, and every process the test binary spawns (`ip`, `nft`,
/// from any test thread) holds a copy of all its descriptors from fork until
/// exec. A test that drops a listener on a fixed port and at once expects
/// that port to refuse, or binds it again, then loses that race now and
/// then. Dropping a `Listener` closes it and waits (up to 2 s) until its
/// namespace no longer lists the address as listening.
#[derive(Debug)]
pub struct Listener {
    inner: Option<TcpListener>,
    netns: crate::Netns,
    local: SocketAddr,
}

impl Listener {
    /// Takes `l`, a listener created inside `netns`.
    pub fn adopt(netns: &crate::Netns, l: TcpListener) -> io::Result<Listener> {
        let local = l.local_addr()?;
        Ok(Listener {
            inner: Some(l),
            netns: netns.clone(),
            local,
        })
    }

    /// Binds a listener on `addr` inside `netns`, as [`listen`] does.
    pub fn bind(netns: &crate::Netns, addr: SocketAddr) -> io::Result<Listener> {
        let l = netns.run(|| listen(addr))?;
        Listener::adopt(netns, l)
    }
}

impl std::ops::Deref for Listener {
    type Target = TcpListener;
    fn deref(&self) -> &TcpListener {
        self.inner.as_ref().expect("listener present until drop")
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let Some(l) = self.inner.take() else {
            return;
        };
        let local = self.local;
        // Seen listening first, so the wait below proves something.
        if !matches!(self.netns.run(|| is_listening(local)), Ok(true)) {
            eprintln!("listener {local}: not in its namespace's socket table before closing: its close is not waited for");
        }
        drop(l);
        let gone = self.netns.run(|| {
            crate::wait_until(Duration::from_secs(2), || {
                matches!(is_listening(local), Ok(false))
            })
        });
        if !gone {
            eprintln!("listener {local}: still listed (or the socket table unreadable) 2 s after it was closed");
        }
    }
}

/// Whether the calling thread's network namespace has a TCP socket
/// listening on exactly `addr` (from `/proc/thread-self/net/tcp{,6}`).
pub fn is_listening(addr: SocketAddr) -> io::Result<bool> {
    let file = if addr.is_ipv6() { "tcp6" } else { "tcp" };
    let table = std::fs::read_to_string(format!("/proc/thread-self/net/{file}"))?;
    Ok(table
        .lines()
        .skip(1)
        .filter_map(parse_socket_line)
        .any(|(local, state)| {
            state == TCP_LISTEN && local.ip() == addr.ip() && local.port() == addr.port()
        }))
}

/// `st` of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN: u8 = 0x0A;

/// The local address and state of one line of `/proc/net/tcp{,6}`. The
/// kernel prints each 32-bit word of the address as it lies in memory, so
/// the words are turned back into bytes in native order.
fn parse_socket_line(line: &str) -> Option<(SocketAddr, u8)> {
    let mut fields = line.split_whitespace();
    let local = fields.nth(1)?;
    let state = u8::from_str_radix(fields.nth(1)?, 16).ok()?;
    let (ip_hex, port_hex) = local.split_once(':')?;
    if ip_hex.len() != 8 && ip_hex.len() != 32 {
        return None;
    }
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for chunk in ip_hex.as_bytes().chunks(8) {
        let word = u32::from_str_radix(std::str::from_utf8(chunk).ok()?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip: std::net::IpAddr = match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes.as_slice()).ok()?.into(),
        16 => <[u8; 16]>::try_from(bytes.as_slice()).ok()?.into(),
        _ => return None,
    };
    Some((SocketAddr::new(ip, port), state))
}

#[cfg(test)]
mod socket_table_tests {
    use super::*;

    #[test]
    fn socket_table_lines_parse() {
        let v4 = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let (a, st) = parse_socket_line(v4).unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(a, "127.0.0.1:8080".parse().unwrap());
        }
        assert_eq!(st, TCP_LISTEN);
        let v6 = "   0: 00000000000000000000000001000000:3A98 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let (a, _) = parse_socket_line(v6).unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(a, "[::1]:15000".parse().unwrap());
        }
        assert_eq!(
            parse_socket_line("  sl  local_address rem_address   st"),
            None
        );
        assert_eq!(parse_socket_line("   0: 0100007F 00000000:0000 0A"), None);
        assert_eq!(
            parse_socket_line("   0: 0100007:1F90 00000000:0000 0A"),
            None
        );
    }

    #[test]
    fn a_live_listener_is_listed_and_a_dropped_one_is_not() {
        crate::run_isolated("a_live_listener_is_listed_and_a_dropped_one_is_not", || {
            let netns = crate::Netns::create("listed").unwrap();
            for any in ["127.0.0.1:0", "[::1]:0", "0.0.0.0:0", "[::]:0"] {
                let l = Listener::bind(&netns, any.parse().unwrap()).unwrap();
                let addr = l.local_addr().unwrap();
                assert!(netns.run(|| is_listening(addr)).unwrap(), "{addr}");
                let other = SocketAddr::new(addr.ip(), addr.port() ^ 1);
                assert!(!netns.run(|| is_listening(other)).unwrap(), "{other}");
                drop(l);
                assert!(!netns.run(|| is_listening(addr)).unwrap(), "{addr}");
            }
        });
    }
}
