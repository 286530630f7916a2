//! The proxy as a client of a certificate service (`ca.address`): HBONE with
//! workload certificates from CSRs. A leaf: `ringway proxy` and the sandbox
//! both turn it on.

use anyhow::Context;
use ringway_proxy::Proxy;

/// HBONE on with a certificate service: what keeps it going.
pub(crate) struct CaServiceHbone {
    /// Renews the certificates.
    pub refresher: ringway_identity::Refresher,
    /// The service client's TLS (replaced when the roots rotate).
    pub tls: ringway_grpc::ClientTls,
    /// The roots' files: the mesh root, then the extra roots.
    pub root_files: Vec<std::path::PathBuf>,
}

/// HBONE with certificates from a certificate service (`ca.address`): keys
/// made here, one CSR per identity, renewed at half-life by the refresher
/// (every second, so a failed issuance is retried with its backoff soon).
pub(crate) fn enable_hbone_with_ca_service(
    proxy: &Proxy,
    svc: &ringway_config::CaService,
    trust_domain: &str,
) -> anyhow::Result<CaServiceHbone> {
    use std::sync::Arc;
    let mut files = vec![svc.root_cert_file.clone()];
    files.extend(svc.bundle_files.iter().cloned());
    let bundle = ringway_identity::TrustBundle::from_pem_files(&files)
        .context("loading the mesh root for the certificate service")?;
    let name = rustls_pki_types::ServerName::try_from(svc.server_name.clone())
        .with_context(|| format!("ca.serverName {:?}", svc.server_name))?;
    let tls = ringway_grpc::ClientTls::new(
        ringway_ca::CaClient::tls_config(bundle.roots())
            .map_err(|e| anyhow::anyhow!("the certificate service's TLS: {e}"))?,
    );
    let source = ringway_ca::client::RemoteSource::new(
        // Resolved at each request (the configuration checked `host:port`):
        // a Service re-created at another address, or DNS not answering
        // at start, is not a restart's worth.
        ringway_ca::CaClient::resolving(svc.address.clone(), name, tls.clone()),
        &svc.token_file,
    )
    .context("starting the certificate service client")?;
    let ids = Arc::new(ringway_identity::IdentityManager::with_source(
        Arc::new(source),
        bundle,
        trust_domain,
        ringway_identity::DEFAULT_CERT_LIFETIME,
    )?);
    let refresher = ids
        .spawn_refresher(std::time::Duration::from_secs(1))
        .context("starting the certificate refresher")?;
    proxy.set_identity(Some(ids));
    tracing::info!(ca.address = %svc.address, ca.server_name = %svc.server_name, "HBONE on: workload certificates from the certificate service");
    Ok(CaServiceHbone {
        refresher,
        tls,
        root_files: files,
    })
}
