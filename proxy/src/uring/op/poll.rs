//! `IORING_OP_POLL_ADD`: wait until a socket is readable or writable.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{cqueue, opcode, types};
use tokio_uring::{OneshotOutputTransform, UnsubmittedOneshot};

/// What to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Data (or EOF, or an error) can be read.
    Readable,
    /// Buffer space (or an error) for writing.
    Writable,
}

/// Keeps the fd open until the kernel has completed the poll.
pub struct PollData {
    _fd: Arc<OwnedFd>,
}

/// Maps the completion to the returned event mask.
pub struct PollTransform;

impl OneshotOutputTransform for PollTransform {
    type Output = io::Result<u32>;
    type StoredData = PollData;

    fn transform_oneshot_output(self, _data: PollData, cqe: cqueue::Entry) -> io::Result<u32> {
        let res = cqe.result();
        if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as u32)
        }
    }
}

/// Waits until `fd` is ready for `interest`. Errors and hang-ups count as
/// ready: the caller's next syscall reports them.
pub async fn poll(fd: &Arc<OwnedFd>, interest: Interest) -> io::Result<u32> {
    let mask = match interest {
        Interest::Readable => libc::POLLIN | libc::POLLRDHUP,
        Interest::Writable => libc::POLLOUT,
    } as u32;
    let sqe = opcode::PollAdd::new(types::Fd(fd.as_raw_fd()), mask).build();
    // Queued until the runtime parks: a busy-polling worker must park.
    crate::busy::note_ring_op();
    UnsubmittedOneshot::new(PollData { _fd: fd.clone() }, PollTransform, sqe)
        .submit()
        .await
}
