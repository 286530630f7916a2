//! The agent side of ZDS, above the proxy connection: the SEQPACKET
//! listener, and one thread per proxy connection (hello, snapshot, catch-up,
//! idle watch). The pods come from the owner of the state through the narrow
//! [`Proxies`] trait; the server never reaches into it.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use socket2::{Domain, SockAddr, Socket, Type};

use super::config::{ACK_TIMEOUT, MAX_ZDS_CONNECTIONS};
use super::error::StartError;
use super::lifecycle::Lifecycle;
use super::locks::lock;
use super::metrics::AgentMetrics;
use super::proxy_conn::{
    add_request, conn_err, del_request, keep_request, snapshot_sent, Conn, ConnError, SnapItem,
};
use super::sockets::{check_peer, chmod_600, clear_stale, create_parent, temp_path};
use ringway_zds::{self as zds, Answer, ZdsError};

/// How often idle loops look at the shutdown flag.
const TICK_MS: u16 = 200;
/// Why a connection ends when the agent stops.
const SHUTTING_DOWN: &str = "agent shutting down";
/// Catch-up rounds after the snapshot before giving up on a connection
/// (each round sends what changed while the previous one was on the wire).
const MAX_CATCH_UP_ROUNDS: usize = 100;

/// What a proxy connection needs from the owner of the pods.
pub(super) trait Proxies: Send + Sync + 'static {
    /// Releases the namespaces that are gone, registers `conn` (not ready)
    /// and returns the snapshot with the generation it reflects.
    fn snapshot(&self, conn: &Arc<Conn>) -> (Vec<SnapItem>, u64);
    /// After `SnapshotSent`: either marks `conn` ready (nothing changed since
    /// generation `seen`: `None`), or returns what changed: pods to Add (new
    /// netns) and UIDs to Del, relative to what the connection was `told`.
    fn catch_up(
        &self,
        conn: &Conn,
        seen: &mut u64,
        told: &BTreeMap<String, Option<u64>>,
    ) -> Option<(Vec<SnapItem>, Vec<String>)>;
    /// Closes `conn` and forgets it; logs once (returns whether it was still
    /// registered).
    fn drop_conn(&self, conn: &Conn, why: &str) -> bool;
}

/// Why a proxy connection ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("hello: {0}")]
    Hello(#[source] ConnError),
    #[error("hello: it carried a file descriptor")]
    HelloFd,
    #[error("hello: {0}")]
    HelloDecode(#[source] ZdsError),
    #[error("snapshot {what} of pod {uid}: {source}")]
    Snapshot {
        what: &'static str,
        uid: String,
        source: ConnError,
    },
    #[error("SnapshotSent: {0}")]
    SnapshotSent(#[source] ConnError),
    #[error("catch-up {what} of pod {uid}: {source}")]
    CatchUp {
        what: &'static str,
        uid: String,
        source: ConnError,
    },
    #[error("pods kept changing through {MAX_CATCH_UP_ROUNDS} catch-up rounds")]
    KeptChanging,
    #[error("polling the connection: {0}")]
    Poll(#[source] nix::errno::Errno),
    #[error("the proxy hung up")]
    HungUp,
    #[error("unsolicited packet: {0}")]
    Unsolicited(#[source] ZdsError),
    #[error("protocol violation: unsolicited packet of {0} bytes")]
    UnsolicitedPacket(usize),
}

fn seqpacket_connects(path: &Path) -> bool {
    let Ok(s) = Socket::new(Domain::UNIX, Type::SEQPACKET, None) else {
        return false;
    };
    let Ok(addr) = SockAddr::unix(path) else {
        return false;
    };
    s.connect(&addr).is_ok()
}

/// Binds the ZDS listener (mode 0600, non-blocking).
pub(super) fn bind(path: &Path) -> Result<Socket, StartError> {
    let err = |what: &'static str| {
        let path = path.to_path_buf();
        move |source| StartError::Socket { what, path, source }
    };
    create_parent(path)?;
    clear_stale(path, seqpacket_connects)?;
    let tmp = temp_path(path);
    let _ = std::fs::remove_file(&tmp);
    let sock =
        Socket::new(Domain::UNIX, Type::SEQPACKET, None).map_err(err("creating the ZDS socket"))?;
    let addr = SockAddr::unix(&tmp).map_err(err("naming the ZDS socket"))?;
    sock.bind(&addr).map_err(err("binding the ZDS socket"))?;
    let placed = chmod_600(&tmp)
        .map_err(err("setting the mode of the ZDS socket"))
        .and_then(|()| sock.listen(128).map_err(err("listening on the ZDS socket")))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(err("moving the ZDS socket to")))
        .and_then(|()| {
            sock.set_nonblocking(true)
                .map_err(err("configuring the ZDS socket"))
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    tracing::info!(path = %path.display(), "ZDS socket listening");
    Ok(sock)
}

/// The ZDS server: its connections, the pods' owner behind them.
pub(super) struct ZdsServer {
    proxies: Arc<dyn Proxies>,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<AgentMetrics>,
    peer_uids: Vec<u32>,
    /// Connections being served (at most [`MAX_ZDS_CONNECTIONS`]).
    open: AtomicUsize,
    next_id: AtomicU64,
}

impl ZdsServer {
    /// A server of `proxies`' pods to the proxies whose uid is in `peer_uids`.
    pub(super) fn new(
        proxies: Arc<dyn Proxies>,
        lifecycle: Arc<Lifecycle>,
        metrics: Arc<AgentMetrics>,
        peer_uids: Vec<u32>,
    ) -> ZdsServer {
        ZdsServer {
            proxies,
            lifecycle,
            metrics,
            peer_uids,
            open: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    /// Accepts proxies until shutdown; one worker thread per connection.
    pub(super) fn accept_loop(self: Arc<Self>, listener: Socket) {
        while !self.lifecycle.is_stopping() {
            let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(TICK_MS)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "polling the ZDS listener");
                    std::thread::sleep(Duration::from_millis(u64::from(TICK_MS)));
                    continue;
                }
            }
            // A proxy that connected while the agent began to stop is not
            // served: closing the listener resets it, and it reconnects to
            // the next agent.
            if self.lifecycle.is_stopping() {
                break;
            }
            match listener.accept() {
                Ok((sock, _)) => self.accepted(sock),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a proxy connection");
                    std::thread::sleep(Duration::from_millis(u64::from(TICK_MS)));
                }
            }
        }
    }

    fn accepted(self: &Arc<Self>, sock: Socket) {
        if let Err(why) = check_peer(&sock, "zds", &self.peer_uids) {
            self.metrics.refuse("zds", why.reason());
            tracing::warn!(reason = %why, "ZDS connection refused");
            return;
        }
        if self.open.fetch_add(1, Ordering::SeqCst) >= MAX_ZDS_CONNECTIONS {
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.metrics.refuse("zds", "connection_cap");
            tracing::warn!("ZDS connection refused: {MAX_ZDS_CONNECTIONS} connections are open");
            return;
        }
        let slot = ZdsSlot(self.clone());
        let setup = sock
            .set_nonblocking(false)
            .and_then(|()| sock.set_read_timeout(Some(ACK_TIMEOUT)))
            .and_then(|()| sock.set_write_timeout(Some(ACK_TIMEOUT)));
        if let Err(e) = setup {
            tracing::warn!(error = %e, "configuring a proxy connection; closing it");
            return;
        }
        let pid = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)
            .ok()
            .map(|c| c.pid());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(id, pid, sock));
        let name = format!("ringway-zds-{}", conn.id);
        let conn2 = conn.clone();
        if let Err(e) = self.lifecycle.spawn_worker(name, move || {
            slot.0.serve(&conn2);
            drop(slot);
        }) {
            tracing::warn!(error = %e, "no thread for a proxy connection; closing it");
            conn.kill();
        }
    }

    /// One proxy connection, from hello to hang-up.
    fn serve(&self, conn: &Arc<Conn>) {
        let span = tracing::info_span!("zds", proxy.conn = conn.id, proxy.pid = ?conn.pid);
        let _span = span.enter();
        match self.session(conn) {
            // Shutdown, or the connection was dropped (and logged) on use.
            Ok(()) => {
                self.proxies.drop_conn(conn, SHUTTING_DOWN);
            }
            // The agent shut the connection down itself (a hang-up seen
            // then is its own doing): the orderly end, not the proxy's fault.
            Err(_) if self.lifecycle.is_stopping() => {
                self.proxies.drop_conn(conn, SHUTTING_DOWN);
            }
            Err(why) => {
                if !self.proxies.drop_conn(conn, &why.to_string()) {
                    // Never registered: the hello failed.
                    tracing::warn!(reason = %why, "proxy connection closed");
                }
            }
        }
    }

    fn session(&self, conn: &Arc<Conn>) -> Result<(), SessionError> {
        hello(conn)?;
        tracing::info!("proxy connected; sending the snapshot");
        let (items, mut seen) = self.proxies.snapshot(conn);
        let mut told: BTreeMap<String, Option<u64>> = BTreeMap::new();
        let (mut adds, mut keeps) = (0, 0);
        for item in &items {
            let uid = &item.pod.uid;
            let (req, what) = match &item.netns {
                Some(_) => (add_request(&item.pod), "Add"),
                None => (keep_request(uid), "Keep"),
            };
            let answer = conn
                .exchange(&req, item.netns.as_ref().map(|f| f.as_fd()))
                .map_err(|source| SessionError::Snapshot {
                    what,
                    uid: uid.clone(),
                    source,
                })?;
            if let Answer::Nack(reason) = answer {
                // The proxy keeps the pod and retries it on its own.
                tracing::warn!(pod.uid = %uid, %reason, "proxy nacked {what} in the snapshot");
            }
            match item.netns {
                Some(_) => adds += 1,
                None => keeps += 1,
            }
            told.insert(uid.clone(), item.inode);
        }
        let answer = conn
            .exchange(&snapshot_sent(), None)
            .map_err(SessionError::SnapshotSent)?;
        if let Answer::Nack(reason) = answer {
            tracing::warn!(%reason, "proxy nacked SnapshotSent");
        }
        tracing::info!(adds, keeps, "snapshot sent");
        self.catch_up(conn, &mut seen, &mut told)?;
        tracing::info!("proxy ready");
        self.idle(conn)
    }

    /// Sends what changed while the snapshot was on the wire, until nothing
    /// did; the connection becomes ready in the same critical section that
    /// sees no change.
    fn catch_up(
        &self,
        conn: &Conn,
        seen: &mut u64,
        told: &mut BTreeMap<String, Option<u64>>,
    ) -> Result<(), SessionError> {
        for _ in 0..MAX_CATCH_UP_ROUNDS {
            if self.lifecycle.is_stopping() {
                return Ok(());
            }
            let Some((adds, dels)) = self.proxies.catch_up(conn, seen, told) else {
                return Ok(());
            };
            for SnapItem { pod, netns, inode } in adds {
                let answer = conn
                    .exchange(&add_request(&pod), netns.as_ref().map(|f| f.as_fd()))
                    .map_err(|source| SessionError::CatchUp {
                        what: "Add",
                        uid: pod.uid.clone(),
                        source,
                    })?;
                if let Answer::Nack(reason) = answer {
                    tracing::warn!(pod.uid = %pod.uid, %reason, "proxy nacked a catch-up Add");
                }
                told.insert(pod.uid, inode);
            }
            for uid in dels {
                let answer = conn.exchange(&del_request(&uid), None).map_err(|source| {
                    SessionError::CatchUp {
                        what: "Del",
                        uid: uid.clone(),
                        source,
                    }
                })?;
                if let Answer::Nack(reason) = answer {
                    tracing::warn!(pod.uid = %uid, %reason, "proxy nacked a catch-up Del");
                }
                told.remove(&uid);
            }
        }
        Err(SessionError::KeptChanging)
    }

    /// Watches an idle connection for a hang-up or an unsolicited packet.
    ///
    /// Polls for POLLIN; the kernel adds POLLHUP/POLLERR by itself when the
    /// proxy closes. (nix's `PollFlags` cannot carry POLLRDHUP; a half-close
    /// shows as POLLIN with a zero-length read, which is treated the same.)
    fn idle(&self, conn: &Conn) -> Result<(), SessionError> {
        let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
        // `None`: bits nix does not know were set; look closer as for POLLIN.
        let events = |timeout: PollTimeout| -> Result<Option<PollFlags>, SessionError> {
            let mut fds = [PollFd::new(conn.sock.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(0) => Ok(Some(PollFlags::empty())),
                Ok(_) => Ok(fds[0].revents()),
                Err(nix::errno::Errno::EINTR) => Ok(Some(PollFlags::empty())),
                Err(e) => Err(SessionError::Poll(e)),
            }
        };
        loop {
            if self.lifecycle.is_stopping() {
                return Ok(());
            }
            if conn.is_dead() {
                return Ok(());
            }
            let ev = events(PollTimeout::from(TICK_MS))?;
            if ev.is_some_and(|e| e.intersects(gone)) {
                return Err(SessionError::HungUp);
            }
            if ev.is_some_and(|e| e.is_empty()) {
                continue;
            }
            // Maybe the ack of an exchange in flight: look again once it is done.
            let _io = lock(&conn.io);
            let ev = events(PollTimeout::ZERO)?;
            if ev.is_some_and(|e| e.intersects(gone)) {
                return Err(SessionError::HungUp);
            }
            if ev.is_some_and(|e| e.is_empty()) {
                continue;
            }
            return match zds::recv(conn.sock.as_fd(), &zds::refuse_fd) {
                Err(ZdsError::Closed) => Err(SessionError::HungUp),
                Err(e) => Err(SessionError::Unsolicited(e)),
                Ok(p) => Err(SessionError::UnsolicitedPacket(p.bytes.len())),
            };
        }
    }
}

/// One of the [`MAX_ZDS_CONNECTIONS`] connection slots, given back on drop.
struct ZdsSlot(Arc<ZdsServer>);

impl Drop for ZdsSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

fn hello(conn: &Conn) -> Result<(), SessionError> {
    let p = zds::recv(conn.sock.as_fd(), &zds::refuse_fd)
        .map_err(|e| SessionError::Hello(conn_err(e)))?;
    if p.fd_count > 0 {
        return Err(SessionError::HelloFd);
    }
    zds::decode_hello(&p.bytes).map_err(SessionError::HelloDecode)
}
