//! Upstream sockets made ahead in a pod's network namespace: a socket keeps
//! the netns it was made in, so the two `setns` calls that making one costs
//! are paid once per [`BATCH`] sockets instead of once per connection. The
//! spares are unbound and unconnected (no port, no traffic), of one
//! [`SpareKind`] each, and are closed with the pod.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use crate::sock::{self, PortSplit};
use crate::sys;

/// Sockets made per netns switch: one for the connection asking, the rest
/// kept (at most `BATCH - 1` per kind and pod; an idle pod that never
/// connects holds none).
pub const BATCH: usize = 4;

/// What a spare was made as: everything [`sock::new_upstream`] sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpareKind {
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// Transparent, in the spoofed half of the port range (else the
    /// proxy's own half).
    pub spoofed: bool,
    /// The proxy's SO_MARK.
    pub mark: u32,
}

/// A pod's spare upstream sockets.
#[derive(Debug, Default)]
pub struct Spares {
    kept: Mutex<Vec<(SpareKind, OwnedFd)>>,
}

impl Spares {
    /// An upstream socket of `kind` in `netns` (the pod's): a spare when one
    /// is kept, else [`BATCH`] made in one netns switch, the others kept.
    pub fn take(&self, netns: &OwnedFd, kind: SpareKind, ports: PortSplit) -> io::Result<OwnedFd> {
        if let Some(fd) = self.take_kept(kind) {
            return Ok(fd);
        }
        let mut made = sys::in_netns(netns.as_fd(), || {
            let mut made = Vec::with_capacity(BATCH);
            for _ in 0..BATCH {
                match sock::new_upstream(kind.v6, kind.mark, kind.spoofed, ports) {
                    Ok(fd) => made.push(fd),
                    // Out of fds (or memory) part way: what was made serves;
                    // none made is the connection's error.
                    Err(e) if made.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
            Ok(made)
        })??;
        let fd = made.pop().expect("at least one made");
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        // Workers making batches at once keep no more than one batch's
        // worth; the rest are closed.
        let room = (BATCH - 1).saturating_sub(kept.iter().filter(|(k, _)| *k == kind).count());
        kept.extend(made.into_iter().take(room).map(|f| (kind, f)));
        Ok(fd)
    }

    fn take_kept(&self, kind: SpareKind) -> Option<OwnedFd> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let i = kept.iter().rposition(|(k, _)| *k == kind)?;
        Some(kept.swap_remove(i).1)
    }

    /// How many spares are kept (all kinds).
    pub fn len(&self) -> usize {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
