//! The tunnel's sockets as tokio streams (the adapter: every worker
//! runtime carries a current-thread tokio reactor): an accepted client
//! adopted, and an upstream made inside a pod's netns and connected.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

use crate::pod::PodShared;

/// A nonblocking socket made inside `pod`'s netns (proxy mark, optionally
/// spoofing `spoof` as its source; one of the pod's spares, see
/// [`PodShared::upstream_socket`]), connected through the tokio reactor.
/// `bytes_ready`: the caller writes as soon as the connect completes, so
/// the handshake's last ACK waits for those bytes and goes with them
/// ([`crate::sock::hold_last_ack`]). Never for a peer that may speak first.
pub(super) async fn connect_in_pod(
    pod: &PodShared,
    mark: u32,
    dst: SocketAddr,
    spoof: Option<IpAddr>,
    timeout: Duration,
    bytes_ready: bool,
) -> io::Result<TcpStream> {
    let fd = pod.upstream_socket(dst, mark, spoof)?;
    if bytes_ready {
        crate::sock::hold_last_ack(std::os::fd::AsFd::as_fd(&fd));
    }
    let sock = TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    match tokio::time::timeout(timeout, sock.connect(dst)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// The accepted client socket as a tokio stream (the adapter).
pub fn adopt(fd: OwnedFd) -> io::Result<TcpStream> {
    TcpStream::from_std(adopt_std(fd)?)
}

/// The accepted client socket, non-blocking, registered with no reactor
/// yet (it is handed to the handshake thread).
pub fn adopt_std(fd: OwnedFd) -> io::Result<std::net::TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    Ok(std)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock;

    /// Runs `f` on a thread of its own in a new network namespace (its `lo`
    /// up) with a pod of that netns (the default port split), a listener on
    /// its 127.0.0.1:15008 made as the proxy makes 15008's, and a runtime;
    /// skipped without the privilege to make a namespace.
    fn in_own_netns(
        f: impl FnOnce(PodShared, SocketAddr, std::net::TcpListener, tokio::runtime::Runtime)
            + Send
            + 'static,
    ) {
        std::thread::spawn(|| {
            if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
                eprintln!("skipped: cannot make a network namespace: {e}");
                return;
            }
            // The child runs in this thread's (new) namespace.
            let up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .expect("ip");
            assert!(up.success(), "ip link set lo up");
            let netns = OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net").unwrap());
            let pod = PodShared::new(
                "pod",
                netns,
                Vec::new(),
                sock::PortSplit::default(),
                Default::default(),
                String::new(),
            );
            let addr: SocketAddr = "127.0.0.1:15008".parse().unwrap();
            let listener =
                std::net::TcpListener::from(sock::make_listener(addr, false, 0, 16).unwrap());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            f(pod, addr, listener, rt);
        })
        .join()
        .unwrap();
    }

    /// Both ends of a tunnel have Nagle off, read back with getsockopt: the
    /// client end as [`connect_in_pod`] makes it for a dial, the server end
    /// as accepted from a pod's tunnel listener made by
    /// [`sock::make_listener`] (as the proxy makes 15008's) and adopted. With
    /// Nagle on, a 64 B DATA record written while the previous one is not
    /// yet acknowledged would wait for that ACK (up to the peer's delayed
    /// ACK, 40 ms).
    #[test]
    fn tunnel_sockets_have_nagle_off_at_both_ends() {
        in_own_netns(|pod, addr, listener, rt| {
            let client = rt
                .block_on(connect_in_pod(
                    &pod,
                    0,
                    addr,
                    None,
                    Duration::from_secs(5),
                    false,
                ))
                .unwrap();
            let (server, _) = listener.accept().unwrap();
            let server = adopt_std(OwnedFd::from(server)).unwrap();
            assert!(client.nodelay().unwrap(), "the dialling end has Nagle on");
            assert!(server.nodelay().unwrap(), "the accepted end has Nagle on");
        });
    }

    /// Upstream sockets come from the pod's spares: the first connection
    /// makes a batch in one netns switch and keeps the rest; the next one
    /// takes a spare, made in the pod's netns with the same options (Nagle
    /// off, the proxy's half of the pod's port range); a spoofed socket is
    /// never served from the proxy's own spares.
    #[test]
    fn upstream_sockets_come_from_the_pods_spares() {
        in_own_netns(|pod, addr, listener, rt| {
            let connect = || {
                rt.block_on(connect_in_pod(
                    &pod,
                    0,
                    addr,
                    None,
                    Duration::from_secs(5),
                    false,
                ))
                .unwrap()
            };
            let batch = crate::pod::SPARE_BATCH;
            let first = connect();
            assert_eq!(pod.spares.len(), batch - 1, "the rest of the batch is kept");
            let second = connect();
            assert_eq!(pod.spares.len(), batch - 2, "the second took a spare");
            let (lo, hi) = pod.ports.own();
            for c in [&first, &second] {
                assert!(c.nodelay().unwrap(), "a spare has Nagle on");
                let port = c.local_addr().unwrap().port();
                assert!(
                    (lo..=hi).contains(&port),
                    "port {port} is outside the proxy's half {lo}-{hi}"
                );
                let _ = listener.accept().unwrap();
            }
            // A spoofed one is made anew (its own kind), the own ones stay.
            let spoofed = pod
                .upstream_socket(addr, 0, Some("127.0.0.1".parse().unwrap()))
                .unwrap();
            assert_eq!(pod.spares.len(), (batch - 2) + (batch - 1));
            let transparent =
                nix::sys::socket::getsockopt(&spoofed, nix::sys::socket::sockopt::IpTransparent)
                    .unwrap();
            assert!(transparent, "a spoofed socket is transparent");
        });
    }
}
