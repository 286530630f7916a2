//! rustls configs and certificate verifiers for HBONE.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use ringway_config::authz::Identity;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, Resumption};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::sign::SingleCertAndKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError,
    ServerConfig, SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::cert::WorkloadCert;
use crate::clock::Clock;
use crate::error::{IdentityError, SpiffeError};
use crate::spiffe::{parse_spiffe, spiffe_id_of};

/// The only ALPN protocol of HBONE.
pub const ALPN_H2: &[u8] = b"h2";

/// The server name to give rustls when connecting: never sent (SNI is
/// off) and never checked (the SPIFFE ID is).
pub const PLACEHOLDER_SERVER_NAME: &str = "hbone.ringway.invalid";

/// [`PLACEHOLDER_SERVER_NAME`] as a rustls `ServerName`.
pub fn placeholder_server_name() -> ServerName<'static> {
    ServerName::try_from(PLACEHOLDER_SERVER_NAME).expect("valid DNS name")
}

/// rustls' ring provider restricted to the TLS 1.3 AES-GCM suites.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
    ];
    Arc::new(p)
}

fn unix_time(t: SystemTime) -> UnixTime {
    UnixTime::since_unix_epoch(t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default())
}

fn cert_error(e: IdentityError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

/// Server side: requires a client certificate that chains to a root of the
/// bundle (webpki, at the manager's clock) and whose SPIFFE ID is in our
/// trust domain. Authorization of the identity is the caller's job
/// ([`crate::peer_identity`] then `authz::evaluate`).
pub struct SpiffeClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for SpiffeClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiffeClientVerifier")
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

impl SpiffeClientVerifier {
    pub(crate) fn new(
        roots: Arc<rustls::RootCertStore>,
        trust_domain: &str,
        provider: Arc<CryptoProvider>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, rustls::Error> {
        let inner = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        Ok(SpiffeClientVerifier {
            inner,
            trust_domain: trust_domain.to_owned(),
            clock,
        })
    }

    pub(crate) fn with_clock(&self, clock: Arc<dyn Clock>) -> Self {
        SpiffeClientVerifier {
            inner: self.inner.clone(),
            trust_domain: self.trust_domain.clone(),
            clock,
        }
    }
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, unix_time(self.clock.now()))?;
        let id = spiffe_id_of(end_entity).map_err(cert_error)?;
        parse_spiffe(&id, &self.trust_domain).map_err(|e| cert_error(IdentityError::Spiffe(e)))?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Client side: the server's certificate must chain to a root of the
/// bundle (webpki, at the manager's clock) and carry exactly the expected
/// SPIFFE ID. DNS names and the server name given to rustls are ignored.
pub struct SpiffeServerVerifier {
    roots: Arc<rustls::RootCertStore>,
    expected: Identity,
    algs: WebPkiSupportedAlgorithms,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for SpiffeServerVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiffeServerVerifier")
            .field("expected", &self.expected.to_string())
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

impl SpiffeServerVerifier {
    pub(crate) fn new(
        roots: Arc<rustls::RootCertStore>,
        expected: Identity,
        provider: Arc<CryptoProvider>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        SpiffeServerVerifier {
            roots,
            expected,
            algs: provider.signature_verification_algorithms,
            clock,
        }
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            unix_time(self.clock.now()),
            self.algs.all,
        )?;
        let presented = spiffe_id_of(end_entity).map_err(cert_error)?;
        if presented != self.expected.to_string() {
            // Parse only to give the clearer error when it is not SPIFFE at all.
            if let Err(e @ (SpiffeError::WrongScheme { .. } | SpiffeError::MissingParts { .. })) =
                parse_spiffe(&presented, &self.expected.trust_domain)
            {
                return Err(cert_error(IdentityError::Spiffe(e)));
            }
            return Err(cert_error(IdentityError::UnexpectedPeer {
                expected: self.expected.clone(),
                presented,
            }));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

pub(crate) fn server_config(
    provider: &Arc<CryptoProvider>,
    verifier: Arc<SpiffeClientVerifier>,
    cert: &WorkloadCert,
) -> Result<ServerConfig, rustls::Error> {
    let mut cfg = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(
            cert.certified_key().clone(),
        )));
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    cfg.session_storage = Arc::new(NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    cfg.max_early_data_size = 0;
    Ok(cfg)
}

pub(crate) fn client_config(
    provider: &Arc<CryptoProvider>,
    verifier: Arc<SpiffeServerVerifier>,
    cert: &WorkloadCert,
) -> Result<ClientConfig, rustls::Error> {
    let mut cfg = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(
            cert.certified_key().clone(),
        )));
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    cfg.resumption = Resumption::disabled();
    cfg.enable_sni = false;
    cfg.enable_early_data = false;
    Ok(cfg)
}
