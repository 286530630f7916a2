//! A gRPC client's TLS config, replaceable while the client runs.

use std::sync::{Arc, PoisonError, RwLock};

/// The TLS config a client connects with: shared by every clone, replaced
/// as a whole ([`ClientTls::replace`]) when the roots it trusts change.
/// Each new connection takes the config in force; a connection already
/// open keeps the one it was made with.
#[derive(Clone)]
pub struct ClientTls(Arc<RwLock<Arc<rustls::ClientConfig>>>);

impl ClientTls {
    /// A holder of `config`.
    pub fn new(config: Arc<rustls::ClientConfig>) -> ClientTls {
        ClientTls(Arc::new(RwLock::new(config)))
    }

    /// The config in force.
    pub fn current(&self) -> Arc<rustls::ClientConfig> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `config` in force for the connections made from now on (by
    /// every clone).
    pub fn replace(&self, config: Arc<rustls::ClientConfig>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = config;
    }
}

impl From<Arc<rustls::ClientConfig>> for ClientTls {
    fn from(config: Arc<rustls::ClientConfig>) -> ClientTls {
        ClientTls::new(config)
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("alpn", &self.current().alpn_protocols.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(alpn: &[u8]) -> Arc<rustls::ClientConfig> {
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        c.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(c)
    }

    #[test]
    fn a_replaced_config_is_what_every_clone_connects_with_next() {
        let (a, b) = (config(b"h2"), config(b"x"));
        let tls = ClientTls::from(a.clone());
        let clone = tls.clone();
        assert!(Arc::ptr_eq(&clone.current(), &a));
        tls.replace(b.clone());
        assert!(Arc::ptr_eq(&clone.current(), &b));
        assert!(Arc::ptr_eq(&tls.current(), &b));
    }
}
