//! The tunnel datapath's errors, by the side that failed.

use std::io;

/// Errors of the tunnel datapath, by the side that failed.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The tunnel's pod has no identity to serve with.
    #[error("this pod has no workload identity (not in the mesh, and the agent sent none)")]
    NoLocalIdentity,
    /// HBONE is off (no identity manager or no mesh).
    #[error("HBONE is not configured")]
    Disabled,
    /// A certificate or TLS config could not be made.
    #[error("identity: {0}")]
    Identity(#[from] ringway_identity::IdentityError),
    /// The tunnel (dial, TLS, HTTP/2, the peer's answer) failed.
    #[error("tunnel: {0}")]
    Hbone(#[from] ringway_hbone::HboneError),
    /// A socket operation failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The tunnel listener refused the connection before authentication.
    #[error("refused before authentication: {0}")]
    Refused(&'static str),
}
