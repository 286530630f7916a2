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
    /// An HTTP endpoint answered with another status than 200.
    #[error("GET {path}: status {status}: {body}")]
    Status {
        /// The path asked for.
        path: String,
        /// The status code (0: not HTTP).
        status: u16,
        /// The answer's body.
        body: String,
    },
    /// A `/metrics` page that does not parse.
    #[error(transparent)]
    Metrics(#[from] crate::prom::ParseError),
    /// A capacity or lookup limit of the test bed.
    #[error("{0}")]
    Capacity(&'static str),
}
