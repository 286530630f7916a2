//! Errors of the node agent, a leaf. Each says which side failed: the
//! caller's input, the pod's namespace, the kernel (rules), or the node
//! proxy; and why the agent is not healthy.

use std::path::PathBuf;

use ringway_redirect::RedirectError;

/// Why a pod was not enrolled (or not unenrolled cleanly).
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// No proxy is connected with its snapshot delivered (retryable).
    #[error("no node proxy is ready to take the pod{}", last_error.as_ref().map(|e| format!(" (last proxy failure: {e})")).unwrap_or_default())]
    NoProxy {
        /// Why the last proxy tried was dropped, if one was tried.
        last_error: Option<String>,
    },
    /// The proxy answered the `Add` with an error (retryable: the proxy
    /// retries the pod on its own, the runtime retries the ADD).
    #[error("node proxy refused pod {uid}: {reason}")]
    Nacked {
        /// Pod UID.
        uid: String,
        /// The proxy's error text.
        reason: String,
    },
    /// Another enroll/unenroll of the same pod is still running (retryable).
    #[error("pod {uid} is busy: another enroll or unenroll of it did not finish within {secs}s")]
    Busy {
        /// Pod UID.
        uid: String,
        /// How long this call waited.
        secs: u64,
    },
    /// The agent is shutting down (retryable: the next agent serves it).
    #[error("node agent is shutting down")]
    ShuttingDown,
    /// The pod description is unusable (missing field, excluded namespace).
    #[error("{0}")]
    BadInput(String),
    /// The namespace is not a pod's network namespace (the host's, the
    /// agent's own, not a network namespace, missing).
    #[error(transparent)]
    BadNetns(RedirectError),
    /// A local system call failed (e.g. duplicating the netns fd).
    #[error("{what}: {source}")]
    Io {
        /// The operation.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Programming or removing the pod's capture rules failed.
    #[error("capture rules of pod {uid}: {source}")]
    Rules {
        /// Pod UID.
        uid: String,
        /// What the kernel said.
        #[source]
        source: RedirectError,
    },
}

impl EnrollError {
    /// Whether trying again later may succeed (the CNI plugin then answers
    /// code 11, "try again later").
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            EnrollError::NoProxy { .. }
                | EnrollError::Nacked { .. }
                | EnrollError::Busy { .. }
                | EnrollError::ShuttingDown
        )
    }
}

/// Why the agent did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The capture spec is inconsistent.
    #[error("capture settings: {0}")]
    Capture(#[source] RedirectError),
    /// A socket could not be set up.
    #[error("{what} {}: {source}", path.display())]
    Socket {
        /// Which step (`binding the ZDS socket`, ...).
        what: &'static str,
        /// The socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Something is already serving on the socket path.
    #[error("{} is in use: another agent answers on it", path.display())]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path holds something that is not a socket.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A thread could not be started.
    #[error("spawning thread {name}: {source}")]
    Thread {
        /// The thread's name.
        name: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Why CHECK failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum CheckError {
    /// The sandbox is not enrolled.
    #[error("not enrolled")]
    Unknown,
    /// No proxy ready.
    #[error("no node proxy is ready")]
    NotReady,
    /// Enrolled, but not as it should be.
    #[error("{0}")]
    Failed(String),
}

/// Why the agent is not live or not ready (its `/healthz/live` and
/// `/healthz/ready`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// The agent is stopping.
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// A socket file the CNI plugin or the proxies connect to was removed.
    #[error("{what} {} is gone", path.display())]
    SocketGone {
        /// `ZDS socket` or `CNI event socket`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
    },
    /// No proxy has the snapshot yet: pods to capture cannot be added.
    #[error(
        "no proxy has taken the snapshot ({connected} connected): pods to capture cannot be added"
    )]
    NoProxy {
        /// Proxies connected (none ready).
        connected: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errors_are_the_proxy_side_ones() {
        assert!(EnrollError::NoProxy { last_error: None }.is_retryable());
        assert!(EnrollError::Nacked {
            uid: "u".into(),
            reason: "r".into()
        }
        .is_retryable());
        assert!(!EnrollError::BadInput("x".into()).is_retryable());
        assert_eq!(
            EnrollError::NoProxy {
                last_error: Some("proxy connection 3: the proxy closed the connection".into())
            }
            .to_string(),
            "no node proxy is ready to take the pod (last proxy failure: proxy connection 3: the proxy closed the connection)"
        );
    }
}
