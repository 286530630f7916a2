//! Errors of `ringway-redirect`. Every message names what was being done and
//! on which object, so a log line alone says what went wrong.

use std::path::PathBuf;

use nix::errno::Errno;

use crate::drift::Drift;
use crate::tag::TagError;

/// Why programming, verifying or removing a pod's capture failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedirectError {
    /// The fd (or path) does not refer to a network namespace.
    #[error("{what} is not a network namespace (it is {found})")]
    NotANetns {
        /// The fd or path that was checked.
        what: String,
        /// What it refers to instead (e.g. a file path or `mnt:[4026531841]`).
        found: String,
    },
    /// The fd refers to the host's (PID 1's) or the caller's own network
    /// namespace; capture rules must never land there.
    #[error("refusing {what}: it is {which} (net:[{inode}]), not a pod's network namespace")]
    HostNetns {
        /// The fd or path that was checked.
        what: String,
        /// Which namespace it matched: PID 1's or the calling thread's.
        which: &'static str,
        /// The namespace inode.
        inode: u64,
    },
    /// The namespace path does not exist.
    #[error("network namespace {} not found", path.display())]
    NetnsNotFound {
        /// The path that was opened.
        path: PathBuf,
    },
    /// The kernel lacks something the rule set needs (an nf_tables expression
    /// or chain type, a netlink family, an address family).
    #[error("{what}: the kernel lacks a needed feature ({errno}: {})", errno.desc())]
    MissingKernelFeature {
        /// The operation, naming the object (e.g. `adding rule 10 of chain prerouting (...)`).
        what: String,
        /// The error the kernel returned.
        errno: Errno,
    },
    /// The kernel refused a netlink request.
    #[error("{what}: {errno}: {}", errno.desc())]
    Netlink {
        /// The operation, naming the object (which message, rule, route).
        what: String,
        /// The error the kernel returned.
        errno: Errno,
    },
    /// The kernel's netlink reply could not be understood, or did not arrive.
    #[error("{what}: {detail}")]
    Protocol {
        /// The request whose reply was bad.
        what: String,
        /// What was wrong with it.
        detail: String,
    },
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// The operation and its object.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The owner tag cannot be stored (too long for the kernel's user data).
    #[error("owner tag refused: {0}")]
    TagTooLong(String),
    /// The owner tag stored in the table cannot be read back.
    #[error(transparent)]
    Tag(#[from] TagError),
    /// The [`CaptureSpec`](crate::CaptureSpec) is inconsistent.
    #[error("invalid capture spec: {0}")]
    InvalidSpec(String),
    /// Apply finished but the result does not match the spec (something
    /// foreign conflicts with it).
    #[error("capture rules not in place after apply: {}", join_drift(.drift))]
    NotInPlace {
        /// What verify found.
        drift: Vec<Drift>,
    },
    /// Apply failed, and undoing its partial work failed too. The pod may
    /// hold ip rules/routes of ours but never a partial nft rule set.
    #[error("{error}; rolling back also failed: {rollback}")]
    RollbackFailed {
        /// Why apply failed.
        error: Box<RedirectError>,
        /// Why the rollback failed.
        rollback: Box<RedirectError>,
    },
}

fn join_drift(d: &[Drift]) -> String {
    d.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

impl RedirectError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        RedirectError::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn sys(what: impl Into<String>, errno: Errno) -> Self {
        RedirectError::Io {
            what: what.into(),
            source: std::io::Error::from(errno),
        }
    }

    /// The kernel errno, when the kernel refused a request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            RedirectError::Netlink { errno, .. }
            | RedirectError::MissingKernelFeature { errno, .. } => Some(*errno),
            RedirectError::RollbackFailed { error, .. } => error.errno(),
            _ => None,
        }
    }
}
