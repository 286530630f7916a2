//! The errors of the proxy's control operations ([`ProxyError`]).

use std::io;
use std::net::{IpAddr, SocketAddr};

use crate::sock::ListenerKind;

/// Errors of the proxy's control operations.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The settings are not usable.
    #[error("invalid settings: {0}")]
    Settings(#[from] ringway_config::ConfigError),
    /// The configuration's CA could not be loaded (HBONE).
    #[error("loading the mesh CA: {0}")]
    Ca(#[from] ringway_identity::IdentityError),
    /// A reloaded configuration names another trust domain than the one
    /// the workload certificates are issued in (a restart takes it).
    #[error("trustDomain {edited:?} is not the running {running:?}: the workload certificates are issued in the trust domain the proxy started with, so a new one takes effect only at a restart")]
    TrustDomainChanged {
        /// The trust domain in force.
        running: String,
        /// The one the edit names.
        edited: String,
    },
    /// The certificate refresher thread could not start.
    #[error("starting the certificate refresher: {0}")]
    Refresher(std::io::Error),
    /// io_uring was required but is not available.
    #[error("io_uring is required (datapath: uring) but unavailable: {0}")]
    UringUnavailable(#[source] io::Error),
    /// A worker thread could not be started.
    #[error("cannot start datapath worker {worker}: {source}")]
    Worker {
        /// Worker index.
        worker: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The thread of the tunnel listener's TLS handshakes could not start.
    #[error("cannot start the TLS handshake thread: {source}")]
    HandshakeThread {
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The fd handed in is not a network namespace.
    #[error("pod {uid}: fd is not a network namespace ({what})")]
    NotANetns {
        /// Pod UID.
        uid: String,
        /// What it is instead.
        what: String,
    },
    /// The host's own network namespace was passed where a pod's was expected.
    #[error("pod {uid}: refusing the host network namespace where a pod's is expected")]
    HostNetns {
        /// Pod UID.
        uid: String,
    },
    /// A listener could not be created inside the pod.
    #[error("pod {uid}: cannot create {kind} listener on {addr}: {source}")]
    Listen {
        /// Pod UID.
        uid: String,
        /// Which listener.
        kind: ListenerKind,
        /// Its address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Entering the pod's namespace failed.
    #[error("pod {uid}: cannot enter its network namespace: {source}")]
    EnterNetns {
        /// Pod UID.
        uid: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The datapath is shutting down.
    #[error("the datapath is stopped")]
    Stopped,
    /// The pod claims an address another served pod holds: refused, never
    /// resolved by letting the last one win.
    #[error("pod {uid}: address {addr} is already held by pod {holder}; refusing the pod")]
    AddressConflict {
        /// The pod refused.
        uid: String,
        /// The contested address.
        addr: IpAddr,
        /// The pod that holds it.
        holder: String,
    },
    /// The pod's network namespace is another served pod's: one namespace is
    /// one pod (two would split its inbound connections between two
    /// identities and two sets of policies).
    #[error("pod {uid}: its network namespace net:[{inode}] is pod {holder}'s; refusing the pod")]
    NetnsConflict {
        /// The pod refused.
        uid: String,
        /// The namespace's inode.
        inode: u64,
        /// The pod served in it.
        holder: String,
    },
}
