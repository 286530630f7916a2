//! A workload certificate in hand: [`WorkloadCert`], its chain, in-memory
//! key and validity. A leaf: the manager makes them, the TLS configs and the
//! admin dump read them.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use ringway_config::authz::Identity;
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;

use crate::ca::fmt_time;

/// When `cert` expires (its `notAfter`); `None` when it does not parse.
pub fn cert_expiry(cert: &CertificateDer<'_>) -> Option<SystemTime> {
    x509_parser::parse_x509_certificate(cert)
        .ok()
        .map(|(_, x)| crate::ca::system_time(&x.validity().not_after))
}

/// A workload's certificate chain and in-memory key, ready for rustls.
pub struct WorkloadCert {
    identity: Identity,
    certified: Arc<CertifiedKey>,
    serial: String,
    not_before: SystemTime,
    not_after: SystemTime,
    refresh_at: SystemTime,
}

impl fmt::Debug for WorkloadCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadCert")
            .field("identity", &self.identity.to_string())
            .field("serial", &self.serial)
            .field("not_before", &fmt_time(self.not_before))
            .field("not_after", &fmt_time(self.not_after))
            .field("refresh_at", &fmt_time(self.refresh_at))
            .field("key", &"<redacted>")
            .finish()
    }
}

impl WorkloadCert {
    /// A certificate as issued: `refresh_at` is its half-life.
    pub(crate) fn new(
        identity: Identity,
        certified: Arc<CertifiedKey>,
        serial: String,
        not_before: SystemTime,
        not_after: SystemTime,
        refresh_at: SystemTime,
    ) -> Self {
        WorkloadCert {
            identity,
            certified,
            serial,
            not_before,
            not_after,
            refresh_at,
        }
    }

    /// The identity in the certificate.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Leaf first, then the CA chain.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.certified.cert
    }

    /// Chain and signing key for rustls.
    pub fn certified_key(&self) -> &Arc<CertifiedKey> {
        &self.certified
    }

    /// The leaf's serial number (hex), for logs.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// Start of validity (backdated).
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    /// End of validity.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Half-life: from then on it is renewed.
    pub fn refresh_at(&self) -> SystemTime {
        self.refresh_at
    }
}
