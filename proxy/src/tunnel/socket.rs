//! The tunnel's sockets as tokio streams (the adapter: every worker
//! runtime carries a current-thread tokio reactor): an accepted client
//! adopted, and an upstream made inside a pod's netns and connected.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

use crate::pod::PodShared;
use crate::{sock, sys};

/// A nonblocking socket made inside `pod`'s netns (proxy mark, optionally
/// spoofing `spoof` as its source), connected through the tokio reactor.
pub(super) async fn connect_in_pod(
    pod: &PodShared,
    mark: u32,
    dst: SocketAddr,
    spoof: Option<IpAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let fd = sys::in_netns(pod.netns.as_fd(), || {
        sock::make_upstream(dst, mark, spoof, pod.ports)
    })??;
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
