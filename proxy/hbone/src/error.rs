//! Errors of the tunnel client and server, each saying which side failed.

use std::io;

/// Why opening or using an HBONE tunnel failed.
#[derive(Debug, thiserror::Error)]
pub enum HboneError {
    /// Dialing the peer proxy (TCP + TLS, done by the caller's `dial`) failed.
    #[error("dialing the peer proxy failed: {0}")]
    Dial(#[source] io::Error),
    /// The HTTP/2 handshake with the peer proxy failed.
    #[error("HTTP/2 handshake with the peer proxy failed: {0}")]
    Handshake(#[source] h2::Error),
    /// The HTTP/2 connection to the peer proxy failed while opening the stream.
    #[error("HTTP/2 connection to the peer proxy failed: {0}")]
    Connection(#[source] h2::Error),
    /// The peer refused the stream (GOAWAY or REFUSED_STREAM) on every connection tried.
    #[error("the peer proxy refused the stream: {0}")]
    Refused(#[source] h2::Error),
    /// The peer answered 400: it judged the CONNECT request malformed.
    #[error("peer rejected the tunnel request as malformed (400 Bad Request)")]
    BadRequest,
    /// The peer answered 401: its authorization policy denied this source.
    #[error("peer denied the tunnel by policy (401 Unauthorized)")]
    Denied,
    /// The peer answered 503: it has no upstream or could not connect to it.
    #[error("peer has no reachable upstream (503 Service Unavailable)")]
    Unavailable,
    /// The peer answered another status than 200/400/401/503.
    #[error("peer answered the tunnel request with unexpected status {0}")]
    UnexpectedStatus(http::StatusCode),
    /// The request headers could not be encoded (invalid baggage or trace parent).
    #[error("invalid tunnel request header {name}: {reason}")]
    InvalidHeader {
        /// Header name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The serving side's connection failed (I/O, protocol error or PING timeout).
    #[error("HTTP/2 server connection failed: {0}")]
    Server(#[source] h2::Error),
    /// The peer reset more streams before their answer than allowed: a
    /// graceful GOAWAY was sent, and the connection closed once its other
    /// streams were done.
    #[error("peer reset more than {0} streams before their answer (rapid reset): GOAWAY")]
    RapidReset(u32),
    /// The peer's certificate was no longer valid when it opened a
    /// stream ([`PeerRevoked`]): that stream was refused unprocessed (the
    /// client retries it on a new connection, with a new handshake), a
    /// graceful GOAWAY sent, and the connection closed once its other
    /// streams were done.
    #[error("the peer may open no more streams here: {0}; GOAWAY")]
    UntrustedPeer(PeerRevoked),
    /// The client's HTTP/2 preface did not arrive in time.
    #[error("no HTTP/2 preface from the peer within {0:?}")]
    PrefaceTimeout(std::time::Duration),
    /// The connection had no stream for the idle timeout: GOAWAY sent.
    #[error("no stream for {0:?}: idle connection closed")]
    Idle(std::time::Duration),
    /// No PING answer within the configured timeout: the connection was closed.
    #[error("peer did not answer HTTP/2 PING within {0:?}")]
    PingTimeout(std::time::Duration),
}

impl HboneError {
    /// The HTTP status this error corresponds to, when the peer answered one.
    pub fn status(&self) -> Option<http::StatusCode> {
        match self {
            HboneError::BadRequest => Some(http::StatusCode::BAD_REQUEST),
            HboneError::Denied => Some(http::StatusCode::UNAUTHORIZED),
            HboneError::Unavailable => Some(http::StatusCode::SERVICE_UNAVAILABLE),
            HboneError::UnexpectedStatus(s) => Some(*s),
            _ => None,
        }
    }

    pub(crate) fn from_status(status: http::StatusCode) -> Self {
        match status.as_u16() {
            400 => HboneError::BadRequest,
            401 => HboneError::Denied,
            503 => HboneError::Unavailable,
            _ => HboneError::UnexpectedStatus(status),
        }
    }
}

/// Maps an h2 stream error to the `io::Error` a tunnel reader/writer reports.
/// A peer RST_STREAM (any reason) is a TCP reset: `ConnectionReset`.
pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 I/O error"));
    }
    if e.is_reset() || e.is_go_away() {
        return io::Error::new(io::ErrorKind::ConnectionReset, e);
    }
    io::Error::other(e)
}

/// Why a peer authenticated at its handshake may open no more streams on
/// that connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerRevoked {
    /// Its certificate has expired since the handshake.
    #[error("its certificate has expired")]
    Expired,
    /// Its certificate no longer verifies against the trusted roots (a
    /// root removed since the handshake).
    #[error("its certificate no longer verifies: {0}")]
    Untrusted(String),
}
