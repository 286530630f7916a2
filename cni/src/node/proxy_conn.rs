//! One proxy connection, a leaf of the ZDS side: [`Conn`] and its
//! request/ack exchanges with 5 s deadlines, the requests the agent sends,
//! and what a snapshot sends for one pod ([`SnapItem`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use socket2::Socket;

use super::config::ACK_TIMEOUT;
use super::locks::lock;
use super::pod::Pod;
use ringway_zds::{self as zds, workload_request::Payload, Answer, WorkloadRequest, ZdsError};

/// What a snapshot (or its catch-up) sends for one pod.
#[derive(Debug)]
pub(super) struct SnapItem {
    pub(super) pod: Pod,
    /// `Some` = Add with this fd, `None` = Keep.
    pub(super) netns: Option<OwnedFd>,
    pub(super) inode: Option<u64>,
}

/// One proxy connection.
#[derive(Debug)]
pub(super) struct Conn {
    /// Connection number (higher is newer).
    pub(super) id: u64,
    /// The proxy's PID, from SO_PEERCRED.
    pub(super) pid: Option<i32>,
    pub(super) sock: Socket,
    /// One request/response exchange at a time.
    pub(super) io: Mutex<()>,
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

pub(super) fn conn_err(e: ZdsError) -> ConnError {
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
    /// A new connection (not ready) on `sock`.
    pub(super) fn new(id: u64, pid: Option<i32>, sock: Socket) -> Conn {
        Conn {
            id,
            pid,
            sock,
            io: Mutex::new(()),
            dead: AtomicBool::new(false),
            ready: AtomicBool::new(false),
        }
    }

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

    /// Sends one request (with `fd` as SCM_RIGHTS) and waits for the
    /// proxy's [`Answer`]. Any `Err` kills the connection (a late ack would
    /// be read as the answer to the next request).
    pub(super) fn exchange(
        &self,
        req: &WorkloadRequest,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Answer, ConnError> {
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
    ) -> Result<Answer, ConnError> {
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

/// `Add` of `pod` (its netns fd goes beside it).
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

/// `Del` of pod `uid`.
pub(super) fn del_request(uid: &str) -> WorkloadRequest {
    zds::request(Payload::Del(zds::DelWorkload {
        uid: uid.to_string(),
    }))
}

/// `Keep` of pod `uid` (known, its namespace gone).
pub(super) fn keep_request(uid: &str) -> WorkloadRequest {
    zds::request(Payload::Keep(zds::KeepWorkload {
        uid: uid.to_string(),
    }))
}

/// The end of the snapshot.
pub(super) fn snapshot_sent() -> WorkloadRequest {
    zds::request(Payload::SnapshotSent(zds::SnapshotSent {}))
}
