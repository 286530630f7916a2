//! The test bed's error type. A leaf: the namespace and node modules return
//! it, and the crate root re-exports it.

/// Errors of the test bed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A syscall failed.
    #[error("{0}: {1}")]
    Sys(&'static str, #[source] nix::Error),
    /// An I/O operation failed.
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    /// A helper command (`ip`, `nft`) failed.
    #[error("command `{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A capacity or lookup limit of the test bed.
    #[error("{0}")]
    Capacity(&'static str),
}
