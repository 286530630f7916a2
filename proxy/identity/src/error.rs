//! Errors of identity management and peer verification, of reading a
//! SPIFFE ID ([`SpiffeError`]) and of a certificate source
//! ([`IssueError`]). Low in the crate: they name only the CA module's
//! errors, and the SPIFFE, TLS, summary and manager modules name them.

use std::time::Duration;

use ringway_config::authz::Identity;

use crate::ca::CaError;

/// Why an identity could not be issued, configured or verified. Never
/// carries key material.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A string that is not a SPIFFE workload ID of our trust domain.
    #[error(transparent)]
    Spiffe(#[from] SpiffeError),
    /// An identity of another trust domain was asked for.
    #[error("{identity} is not in this proxy's trust domain {trust_domain:?}")]
    ForeignIdentity {
        /// The identity asked for.
        identity: Identity,
        /// Ours.
        trust_domain: String,
    },
    /// A CA or bundle file cannot be used.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// A root of the bundle is not a usable trust anchor.
    #[error("trust bundle: {source}")]
    TrustBundle {
        /// rustls' reason.
        source: Box<rustls::Error>,
    },
    /// The thread watching the trust bundle's files could not start.
    #[error(transparent)]
    Watch(#[from] ringway_config::ThreadFailed),
    /// A trust bundle without a single root: it would refuse every peer.
    #[error("trust bundle: no root certificate (every peer would be refused)")]
    EmptyTrustBundle,
    /// The trust domain given to the manager is not valid.
    #[error("trust domain {trust_domain:?}: {reason}")]
    BadTrustDomain {
        /// As given.
        trust_domain: String,
        /// What is wrong.
        reason: String,
    },
    /// A certificate lifetime too short to be rotated at half-life.
    #[error("certificate lifetime {0:?} is too short (at least 2 s)")]
    BadLifetime(Duration),
    /// The CA can no longer issue: it has expired.
    #[error(
        "cannot issue a certificate for {identity}: the CA certificate expired at {not_after}"
    )]
    CaExpired {
        /// The identity asked for.
        identity: Identity,
        /// The CA's notAfter.
        not_after: String,
    },
    /// No valid certificate is in hand and the caller may not wait for one
    /// (the datapath, with a certificate service): fail closed.
    #[error("no certificate for {identity} yet: {reason}")]
    NotIssued {
        /// The identity asked for.
        identity: Identity,
        /// Why the last issuance failed, or that none was tried yet.
        reason: String,
    },
    /// A certificate that cannot be read (DER that is not X.509).
    #[error("unreadable certificate: {reason}")]
    BadCertificate {
        /// The parser's reason.
        reason: String,
    },
    /// The certificate source (the local CA or a certificate service)
    /// failed.
    #[error("cannot issue a certificate for {identity}: {source}")]
    Source {
        /// The identity asked for.
        identity: Identity,
        /// What the source said.
        #[source]
        source: IssueError,
    },
    /// What the source returned cannot be used, or issuing could not start.
    #[error("cannot issue a certificate for {identity}: {reason}")]
    Issue {
        /// The identity asked for.
        identity: Identity,
        /// What failed.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration for {identity}: {source}")]
    Tls {
        /// The local identity of the config.
        identity: Identity,
        /// rustls' reason (boxed: it is large).
        source: Box<rustls::Error>,
    },
    /// The peer sent no certificate.
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    /// The peer's certificate has no usable SPIFFE ID.
    #[error("peer certificate: {0}")]
    PeerCertificate(String),
    /// The peer's SPIFFE ID is not the one expected.
    #[error("peer certificate is for {presented}, expected {expected}")]
    UnexpectedPeer {
        /// The identity the client expected.
        expected: Identity,
        /// The SPIFFE ID the server presented.
        presented: String,
    },
}

/// Why a certificate source (`CertSource::issue`) gave no certificate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// The local CA could not make the key or sign the certificate.
    #[error("the local CA cannot sign: {0}")]
    Sign(#[source] rcgen::Error),
    /// A source of another crate (the certificate service's client) failed:
    /// its own error, kept whole (its message and its sources).
    #[error(transparent)]
    Remote(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl IssueError {
    /// Wraps a remote source's error.
    pub fn remote(error: impl std::error::Error + Send + Sync + 'static) -> IssueError {
        IssueError::Remote(Box::new(error))
    }
}

/// A string that is not a workload identity of the expected trust domain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpiffeError {
    /// Not `spiffe://...`.
    #[error("{id:?} is not a SPIFFE ID: the scheme must be \"spiffe\", not {scheme:?}")]
    WrongScheme {
        /// The string as given.
        id: String,
        /// What stood before `://` (empty when there was no scheme).
        scheme: String,
    },
    /// A SPIFFE ID of another trust domain.
    #[error("{id:?} is in trust domain {found:?}, not {expected:?}")]
    WrongTrustDomain {
        /// The string as given.
        id: String,
        /// Its trust domain.
        found: String,
        /// Ours.
        expected: String,
    },
    /// The path is not `/ns/<namespace>/sa/<service account>`.
    #[error("{id:?} is not a workload identity: the path {path:?} is not /ns/<namespace>/sa/<service account>")]
    MissingParts {
        /// The string as given.
        id: String,
        /// The path after the trust domain.
        path: String,
    },
    /// A namespace, service account or trust domain that is not a valid name.
    #[error(transparent)]
    Invalid(#[from] ringway_config::authz::IdentityError),
}
