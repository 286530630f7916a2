//! The mesh CA (certificate + key from files) and the trust bundle.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
use ringway_config::authz::Identity;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use zeroize::{Zeroize, Zeroizing};

/// A CA or trust-bundle file that cannot be used: the file and the problem.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", file.display())]
pub struct CaError {
    /// The file at fault.
    pub file: PathBuf,
    /// What is wrong with it.
    pub problem: CaProblem,
}

/// What is wrong with a CA or bundle file. Never contains key bytes.
#[derive(Debug, thiserror::Error)]
pub enum CaProblem {
    /// The file cannot be read (missing, permissions).
    #[error("cannot read it: {0}")]
    Read(#[source] io::Error),
    /// The file is larger than the configuration's limit
    /// ([`ringway_config::MAX_FILE_BYTES`]), or a device that does not end.
    #[error("larger than the limit of {limit} bytes ({} MiB); refusing to read it", limit >> 20)]
    TooLarge {
        /// The limit, bytes.
        limit: u64,
    },
    /// No PEM block of the expected kind.
    #[error("no PEM {0} block found (is it a PEM file?)")]
    NotPem(&'static str),
    /// A malformed PEM block.
    #[error("malformed PEM: {0}")]
    BadPem(&'static str),
    /// The certificate does not parse.
    #[error("not a valid X.509 certificate: {0}")]
    BadCertificate(String),
    /// The certificate is not a CA.
    #[error("the certificate ({subject}) is not a CA: basicConstraints cA is not true")]
    NotCa {
        /// Subject of the certificate.
        subject: String,
    },
    /// The CA's key usage does not allow signing certificates.
    #[error("the certificate ({subject}) may not sign certificates: keyUsage lacks keyCertSign")]
    NoCertSign {
        /// Subject of the certificate.
        subject: String,
    },
    /// The CA certificate has expired.
    #[error("the CA certificate ({subject}) expired at {not_after}")]
    Expired {
        /// Subject of the certificate.
        subject: String,
        /// Its notAfter.
        not_after: String,
    },
    /// The CA certificate is not valid yet.
    #[error("the CA certificate ({subject}) is not valid before {not_before}")]
    NotYetValid {
        /// Subject of the certificate.
        subject: String,
        /// Its notBefore.
        not_before: String,
    },
    /// A key encoding ring cannot load.
    #[error("unsupported private key encoding {0}; use PKCS#8 (`openssl pkcs8 -topk8 -nocrypt`)")]
    UnsupportedKey(&'static str),
    /// The key does not load (corrupt, unsupported algorithm).
    #[error("not a usable private key: {0}")]
    BadKey(String),
    /// The key is not the certificate's.
    #[error("the private key does not match the certificate in {}", cert_file.display())]
    KeyMismatch {
        /// The certificate file.
        cert_file: PathBuf,
    },
}

/// Reads a CA or bundle file, at most the configuration's file limit.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, CaError> {
    use std::io::Read;
    let limit = ringway_config::MAX_FILE_BYTES;
    let err = |problem| CaError {
        file: path.to_owned(),
        problem,
    };
    let file = std::fs::File::open(path).map_err(|e| err(CaProblem::Read(e)))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err(CaProblem::Read(e)))?;
    if bytes.len() as u64 > limit {
        bytes.zeroize();
        return Err(err(CaProblem::TooLarge { limit }));
    }
    Ok(bytes)
}

fn pem_problem(e: &rustls_pki_types::pem::Error) -> &'static str {
    use rustls_pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { .. } => "a section has no END line",
        E::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        E::Base64Decode(_) => "bad base64",
        _ => "unreadable PEM",
    }
}

/// All `CERTIFICATE` blocks of a PEM file (at least one).
fn certs_from_pem(file: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, CaError> {
    let err = |problem| CaError {
        file: file.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(CaProblem::BadPem(pem_problem(&e))))?;
    if certs.is_empty() {
        return Err(err(CaProblem::NotPem("CERTIFICATE")));
    }
    Ok(certs)
}

pub(crate) fn system_time(t: &x509_parser::time::ASN1Time) -> SystemTime {
    let secs = t.timestamp();
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH
    }
}

/// RFC 3339-ish UTC rendering of a time, for messages.
pub(crate) fn fmt_time(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{secs} s after the epoch"),
    }
}

pub(crate) fn offset_date_time(t: SystemTime) -> time::OffsetDateTime {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// The mesh CA: its certificate (and any chain above it from the same
/// file) and its signing key. Issues workload certificates.
pub struct CaSigner {
    issuer: rcgen::Issuer<'static, KeyPair>,
    /// The CA certificate first, then the rest of its file.
    chain: Vec<CertificateDer<'static>>,
    subject: String,
    not_before: SystemTime,
    not_after: SystemTime,
    origin: String,
}

impl fmt::Debug for CaSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaSigner")
            .field("subject", &self.subject)
            .field("origin", &self.origin)
            .field("not_before", &fmt_time(self.not_before))
            .field("not_after", &fmt_time(self.not_after))
            .field("key", &"<redacted>")
            .finish()
    }
}

impl CaSigner {
    /// Loads the CA from a PEM certificate file (the CA certificate first;
    /// any further certificates are sent after it in workload chains) and a
    /// PEM key file (PKCS#8 `PRIVATE KEY`, SEC1 `EC PRIVATE KEY` or PKCS#1
    /// `RSA PRIVATE KEY`), as mounted from a Kubernetes Secret. Checks that
    /// the certificate is a CA allowed to sign certificates, valid now, and
    /// that the key is its key. Errors name the file at fault.
    pub fn load(cert_file: impl AsRef<Path>, key_file: impl AsRef<Path>) -> Result<Self, CaError> {
        let (cert_file, key_file) = (cert_file.as_ref(), key_file.as_ref());
        let cert_pem = read(cert_file)?;
        // Wiped from memory when dropped, on every path.
        let key_pem = Zeroizing::new(read(key_file)?);
        let chain = certs_from_pem(cert_file, &cert_pem)?;
        let key = key_from_pem(key_file, &key_pem)?;
        let ca = Self::from_parts(
            chain,
            key,
            cert_file,
            key_file,
            SystemTime::now(),
            format!("{}", cert_file.display()),
        )?;
        tracing::info!(
            ca.cert_file = %cert_file.display(),
            ca.key_file = %key_file.display(),
            ca.subject = %ca.subject,
            ca.not_after = %fmt_time(ca.not_after),
            "loaded mesh CA"
        );
        Ok(ca)
    }

    fn from_parts(
        chain: Vec<CertificateDer<'static>>,
        key: KeyPair,
        cert_file: &Path,
        key_file: &Path,
        now: SystemTime,
        origin: String,
    ) -> Result<Self, CaError> {
        let cert_err = |problem| CaError {
            file: cert_file.to_owned(),
            problem,
        };
        let (_, x509) = x509_parser::parse_x509_certificate(&chain[0])
            .map_err(|e| cert_err(CaProblem::BadCertificate(e.to_string())))?;
        let subject = x509.subject().to_string();
        let is_ca = x509
            .basic_constraints()
            .map_err(|e| cert_err(CaProblem::BadCertificate(e.to_string())))?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(cert_err(CaProblem::NotCa { subject }));
        }
        let ku = x509
            .key_usage()
            .map_err(|e| cert_err(CaProblem::BadCertificate(e.to_string())))?;
        if ku.is_some_and(|ku| !ku.value.key_cert_sign()) {
            return Err(cert_err(CaProblem::NoCertSign { subject }));
        }
        let not_before = system_time(&x509.validity().not_before);
        let not_after = system_time(&x509.validity().not_after);
        if now > not_after {
            return Err(cert_err(CaProblem::Expired {
                subject,
                not_after: fmt_time(not_after),
            }));
        }
        if now < not_before {
            return Err(cert_err(CaProblem::NotYetValid {
                subject,
                not_before: fmt_time(not_before),
            }));
        }
        if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(CaError {
                file: key_file.to_owned(),
                problem: CaProblem::KeyMismatch {
                    cert_file: cert_file.to_owned(),
                },
            });
        }
        let issuer = rcgen::Issuer::from_ca_cert_der(&chain[0], key)
            .map_err(|e| cert_err(CaProblem::BadCertificate(e.to_string())))?;
        Ok(CaSigner {
            issuer,
            chain,
            subject,
            not_before,
            not_after,
            origin,
        })
    }

    /// The CA certificate (DER).
    pub fn cert(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }

    /// The CA certificate followed by the rest of its file.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The CA's subject, for logs.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The CA's notAfter: no workload certificate outlives it.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Issues a leaf for `identity`: a new P-256 key, the SPIFFE ID as its
    /// only URI SAN, no subject, EKU server + client auth. Returns the
    /// chain (leaf first) and the key.
    pub(crate) fn issue(
        &self,
        identity: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivatePkcs8KeyDer<'static>), rcgen::Error> {
        let uri = rcgen::string::Ia5String::try_from(identity.to_string())?;
        self.issue_with_sans(vec![SanType::URI(uri)], not_before, not_after)
    }

    /// Signs a certificate for `identity` over the public key of a PEM
    /// PKCS#10 request, whose signature is checked (it proves the caller holds
    /// the key). Nothing else of the request is used: the CA decides the
    /// certificate (the SPIFFE ID as the only URI SAN, no subject, not a CA,
    /// key usages and EKU server + client auth, `not_before`..`not_after`
    /// capped by the CA's own expiry). Returns the chain, leaf first.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        identity: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<Vec<CertificateDer<'static>>, CsrError> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| CsrError(e.to_string()))?;
        let uri = rcgen::string::Ia5String::try_from(identity.to_string())
            .map_err(|e| CsrError(format!("identity {identity} is not an IA5 string: {e}")))?;
        let params = leaf_params(
            vec![SanType::URI(uri)],
            not_before,
            not_after.min(self.not_after),
        );
        let leaf = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|e| CsrError(format!("signing: {e}")))?;
        let mut chain = Vec::with_capacity(1 + self.chain.len());
        chain.push(leaf.der().clone());
        chain.extend(self.chain.iter().cloned());
        Ok(chain)
    }

    /// When the CA certificate became valid (the newest of several roots
    /// signs).
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    fn issue_with_sans(
        &self,
        sans: Vec<SanType>,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivatePkcs8KeyDer<'static>), rcgen::Error> {
        let mut key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let params = leaf_params(sans, not_before, not_after.min(self.not_after));
        let leaf = params.signed_by(&key, &self.issuer)?;
        let mut chain = Vec::with_capacity(1 + self.chain.len());
        chain.push(leaf.der().clone());
        chain.extend(self.chain.iter().cloned());
        let der = PrivatePkcs8KeyDer::from(key.serialize_der());
        key.zeroize();
        Ok((chain, der))
    }
}

/// A certificate signing request that cannot be signed: not PEM, not a
/// PKCS#10 request, a signature that does not verify, or an unsupported key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("certificate signing request refused: {0}")]
pub struct CsrError(pub String);

/// The workload leaf's fields: the SANs given, no subject (rcgen then marks
/// the SAN critical), not a CA, digitalSignature + keyEncipherment, EKU
/// server + client auth.
fn leaf_params(
    sans: Vec<SanType>,
    not_before: SystemTime,
    not_after: SystemTime,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = sans;
    params.not_before = offset_date_time(not_before);
    params.not_after = offset_date_time(not_after);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params
}

fn key_from_pem(file: &Path, bytes: &[u8]) -> Result<KeyPair, CaError> {
    let err = |problem| CaError {
        file: file.to_owned(),
        problem,
    };
    let key = PrivateKeyDer::from_pem_slice(bytes)
        .map(Zeroizing::new)
        .map_err(|e| match e {
            rustls_pki_types::pem::Error::NoItemsFound => err(CaProblem::NotPem("PRIVATE KEY")),
            e => err(CaProblem::BadPem(pem_problem(&e))),
        })?;
    match &*key {
        PrivateKeyDer::Pkcs8(k) => KeyPair::try_from(k).map_err(|e| {
            // rcgen/ring errors name the failure, never the key bytes.
            err(CaProblem::BadKey(format!(
                "{e} (supported: ECDSA P-256/P-384, Ed25519, RSA)"
            )))
        }),
        // ring loads PKCS#8 only: wrap the SEC1/PKCS#1 key (as cert-manager
        // writes by default) into a PKCS#8 document, wiped after use.
        PrivateKeyDer::Sec1(k) => [OID_P256, OID_P384]
            .iter()
            .find_map(|curve| {
                let pkcs8 =
                    Zeroizing::new(wrap_pkcs8(&[OID_EC_PUBLIC_KEY, curve], k.secret_sec1_der()));
                KeyPair::try_from(&PrivatePkcs8KeyDer::from(pkcs8.as_slice())).ok()
            })
            .ok_or_else(|| {
                err(CaProblem::BadKey(
                    "an EC PRIVATE KEY that is not P-256 or P-384, lacks its public key, or is corrupt".into(),
                ))
            }),
        PrivateKeyDer::Pkcs1(k) => {
            let pkcs8 = Zeroizing::new(wrap_pkcs8(
                &[OID_RSA_ENCRYPTION, NULL],
                k.secret_pkcs1_der(),
            ));
            KeyPair::try_from(&PrivatePkcs8KeyDer::from(pkcs8.as_slice()))
                .map_err(|e| err(CaProblem::BadKey(format!("RSA PRIVATE KEY: {e}"))))
        }
        _ => Err(err(CaProblem::UnsupportedKey("unknown"))),
    }
}

/// DER: `id-ecPublicKey`, `prime256v1`, `secp384r1`, `rsaEncryption`, NULL.
const OID_EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_RSA_ENCRYPTION: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
];
const NULL: &[u8] = &[0x05, 0x00];

/// A DER TLV with a definite length.
fn der(tag: u8, content: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
}

/// `PrivateKeyInfo { version 0, AlgorithmIdentifier { alg... }, OCTET STRING key }` (RFC 5208).
fn wrap_pkcs8(alg: &[&[u8]], key: &[u8]) -> Vec<u8> {
    // Sized up front: no reallocation leaves an unwiped copy of the key.
    let mut body = Zeroizing::new(Vec::with_capacity(key.len() + 64));
    body.extend_from_slice(&[0x02, 0x01, 0x00]);
    der(0x30, &alg.concat(), &mut body);
    der(0x04, key, &mut body);
    let mut out = Vec::with_capacity(body.len() + 4);
    der(0x30, &body, &mut out);
    out
}

/// The roots a peer's chain may end at: several during a CA rotation (the
/// old and the new root). The signing CA's own certificate is added by
/// [`crate::IdentityManager::new`].
#[derive(Clone, Default)]
pub struct TrustBundle {
    roots: Vec<CertificateDer<'static>>,
}

impl fmt::Debug for TrustBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let subjects: Vec<String> = self
            .roots
            .iter()
            .map(|c| {
                x509_parser::parse_x509_certificate(c)
                    .map_or_else(|_| "?".into(), |(_, x)| x.subject().to_string())
            })
            .collect();
        f.debug_struct("TrustBundle")
            .field("roots", &subjects)
            .finish()
    }
}

impl TrustBundle {
    /// An empty bundle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every certificate of every file (PEM, one or more `CERTIFICATE`
    /// blocks each).
    pub fn from_pem_files<P: AsRef<Path>>(files: &[P]) -> Result<Self, CaError> {
        let mut bundle = TrustBundle::new();
        for f in files {
            bundle.add_pem_file(f.as_ref())?;
        }
        Ok(bundle)
    }

    /// Adds every certificate of a PEM file.
    pub fn add_pem_file(&mut self, file: impl AsRef<Path>) -> Result<(), CaError> {
        let file = file.as_ref();
        self.add_pem(file, &read(file)?)
    }

    /// Adds every certificate of `bytes`, the PEM content of `file`.
    pub(crate) fn add_pem(&mut self, file: &Path, bytes: &[u8]) -> Result<(), CaError> {
        let certs = certs_from_pem(file, bytes)?;
        for cert in certs {
            let mut store = RootCertStore::empty();
            store.add(cert.clone()).map_err(|e| CaError {
                file: file.to_owned(),
                problem: CaProblem::BadCertificate(e.to_string()),
            })?;
            self.add(cert);
        }
        Ok(())
    }

    /// Adds one root (ignored if already present).
    pub fn add(&mut self, cert: CertificateDer<'static>) {
        if !self.roots.contains(&cert) {
            self.roots.push(cert);
        }
    }

    /// The roots.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    pub(crate) fn root_store(&self) -> Result<RootCertStore, rustls::Error> {
        let mut store = RootCertStore::empty();
        for r in &self.roots {
            store.add(r.clone())?;
        }
        Ok(store)
    }
}

/// A leaf issued with arbitrary names and validity, for negative tests.
#[cfg(feature = "testing")]
pub struct TestLeaf {
    /// Leaf first, then the CA chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
}

#[cfg(feature = "testing")]
impl fmt::Debug for TestLeaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestLeaf")
            .field("chain_len", &self.chain.len())
            .field("key", &"<redacted>")
            .finish()
    }
}

#[cfg(feature = "testing")]
impl TestLeaf {
    /// Writes the chain and the key as PEM files (the key with mode 0600),
    /// as a Secret would mount a serving certificate.
    pub fn write_pem_files(&self, cert_file: &Path, key_file: &Path) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let certs: String = self
            .chain
            .iter()
            .map(|c| pem::encode(&pem::Pem::new("CERTIFICATE", c.to_vec())))
            .collect();
        std::fs::write(cert_file, certs)?;
        let label = match &self.key {
            PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
            PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
            _ => "PRIVATE KEY",
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(key_file)?;
        f.write_all(pem::encode(&pem::Pem::new(label, self.key.secret_der().to_vec())).as_bytes())
    }
}

#[cfg(test)]
impl CaSigner {
    pub(crate) fn generate_for_tests_for_unit(trust_domain: &str) -> CaSigner {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let cert = params.self_signed(&key).expect("self-signed CA");
        CaSigner {
            issuer: rcgen::Issuer::new(params, key),
            chain: vec![cert.der().clone()],
            subject: format!("unit test CA {trust_domain}"),
            not_before: UNIX_EPOCH,
            not_after: SystemTime::now() + Duration::from_secs(86400),
            origin: "unit test".into(),
        }
    }
}

#[cfg(feature = "testing")]
impl CaSigner {
    /// A new self-signed P-256 CA for `trust_domain`, valid from an hour ago
    /// for ten years. Tests and sandboxes only.
    pub fn generate_for_tests(trust_domain: &str) -> CaSigner {
        let now = SystemTime::now();
        Self::generate_for_tests_with_validity(
            trust_domain,
            now - Duration::from_secs(3600),
            now + Duration::from_secs(10 * 365 * 86400),
        )
    }

    /// [`Self::generate_for_tests`] with a chosen validity (an expired CA,
    /// for instance). The result is not checked.
    pub fn generate_for_tests_with_validity(
        trust_domain: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> CaSigner {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
        let mut params = CertificateParams::default();
        // A unique name per CA, as distinct real CAs have.
        let tag: String = key.public_key_raw()[1..5]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let cn = format!("ringway test CA {tag}");
        let mut dn = DistinguishedName::new();
        dn.push(rcgen::DnType::OrganizationName, trust_domain);
        dn.push(rcgen::DnType::CommonName, cn.as_str());
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = offset_date_time(not_before);
        params.not_after = offset_date_time(not_after);
        let cert = params.self_signed(&key).expect("self-signed CA");
        let subject = format!("CN={cn}, O={trust_domain}");
        CaSigner {
            issuer: rcgen::Issuer::new(params, key),
            chain: vec![cert.der().clone()],
            subject,
            not_before,
            not_after,
            origin: "generated for tests".into(),
        }
    }

    /// Writes the CA certificate and key as PEM files (the key with mode
    /// 0600), as a Secret would mount them.
    pub fn write_pem_files(&self, cert_file: &Path, key_file: &Path) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let certs: String = self
            .chain
            .iter()
            .map(|c| pem::encode(&pem::Pem::new("CERTIFICATE", c.to_vec())))
            .collect();
        std::fs::write(cert_file, certs)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(key_file)?;
        f.write_all(self.issuer.key().serialize_pem().as_bytes())
    }

    /// The CA certificate as PEM.
    pub fn cert_pem(&self) -> String {
        pem::encode(&pem::Pem::new("CERTIFICATE", self.chain[0].to_vec()))
    }

    /// A leaf for `identity` with any validity (an expired one, say).
    pub fn issue_for_tests(
        &self,
        identity: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> TestLeaf {
        let (chain, key) = self.issue(identity, not_before, not_after).expect("issue");
        TestLeaf {
            chain,
            key: key.into(),
        }
    }

    /// A leaf with arbitrary URI SANs (none, several, not SPIFFE), valid
    /// for a day.
    pub fn issue_with_uris_for_tests(&self, uris: &[&str]) -> TestLeaf {
        let now = SystemTime::now();
        let sans = uris
            .iter()
            .map(|u| SanType::URI(rcgen::string::Ia5String::try_from(*u).expect("ASCII URI")))
            .collect();
        let (chain, key) = self
            .issue_with_sans(
                sans,
                now - Duration::from_secs(60),
                now + Duration::from_secs(86400),
            )
            .expect("issue");
        TestLeaf {
            chain,
            key: key.into(),
        }
    }

    /// A server certificate for a DNS name (a certificate service's serving
    /// certificate, say), valid for a day.
    pub fn issue_dns_for_tests(&self, dns: &str) -> TestLeaf {
        let now = SystemTime::now();
        let name = rcgen::string::Ia5String::try_from(dns).expect("ASCII DNS name");
        let (chain, key) = self
            .issue_with_sans(
                vec![SanType::DnsName(name)],
                now - Duration::from_secs(60),
                now + Duration::from_secs(86400),
            )
            .expect("issue");
        TestLeaf {
            chain,
            key: key.into(),
        }
    }
}
