//! Why a tunnel's TLS handshake failed, as the `outcome` label of
//! `ringway_tls_handshakes_total` names it: from the error's type (a
//! [`HandshakeTimeout`], the rustls error tokio-rustls wraps, the I/O error
//! kind), never from the message text.

/// A TLS handshake that did not finish within its deadline. Carried inside
/// the `io::Error` (kind `TimedOut`) that the handshake returns, so
/// [`tls_failure_reason`] tells it from every other failure by type.
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake timed out after {0:?}")]
pub struct HandshakeTimeout(pub std::time::Duration);

impl HandshakeTimeout {
    /// The `io::Error` a timed-out handshake returns.
    pub fn io(after: std::time::Duration) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, HandshakeTimeout(after))
    }
}

/// A short, bounded reason for a failed TLS handshake (the `outcome` label
/// of `ringway_tls_handshakes_total`), from the error's type: a
/// [`HandshakeTimeout`], the `rustls::Error` tokio-rustls wraps in the
/// `io::Error` (ours, or the alert the peer sent), else the I/O error kind.
/// Never from the message text.
pub fn tls_failure_reason(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    if let Some(inner) = e.get_ref() {
        if inner.is::<HandshakeTimeout>() {
            return "timeout";
        }
        if let Some(tls) = inner.downcast_ref::<tokio_rustls::rustls::Error>() {
            return rustls_reason(tls);
        }
    }
    match e.kind() {
        ErrorKind::UnexpectedEof => "peer_closed",
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            "peer_reset"
        }
        _ => "io",
    }
}

fn rustls_reason(e: &tokio_rustls::rustls::Error) -> &'static str {
    use tokio_rustls::rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => "unknown_ca",
            C::Expired | C::ExpiredContext { .. } => "expired",
            C::NotValidYet | C::NotValidYetContext { .. } => "not_yet_valid",
            C::NotValidForName | C::NotValidForNameContext { .. } => "wrong_identity",
            // Our verifiers' SPIFFE checks (`ringway_identity`): a chain
            // that verified but names another, or no, SPIFFE identity.
            C::Other(o) if o.0.is::<ringway_identity::IdentityError>() => "wrong_identity",
            _ => "bad_certificate",
        },
        E::NoCertificatesPresented => "no_client_cert",
        E::AlertReceived(a) => match a {
            A::UnknownCA => "unknown_ca",
            A::CertificateExpired => "expired",
            A::CertificateRequired => "no_client_cert",
            A::BadCertificate | A::UnsupportedCertificate | A::CertificateUnknown => {
                "bad_certificate"
            }
            A::ProtocolVersion => "protocol_version",
            A::NoApplicationProtocol => "no_alpn",
            _ => "alert",
        },
        E::PeerIncompatible(p) => {
            use tokio_rustls::rustls::PeerIncompatible as P;
            match p {
                P::ServerDoesNotSupportTls12Or13
                | P::ServerTlsVersionIsDisabledByOurConfig
                | P::SupportedVersionsExtensionRequired
                | P::Tls12NotOffered
                | P::Tls12NotOfferedOrEnabled => "protocol_version",
                _ => "incompatible",
            }
        }
        E::NoApplicationProtocol => "no_alpn",
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. }
        | E::PeerMisbehaved(_)
        | E::PeerSentOversizedRecord
        | E::DecryptError => "protocol_error",
        _ => "other",
    }
}
