//! `IORING_OP_ACCEPT` returning the accepted socket as a plain `OwnedFd`
//! (non-blocking, close-on-exec) together with the peer address.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{cqueue, opcode, types};
use socket2::SockAddr;
use tokio_uring::{OneshotOutputTransform, UnsubmittedOneshot};

/// Kernel-written peer address storage; boxed so its address is stable.
pub struct AcceptData {
    _fd: Arc<OwnedFd>,
    storage: Box<(MaybeUninit<libc::sockaddr_storage>, libc::socklen_t)>,
}

/// Turns the completion into the new fd and the peer address.
pub struct AcceptTransform;

impl OneshotOutputTransform for AcceptTransform {
    type Output = io::Result<(OwnedFd, SockAddr)>;
    type StoredData = AcceptData;

    fn transform_oneshot_output(self, data: AcceptData, cqe: cqueue::Entry) -> Self::Output {
        let res = cqe.result();
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        // SAFETY: a non-negative accept result is a new file descriptor that
        // nothing else owns; we take ownership exactly once here.
        let fd = unsafe { OwnedFd::from_raw_fd(res) };
        let (storage, len) = *data.storage;
        // SAFETY: the kernel initialised `len` bytes of the storage with a
        // socket address of the listener's family (accept(2) contract).
        let addr = unsafe { SockAddr::new(storage.assume_init(), len) };
        Ok((fd, addr))
    }
}

/// Accepts one connection on the listening socket `fd`.
pub async fn accept(fd: &Arc<OwnedFd>) -> io::Result<(OwnedFd, SockAddr)> {
    let mut storage = Box::new((
        MaybeUninit::<libc::sockaddr_storage>::zeroed(),
        std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
    ));
    let addr_ptr = storage.0.as_mut_ptr().cast::<libc::sockaddr>();
    let len_ptr = std::ptr::addr_of_mut!(storage.1);
    // Both pointers point into the Box kept in the op's stable data until the
    // completion arrives (tokio-uring guarantees this even if the future is
    // dropped), so the kernel never writes to freed memory.
    let sqe = opcode::Accept::new(types::Fd(fd.as_raw_fd()), addr_ptr, len_ptr)
        .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        .build();
    // Queued until the runtime parks: a busy-polling worker must park.
    crate::busy::note_ring_op();
    UnsubmittedOneshot::new(
        AcceptData {
            _fd: fd.clone(),
            storage,
        },
        AcceptTransform,
        sqe,
    )
    .submit()
    .await
}
