//! The io_uring layer: the operations ringway adds to tokio-uring through its
//! public `UnsubmittedOneshot` op API, one file per opcode.
//!
//! tokio-uring 0.5 cannot connect a socket it did not create, cannot wait for
//! readiness, and has no accept that hands back a plain fd. These ops fill the
//! gap. Each op keeps everything the kernel may touch (the fd, the socket
//! address buffers) inside the op's `stable_data`, which tokio-uring holds
//! until the completion arrives, even if the future is dropped; that is what
//! makes the raw pointers in the SQEs sound.
//!
//! Cancellation rule of this crate: an in-flight op is never dropped to
//! "cancel" it. Readiness polls consume no data, and connections are ended by
//! resetting or shutting down their sockets, which completes every pending op.

#![allow(unsafe_code)]

pub mod op;

/// Whether this process may use io_uring (it can be disabled by the
/// `kernel.io_uring_disabled` sysctl or a seccomp profile).
pub fn probe() -> Result<(), std::io::Error> {
    io_uring::IoUring::new(8).map(|_| ())
}
