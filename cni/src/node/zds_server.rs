//! The agent side of ZDS: the SEQPACKET listener, one thread per proxy
//! connection (hello, snapshot, catch-up, idle watch), and request/ack
//! exchanges with 5 s deadlines.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use socket2::{Domain, SockAddr, Socket, Type};

use super::state::{lock, Core, SnapItem};
use super::{Pod, StartError, ACK_TIMEOUT, MAX_ZDS_CONNECTIONS};
use ringway_zds::{self as zds, workload_request::Payload, WorkloadRequest, ZdsError};

/// How often idle loops look at the shutdown flag.
const TICK_MS: u16 = 200;
/// Catch-up rounds after the snapshot before giving up on a connection
/// (each round sends what changed while the previous one was on the wire).
const MAX_CATCH_UP_ROUNDS: usize = 100;

/// One proxy connection.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) pid: Option<i32>,
    sock: Socket,
    /// One request/response exchange at a time.
    io: Mutex<()>,
    dead: AtomicBool,
    ready: AtomicBool,
}

/// Why an exchange with a proxy failed; the connection is closed after any.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    /// No answer within the deadline.
    #[error("no answer within {}s", ACK_TIMEOUT.as_secs())]
    Timeout,
    /// The proxy hung up.
    #[error("the proxy closed the connection")]
    Closed,
    /// A socket call failed.
    #[error("socket error: {0}")]
    Io(std::io::Error),
    /// The proxy sent something that is not the protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
}

fn conn_err(e: ZdsError) -> ConnError {
    use std::io::ErrorKind;
    match e {
        ZdsError::Closed => ConnError::Closed,
        ZdsError::Io { source, .. } => match source.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => ConnError::Timeout,
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::NotConnected => {
                ConnError::Closed
            }
            _ => ConnError::Io(source),
        },
        other => ConnError::Protocol(other.to_string()),
    }
}

impl Conn {
    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    pub(super) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Called with the state lock held, so that ready-ness and the pods the
    /// connection was told about change together.
    pub(super) fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Marks the connection dead and shuts the socket down (wakes a blocked
    /// receive; the proxy sees EOF).
    pub(super) fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Sends one request (with `fd` as SCM_RIGHTS) and waits for its ack:
    /// `Ok(Ok(()))` acked, `Ok(Err(text))` nacked. Any `Err` kills the
    /// connection (a late ack would be read as the answer to the next request).
    pub(super) fn exchange(
        &self,
        req: &WorkloadRequest,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Result<(), String>, ConnError> {
        let _io = lock(&self.io);
        if self.is_dead() {
            return Err(ConnError::Closed);
        }
        let r = self.exchange_locked(req, fd);
        if r.is_err() {
            self.kill();
        }
        r
    }

    fn exchange_locked(
        &self,
        req: &WorkloadRequest,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Result<(), String>, ConnError> {
        zds::send(self.sock.as_fd(), req, fd).map_err(conn_err)?;
        let p = zds::recv(self.sock.as_fd(), &zds::refuse_fd).map_err(conn_err)?;
        if p.fd_count > 0 {
            return Err(ConnError::Protocol(
                "the proxy's response carried a file descriptor".into(),
            ));
        }
        zds::decode_response(&p.bytes).map_err(|e| ConnError::Protocol(e.to_string()))
    }
}

pub(super) fn add_request(pod: &Pod) -> WorkloadRequest {
    zds::request(Payload::Add(zds::AddWorkload {
        uid: pod.uid.clone(),
        workload_info: Some(zds::WorkloadInfo {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
        }),
        // ringway's extension (field 1001): the pod's addresses from the
        // CNI result or the pod's status, so the proxy never takes them from
        // the pod's own netns.
        addresses: pod.ips.iter().map(|ip| ip.to_string()).collect(),
    }))
}

pub(super) fn del_request(uid: &str) -> WorkloadRequest {
    zds::request(Payload::Del(zds::DelWorkload {
        uid: uid.to_string(),
    }))
}

fn keep_request(uid: &str) -> WorkloadRequest {
    zds::request(Payload::Keep(zds::KeepWorkload {
        uid: uid.to_string(),
    }))
}

fn snapshot_sent() -> WorkloadRequest {
    zds::request(Payload::SnapshotSent(zds::SnapshotSent {}))
}

// ---------------------------------------------------------------- sockets

/// Makes `path` free for a new socket: a stale socket file is removed, a
/// live one (something answers a connect) or a non-socket is refused.
pub(super) fn clear_stale(path: &Path, probe: impl Fn(&Path) -> bool) -> Result<(), StartError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(StartError::Socket {
                what: "inspecting",
                path: path.to_path_buf(),
                source: e,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(StartError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if probe(path) {
        return Err(StartError::InUse {
            path: path.to_path_buf(),
        });
    }
    tracing::info!(path = %path.display(), "removing a stale socket file");
    std::fs::remove_file(path).map_err(|e| StartError::Socket {
        what: "removing the stale socket",
        path: path.to_path_buf(),
        source: e,
    })
}

/// A temporary name beside `path`: sockets are bound there, made 0600, then
/// renamed into place, so nobody can connect before the mode is set.
pub(super) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Creates the socket's directory (mode 0700 for what it creates: each
/// socket has a directory of its own, mounted only by who may use it).
pub(super) fn create_parent(path: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StartError::Socket {
                what: "creating the directory of",
                path: path.to_path_buf(),
                source: e,
            })?;
    }
    Ok(())
}

pub(super) fn chmod_600(path: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
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

/// Accepts proxies until shutdown; one worker thread per connection.
pub(super) fn accept_loop(core: Arc<Core>, listener: Socket) {
    while !core.is_stopping() {
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
        match listener.accept() {
            Ok((sock, _)) => accepted(&core, sock),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accepting a proxy connection");
                std::thread::sleep(Duration::from_millis(u64::from(TICK_MS)));
            }
        }
    }
}

/// One of the [`MAX_ZDS_CONNECTIONS`] connection slots, given back on drop.
struct ZdsSlot(Arc<Core>);

impl Drop for ZdsSlot {
    fn drop(&mut self) {
        self.0.zds_conns.fetch_sub(1, Ordering::SeqCst);
    }
}

fn accepted(core: &Arc<Core>, sock: Socket) {
    if let Err(why) = core.check_peer(&sock, "zds") {
        tracing::warn!(reason = %why, "ZDS connection refused");
        return;
    }
    if core.zds_conns.fetch_add(1, Ordering::SeqCst) >= MAX_ZDS_CONNECTIONS {
        core.zds_conns.fetch_sub(1, Ordering::SeqCst);
        core.metrics.refuse("zds", "connection_cap");
        tracing::warn!("ZDS connection refused: {MAX_ZDS_CONNECTIONS} connections are open");
        return;
    }
    let slot = ZdsSlot(core.clone());
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
    let conn = Arc::new(Conn {
        id: core.next_conn_id(),
        pid,
        sock,
        io: Mutex::new(()),
        dead: AtomicBool::new(false),
        ready: AtomicBool::new(false),
    });
    let c = core.clone();
    let name = format!("ringway-zds-{}", conn.id);
    let conn2 = conn.clone();
    if let Err(e) = core.spawn_worker(name, move || {
        serve(&c, &conn2);
        drop(slot);
    }) {
        tracing::warn!(error = %e, "no thread for a proxy connection; closing it");
        conn.kill();
    }
}

/// One proxy connection, from hello to hang-up.
fn serve(core: &Core, conn: &Arc<Conn>) {
    let span = tracing::info_span!("zds", proxy.conn = conn.id, proxy.pid = ?conn.pid);
    let _span = span.enter();
    match session(core, conn) {
        // Shutdown, or the connection was dropped (and logged) on use.
        Ok(()) => {
            core.drop_conn(conn, "agent shutting down");
        }
        Err(why) => {
            if !core.drop_conn(conn, &why) {
                // Never registered: the hello failed.
                tracing::warn!(reason = %why, "proxy connection closed");
            }
        }
    }
}

fn session(core: &Core, conn: &Arc<Conn>) -> Result<(), String> {
    hello(conn)?;
    tracing::info!("proxy connected; sending the snapshot");
    core.release_gone_netns();
    let (items, mut seen) = core.register_and_snapshot(conn);
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
            .map_err(|e| format!("snapshot {what} of pod {uid}: {e}"))?;
        if let Err(reason) = answer {
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
        .map_err(|e| format!("SnapshotSent: {e}"))?;
    if let Err(reason) = answer {
        tracing::warn!(%reason, "proxy nacked SnapshotSent");
    }
    tracing::info!(adds, keeps, "snapshot sent");
    catch_up(core, conn, &mut seen, &mut told)?;
    tracing::info!("proxy ready");
    idle(core, conn)
}

fn hello(conn: &Conn) -> Result<(), String> {
    let p = zds::recv(conn.sock.as_fd(), &zds::refuse_fd)
        .map_err(|e| format!("hello: {}", conn_err(e)))?;
    if p.fd_count > 0 {
        return Err("hello: it carried a file descriptor".into());
    }
    zds::decode_hello(&p.bytes).map_err(|e| format!("hello: {e}"))
}

/// Sends what changed while the snapshot was on the wire, until nothing did;
/// the connection becomes ready in the same critical section that sees no
/// change.
fn catch_up(
    core: &Core,
    conn: &Conn,
    seen: &mut u64,
    told: &mut BTreeMap<String, Option<u64>>,
) -> Result<(), String> {
    for _ in 0..MAX_CATCH_UP_ROUNDS {
        if core.is_stopping() {
            return Ok(());
        }
        let Some((adds, dels)) = core.catch_up(conn, seen, told) else {
            return Ok(());
        };
        for SnapItem { pod, netns, inode } in adds {
            let answer = conn
                .exchange(&add_request(&pod), netns.as_ref().map(|f| f.as_fd()))
                .map_err(|e| format!("catch-up Add of pod {}: {e}", pod.uid))?;
            if let Err(reason) = answer {
                tracing::warn!(pod.uid = %pod.uid, %reason, "proxy nacked a catch-up Add");
            }
            told.insert(pod.uid, inode);
        }
        for uid in dels {
            let answer = conn
                .exchange(&del_request(&uid), None)
                .map_err(|e| format!("catch-up Del of pod {uid}: {e}"))?;
            if let Err(reason) = answer {
                tracing::warn!(pod.uid = %uid, %reason, "proxy nacked a catch-up Del");
            }
            told.remove(&uid);
        }
    }
    Err(format!(
        "pods kept changing through {MAX_CATCH_UP_ROUNDS} catch-up rounds"
    ))
}

/// Watches an idle connection for a hang-up or an unsolicited packet.
///
/// Polls for POLLIN; the kernel adds POLLHUP/POLLERR by itself when the proxy
/// closes. (nix's `PollFlags` cannot carry POLLRDHUP; a half-close shows as
/// POLLIN with a zero-length read, which is treated the same.)
fn idle(core: &Core, conn: &Conn) -> Result<(), String> {
    let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    // `None`: bits nix does not know were set; look closer as for POLLIN.
    let events = |timeout: PollTimeout| -> Result<Option<PollFlags>, String> {
        let mut fds = [PollFd::new(conn.sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => Ok(Some(PollFlags::empty())),
            Ok(_) => Ok(fds[0].revents()),
            Err(nix::errno::Errno::EINTR) => Ok(Some(PollFlags::empty())),
            Err(e) => Err(format!("polling the connection: {e}")),
        }
    };
    loop {
        if core.is_stopping() {
            return Ok(());
        }
        if conn.is_dead() {
            return Ok(());
        }
        let ev = events(PollTimeout::from(TICK_MS))?;
        if ev.is_some_and(|e| e.intersects(gone)) {
            return Err("the proxy hung up".into());
        }
        if ev.is_some_and(|e| e.is_empty()) {
            continue;
        }
        // Maybe the ack of an exchange in flight: look again once it is done.
        let _io = lock(&conn.io);
        let ev = events(PollTimeout::ZERO)?;
        if ev.is_some_and(|e| e.intersects(gone)) {
            return Err("the proxy hung up".into());
        }
        if ev.is_some_and(|e| e.is_empty()) {
            continue;
        }
        return match zds::recv(conn.sock.as_fd(), &zds::refuse_fd) {
            Err(ZdsError::Closed) => Err("the proxy hung up".into()),
            Err(e) => Err(format!("unsolicited packet: {e}")),
            Ok(p) => Err(format!(
                "protocol violation: unsolicited packet of {} bytes",
                p.bytes.len()
            )),
        };
    }
}
