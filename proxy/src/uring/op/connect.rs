//! `IORING_OP_CONNECT` on a socket made elsewhere (marked, bound, created
//! inside a pod's network namespace), which tokio-uring's own connect cannot do.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{cqueue, opcode, types};
use socket2::SockAddr;
use tokio_uring::{OneshotOutputTransform, UnsubmittedOneshot};

/// The fd and the address the kernel reads; boxed so the pointer is stable.
pub struct ConnectData {
    _fd: Arc<OwnedFd>,
    _addr: Box<SockAddr>,
}

/// Maps the completion to `Ok(())` or the connect error.
pub struct ConnectTransform;

impl OneshotOutputTransform for ConnectTransform {
    type Output = io::Result<()>;
    type StoredData = ConnectData;

    fn transform_oneshot_output(self, _data: ConnectData, cqe: cqueue::Entry) -> io::Result<()> {
        let res = cqe.result();
        if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(())
        }
    }
}

/// Connects `fd` to `addr` through the ring.
pub async fn connect(fd: &Arc<OwnedFd>, addr: SockAddr) -> io::Result<()> {
    let addr = Box::new(addr);
    // The SockAddr lives in a Box owned by the op's stable data, which
    // tokio-uring keeps alive until the CQE arrives, so the pointer stays valid.
    let sqe = opcode::Connect::new(types::Fd(fd.as_raw_fd()), addr.as_ptr(), addr.len()).build();
    // Queued until the runtime parks: a busy-polling worker must park.
    crate::busy::note_ring_op();
    UnsubmittedOneshot::new(
        ConnectData {
            _fd: fd.clone(),
            _addr: addr,
        },
        ConnectTransform,
        sqe,
    )
    .submit()
    .await
}
