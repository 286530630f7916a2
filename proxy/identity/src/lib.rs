//! Workload identities and mutual TLS for HBONE.
//!
//! # Design
//!
//! There is no control-plane CA: the node proxy holds the mesh CA's
//! certificate and key, mounted from a Kubernetes Secret
//! ([`CaSigner::load`]), and issues each workload certificate itself, in
//! memory, on demand ([`IdentityManager::fetch`]). Every proxy holding a
//! root of the same [`TrustBundle`] trusts every other proxy's workload
//! certificates.
//!
//! - **Identities** are SPIFFE IDs, `spiffe://<td>/ns/<ns>/sa/<sa>`, in the
//!   certificate's only URI SAN. The type is [`ringway_config::authz::Identity`]
//!   (re-exported here), the same value that authorization evaluates, so
//!   a verified peer goes straight into `authz::evaluate`. [`parse_spiffe`]
//!   parses one and checks its trust domain.
//! - **Workload certificates** ([`WorkloadCert`]): a fresh ECDSA P-256 key
//!   per certificate, generated in memory and never written anywhere; the
//!   leaf is signed by the CA, `notBefore` backdated (5 minutes by default)
//!   against clock skew between nodes, a short lifetime (24 hours by
//!   default, capped at the CA's own expiry), EKU server + client auth.
//! - **Rotation at half-life**: the manager caches one certificate per
//!   identity. A `fetch` past the half-life renews it (one renewal per
//!   identity at a time; callers that find a renewal in progress get the
//!   still-valid old certificate instead of waiting), and a background
//!   thread ([`IdentityManager::spawn_refresher`]) renews ahead of time so
//!   the datapath normally never issues. At most
//!   [`DEFAULT_MAX_CONCURRENT_ISSUANCE`] issuances run at once.
//!   Established TLS sessions are unaffected by rotation; new handshakes
//!   use the new certificate.
//! - **rustls configs** ([`IdentityManager::server_config`],
//!   [`IdentityManager::client_config`]): TLS 1.3 only, AES-GCM suites,
//!   ALPN `h2`, no session resumption or tickets, no SNI, client
//!   certificate required. The server accepts a client whose chain reaches
//!   any root of the bundle and whose SPIFFE ID is in our trust domain
//!   ([`SpiffeClientVerifier`]); the client accepts a server whose chain
//!   reaches the bundle and whose SPIFFE ID is *exactly* the identity
//!   expected for the destination ([`SpiffeServerVerifier`]; DNS names are
//!   ignored, so the server name given to rustls is a placeholder,
//!   [`placeholder_server_name`]). After the handshake [`peer_identity`]
//!   reads the verified peer's identity. Configs are cached per identity
//!   (pair) and rebuilt when the certificate they hold is rotated.
//! - **Secrets stay secret**: `Debug` of every type holding a key redacts
//!   it, errors never carry key bytes, logs name CA files but never their
//!   content.
//! - **Crypto**: rustls 0.23 with the *ring* provider only (no aws-lc-sys,
//!   no cmake), rcgen (ring) to issue, x509-parser to read certificates;
//!   chains are verified by rustls' webpki.
//!
//! # Layers
//! Each module names only modules below it (checked by the workspace's
//! module-graph test, `tests/tests/it/crate_graph.rs`): `ca` and `clock`
//! (leaves), `cert` (a certificate in hand) and `error`, then `spiffe`, then
//! `tls` and `summary`, and `manager` on top.
//!
//! # Example
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ringway_identity::{CaSigner, Identity, IdentityManager, TrustBundle};
//!
//! # let dir = std::env::temp_dir().join(format!("ringway-identity-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
//! # CaSigner::generate_for_tests("cluster.local").write_pem_files(&cert_file, &key_file)?;
//! let ca = CaSigner::load(&cert_file, &key_file)?;
//! let bundle = TrustBundle::from_pem_files::<&std::path::Path>(&[])?;
//! let ids = IdentityManager::new(ca, bundle, "cluster.local", Duration::from_secs(24 * 3600))?;
//!
//! let web = Identity::new("cluster.local", "shop", "web");
//! let front = Identity::new("cluster.local", "front", "frontend");
//! let cert = ids.fetch(&web)?;
//! assert_eq!(cert.identity(), &web);
//! let _server = ids.server_config(&web)?;          // inbound HBONE to a `web` pod
//! let _client = ids.client_config(&front, &web)?;  // `front` pod dialing a `web` pod
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod ca;
mod cert;
mod clock;
mod error;
mod manager;
mod roots;
mod spiffe;
mod summary;
mod tls;

#[cfg(feature = "testing")]
pub mod testing;

pub use ca::{CaError, CaProblem, CaSigner, CsrError, TrustBundle};
pub use cert::{cert_expiry, WorkloadCert};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{IdentityError, IssueError, SpiffeError};
pub use manager::{
    CertSource, IdentityManager, Issued, Refresher, TrustChange, DEFAULT_BACKDATE,
    DEFAULT_CERT_LIFETIME, DEFAULT_MAX_CONCURRENT_ISSUANCE,
};
pub use ringway_config::authz::Identity;
pub use roots::BundleFiles;
pub use spiffe::{parse_spiffe, peer_identity, peer_identity_from_certs, spiffe_id_of};
pub use summary::{base64, describe_certificate, rfc3339, CertState, CertSummary};
pub use tls::{
    crypto_provider, placeholder_server_name, SpiffeClientVerifier, SpiffeServerVerifier, ALPN_H2,
    PLACEHOLDER_SERVER_NAME,
};

#[cfg(feature = "testing")]
pub use ca::TestLeaf;
