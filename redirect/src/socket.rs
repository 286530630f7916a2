//! A netlink socket: requests with their acknowledgements, dumps, and
//! nfnetlink batches, in the network namespace of the thread that opens it;
//! and the background closer that keeps nf_tables' slow close off the
//! caller's path.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    bind, recv, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr,
    SockFlag, SockProtocol, SockType,
};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::abi::*;
use crate::error::RedirectError;
use crate::nl::{nfgenmsg, parse_msgs, Attrs, Msg, RxMsg};

/// Failure of one netlink exchange: the kernel said no, or the exchange broke.
#[derive(Debug)]
pub(crate) enum NlError {
    /// The kernel answered with this errno.
    Kernel(Errno),
    /// Sending, receiving or parsing failed.
    Other(RedirectError),
}

impl NlError {
    /// Names the failed operation; ENOENT/EOPNOTSUPP/EAFNOSUPPORT become
    /// [`RedirectError::MissingKernelFeature`] when `feature_errnos` is set.
    pub(crate) fn context(self, what: impl Into<String>, feature_errnos: bool) -> RedirectError {
        match self {
            NlError::Kernel(errno) => kernel_error(what.into(), errno, feature_errnos),
            NlError::Other(e) => e,
        }
    }
}

pub(crate) fn kernel_error(what: String, errno: Errno, feature_errnos: bool) -> RedirectError {
    if feature_errnos
        && matches!(
            errno,
            Errno::ENOENT | Errno::EOPNOTSUPP | Errno::EAFNOSUPPORT | Errno::EPROTONOSUPPORT
        )
    {
        RedirectError::MissingKernelFeature { what, errno }
    } else {
        RedirectError::Netlink { what, errno }
    }
}

/// The outcome of an nfnetlink batch: per-message errors, by index into the
/// messages that were sent.
#[derive(Debug, Default)]
pub(crate) struct BatchOutcome {
    /// (message index, errno) of every message the kernel refused.
    pub(crate) refused: Vec<(usize, Errno)>,
    /// An error reported against the batch as a whole (e.g. the commit failed).
    pub(crate) batch_error: Option<Errno>,
    /// Messages the kernel never acknowledged.
    pub(crate) unacked: Vec<usize>,
}

impl BatchOutcome {
    pub(crate) fn ok(&self) -> bool {
        self.refused.is_empty() && self.batch_error.is_none() && self.unacked.is_empty()
    }
}

const RECV_BUF: usize = 64 * 1024;
const REPLY_TIMEOUT_SECS: i64 = 5;
const DUMP_ATTEMPTS: usize = 5;

/// Closes `sock` on a background thread. Closing a NETLINK_NETFILTER socket
/// that ran a transaction makes nf_tables flush its destroy work, which
/// waits for an RCU grace period (about 15 ms measured): a pod's CNI ADD must
/// not wait for that. Falls back to closing here if the thread cannot start.
pub(crate) fn close_later(sock: NlSocket) {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;
    use std::sync::OnceLock;
    static REAPER: OnceLock<Option<mpsc::Sender<NlSocket>>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<NlSocket>();
        std::thread::Builder::new()
            .name("ringway-nl-close".into())
            .spawn(move || {
                for sock in rx {
                    drop(sock);
                    PENDING_CLOSES.fetch_sub(1, Ordering::SeqCst);
                }
            })
            .ok()
            .map(|_| tx)
    });
    match reaper {
        Some(tx) => {
            PENDING_CLOSES.fetch_add(1, Ordering::SeqCst);
            if let Err(back) = tx.send(sock) {
                drop(back.0);
                PENDING_CLOSES.fetch_sub(1, Ordering::SeqCst);
            }
        }
        None => drop(sock),
    }
}

/// Sockets handed to [`close_later`] and not closed yet.
static PENDING_CLOSES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Waits (at most `timeout`) until every socket handed to the background
/// closer is closed; returns whether they all are. For callers that count
/// their process's descriptors.
pub fn wait_closed(timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while PENDING_CLOSES.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

/// A netlink socket of one protocol, created in (and bound to) the network
/// namespace of the thread that opened it.
#[derive(Debug)]
pub(crate) struct NlSocket {
    fd: OwnedFd,
    seq: u32,
    name: &'static str,
}

impl NlSocket {
    pub(crate) fn open(proto: SockProtocol, name: &'static str) -> Result<NlSocket, RedirectError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            proto,
        )
        .map_err(|e| match e {
            Errno::EPROTONOSUPPORT | Errno::EAFNOSUPPORT => RedirectError::MissingKernelFeature {
                what: format!("opening a {name} netlink socket"),
                errno: e,
            },
            e => RedirectError::sys(format!("opening a {name} netlink socket"), e),
        })?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
            .map_err(|e| RedirectError::sys(format!("binding the {name} netlink socket"), e))?;
        setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &TimeVal::seconds(REPLY_TIMEOUT_SECS),
        )
        .map_err(|e| RedirectError::sys(format!("setting SO_RCVTIMEO on the {name} socket"), e))?;
        // Room for every ack of a batch (each echoes its request); best effort.
        let _ = setsockopt(&fd, sockopt::RcvBuf, &(1 << 20));
        // Sequence numbers only need to be distinct within this socket.
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1)
            .wrapping_mul(1000);
        Ok(NlSocket { fd, seq, name })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send_buf(&self, buf: &[u8]) -> Result<(), NlError> {
        let n = sendto(
            self.fd.as_raw_fd(),
            buf,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map_err(|e| {
            NlError::Other(RedirectError::sys(
                format!("sending to the {} netlink socket", self.name),
                e,
            ))
        })?;
        if n != buf.len() {
            return Err(NlError::Other(RedirectError::Protocol {
                what: format!("sending to the {} netlink socket", self.name),
                detail: format!("short send: {n} of {} bytes", buf.len()),
            }));
        }
        Ok(())
    }

    /// Receives one datagram; `Ok(None)` when nothing arrived (at once with
    /// `dontwait`, else within the reply timeout).
    fn recv_msgs(&self, dontwait: bool) -> Result<Option<Vec<RxMsg>>, NlError> {
        let mut buf = vec![0u8; RECV_BUF];
        let mut flags = MsgFlags::MSG_TRUNC;
        if dontwait {
            flags |= MsgFlags::MSG_DONTWAIT;
        }
        let n = loop {
            match recv(self.fd.as_raw_fd(), &mut buf, flags) {
                Ok(n) => break n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Ok(None),
                Err(e) => {
                    return Err(NlError::Other(RedirectError::sys(
                        format!("receiving from the {} netlink socket", self.name),
                        e,
                    )))
                }
            }
        };
        if n > buf.len() {
            return Err(NlError::Other(RedirectError::Protocol {
                what: format!("receiving from the {} netlink socket", self.name),
                detail: format!("datagram of {n} bytes truncated to {}", buf.len()),
            }));
        }
        parse_msgs(&buf[..n]).map(Some).map_err(|e| {
            NlError::Other(RedirectError::Protocol {
                what: format!("parsing a reply on the {} socket", self.name),
                detail: e.to_string(),
            })
        })
    }

    /// Blocking receive that turns a timeout into an error.
    fn recv_wait(&self) -> Result<Vec<RxMsg>, NlError> {
        self.recv_msgs(false)?.ok_or_else(|| {
            NlError::Other(RedirectError::Protocol {
                what: format!("waiting for the kernel on the {} socket", self.name),
                detail: format!("no reply within {REPLY_TIMEOUT_SECS}s"),
            })
        })
    }

    /// Sends one request with `NLM_F_ACK` and waits for its acknowledgement.
    pub(crate) fn request(&mut self, msg: &Msg) -> Result<(), NlError> {
        let seq = self.next_seq();
        let mut m = msg.clone();
        m.flags |= NLM_F_ACK;
        let mut buf = Vec::new();
        m.encode_into(&mut buf, seq);
        self.send_buf(&buf)?;
        loop {
            for r in self.recv_wait()? {
                if r.seq != seq {
                    continue;
                }
                match r.error_code() {
                    Some(0) => return Ok(()),
                    Some(e) => return Err(NlError::Kernel(Errno::from_raw(e))),
                    None => {}
                }
            }
        }
    }

    /// Sends a `GET` request and returns the single reply.
    pub(crate) fn get(&mut self, msg: &Msg) -> Result<RxMsg, NlError> {
        let seq = self.next_seq();
        let mut buf = Vec::new();
        msg.encode_into(&mut buf, seq);
        self.send_buf(&buf)?;
        loop {
            for r in self.recv_wait()? {
                if r.seq != seq {
                    continue;
                }
                match r.error_code() {
                    Some(0) => {}
                    Some(e) => return Err(NlError::Kernel(Errno::from_raw(e))),
                    None => return Ok(r),
                }
            }
        }
    }

    /// Sends a dump request and collects every reply message; restarts the
    /// dump when the kernel flags it as interrupted by a concurrent change.
    pub(crate) fn dump(&mut self, msg: &Msg) -> Result<Vec<RxMsg>, NlError> {
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.next_seq();
            let mut m = msg.clone();
            m.flags |= NLM_F_DUMP;
            let mut buf = Vec::new();
            m.encode_into(&mut buf, seq);
            self.send_buf(&buf)?;
            let mut out = Vec::new();
            let mut interrupted = false;
            'recv: loop {
                for r in self.recv_wait()? {
                    if r.seq != seq {
                        continue;
                    }
                    if r.flags & NLM_F_DUMP_INTR != 0 {
                        interrupted = true;
                    }
                    match r.ty {
                        NLMSG_DONE => {
                            let e = r
                                .payload
                                .get(..4)
                                .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                                .unwrap_or(0);
                            if e < 0 {
                                return Err(NlError::Kernel(Errno::from_raw(-e)));
                            }
                            break 'recv;
                        }
                        NLMSG_ERROR => match r.error_code() {
                            Some(0) | None => {}
                            Some(e) => return Err(NlError::Kernel(Errno::from_raw(e))),
                        },
                        _ => {
                            out.push(r);
                        }
                    }
                }
            }
            if !interrupted {
                return Ok(out);
            }
            tracing::debug!(socket = self.name, "netlink dump interrupted; restarting");
        }
        Err(NlError::Other(RedirectError::Protocol {
            what: format!("dumping over the {} socket", self.name),
            detail: format!("dump interrupted {DUMP_ATTEMPTS} times by concurrent changes"),
        }))
    }

    /// Sends `msgs` as one nfnetlink batch (`NFNL_MSG_BATCH_BEGIN` ..
    /// `NFNL_MSG_BATCH_END`) with `NLM_F_ACK` on every message, so the kernel
    /// answers each one and applies all of them or none.
    pub(crate) fn batch(&mut self, msgs: &[Msg]) -> Result<BatchOutcome, NlError> {
        let hdr = nfgenmsg(AF_UNSPEC, NFNL_SUBSYS_NFTABLES);
        let empty = Attrs::new();
        let begin_seq = self.next_seq();
        let mut buf = Vec::new();
        Msg::new(NFNL_MSG_BATCH_BEGIN, 0, &hdr, &empty).encode_into(&mut buf, begin_seq);
        let mut seqs = Vec::with_capacity(msgs.len());
        for m in msgs {
            let seq = self.next_seq();
            let mut m = m.clone();
            m.flags |= NLM_F_ACK;
            m.encode_into(&mut buf, seq);
            seqs.push(seq);
        }
        let end_seq = self.next_seq();
        Msg::new(NFNL_MSG_BATCH_END, 0, &hdr, &empty).encode_into(&mut buf, end_seq);
        self.send_buf(&buf)?;

        // The kernel handles the whole batch inside sendmsg(), so every
        // answer is queued by now: drain them, then wait (bounded) only if
        // some are still missing and nothing has failed.
        let mut acked = vec![false; msgs.len()];
        let mut out = BatchOutcome::default();
        let process = |rx: Vec<RxMsg>, out: &mut BatchOutcome, acked: &mut [bool]| {
            for r in rx {
                let Some(code) = r.error_code() else { continue };
                if r.seq == begin_seq || r.seq == end_seq {
                    if code != 0 {
                        out.batch_error = Some(Errno::from_raw(code));
                    }
                } else if let Some(i) = seqs.iter().position(|s| *s == r.seq) {
                    acked[i] = true;
                    if code != 0 {
                        out.refused.push((i, Errno::from_raw(code)));
                    }
                }
            }
        };
        while let Some(rx) = self.recv_msgs(true)? {
            process(rx, &mut out, &mut acked);
        }
        while !acked.iter().all(|a| *a) && out.batch_error.is_none() && out.refused.is_empty() {
            match self.recv_msgs(false)? {
                Some(rx) => process(rx, &mut out, &mut acked),
                None => break,
            }
        }
        out.unacked = acked
            .iter()
            .enumerate()
            .filter(|(_, a)| !**a)
            .map(|(i, _)| i)
            .collect();
        Ok(out)
    }
}
