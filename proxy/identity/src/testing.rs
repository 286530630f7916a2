//! TLS configs for tests that must step outside the manager's own configs
//! (feature `testing`; not for production builds): a client with any
//! certificate (or none) and any protocol versions, and a server presenting
//! any leaf, both with ALPN h2.

use std::sync::Arc;

use rustls::{ClientConfig, ServerConfig, SupportedProtocolVersion};

use crate::{Identity, IdentityManager, TestLeaf, ALPN_H2};

/// A client presenting `leaf` (or no certificate) that checks the server
/// with `mgr`'s verifier for `expected`, offering `versions` (all of ring's
/// suites, so a TLS 1.2-only client can be built).
pub fn raw_client_config(
    mgr: &IdentityManager,
    expected: &Identity,
    leaf: Option<TestLeaf>,
    versions: &[&'static SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let b = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(mgr.server_verifier(expected)));
    let mut cfg = match leaf {
        Some(l) => b
            .with_client_auth_cert(l.chain, l.key)
            .expect("client certificate"),
        None => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    Arc::new(cfg)
}

/// A TLS 1.3 server presenting `leaf`, asking for no client certificate.
pub fn raw_server_config(leaf: TestLeaf) -> Arc<ServerConfig> {
    let mut cfg = ServerConfig::builder_with_provider(crate::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(leaf.chain, leaf.key)
        .expect("server certificate");
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    Arc::new(cfg)
}
